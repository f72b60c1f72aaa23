"""Start Ray Serve with this server's request path settings, in this process.

Used by ``triton-serve serve`` and by the test suite. The settings of the
request path (DESIGN.md) are environment variables that Ray reads when it
starts, so :func:`configure_environment` runs before Ray is imported.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

from deployments.serve import hooks
from deployments.settings import ServerSettings

# Ray Serve direct ingress behind HAProxy: each model replica answers HTTP itself.
# HAProxy's metrics make it log every request to a Ray actor that parses the lines
# (a fifth of a core on a trivial model at 2,000 requests/s); Serve's replica
# metrics and this server's Triton metrics stay on. Ray starts its workers at nice 15,
# so on a shared node every other process (a load generator, an agent) took the
# CPU from the replicas answering requests; Triton runs at normal priority, so do they.
REQUEST_PATH_ENV = {
    "RAY_worker_niceness": "0",
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    "RAY_SERVE_HAPROXY_METRICS_ENABLED": "0",
    "RAY_SERVE_HAPROXY_NBTHREAD": str(max(1, min(4, os.cpu_count() or 1))),
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "1",
    # A model's replica answers its own routes without Serve's per-request wrapper, and
    # inference runs to completion when a client disconnects, as in Triton
    # (deployments/serve/ingress.py).
    hooks.PROXY_CALLBACK_ENV: "deployments.serve.ingress:middlewares",
}


def configure_environment(direct_ingress: bool = True) -> None:
    """Set the request-path variables (kept where the user already set them)."""
    if direct_ingress:
        for key, value in REQUEST_PATH_ENV.items():
            os.environ.setdefault(key, value)
    project = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH", "")
    if project not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = project + (os.pathsep + path if path else "")


def start(settings: ServerSettings, ray_init: dict[str, Any] | None = None) -> None:
    """Start Ray (if needed), Serve and the server application; wait until every model settled."""
    configure_environment()
    import ray
    from ray import serve

    from deployments.serve.app import bind_server
    from deployments.serve.names import SERVER_APP, SERVER_ROUTE

    if not ray.is_initialized():
        ray.init(**(ray_init or {}))
    serve.start(http_options={"host": settings.http_host, "port": settings.http_port})
    serve.run(bind_server(settings), name=SERVER_APP, route_prefix=SERVER_ROUTE)
    deadline = time.monotonic() + settings.deploy_timeout_s
    while not call_server("is_started"):
        if time.monotonic() > deadline:
            raise TimeoutError("the model repository did not finish loading")
        time.sleep(0.5)


_LOOP: asyncio.AbstractEventLoop | None = None


def _driver_loop() -> asyncio.AbstractEventLoop:
    """One long-lived event loop for handle calls from this (synchronous) driver.

    With the request path settings, handle routers run on the caller's event loop,
    so the driver keeps one loop alive in a daemon thread for them.
    """
    global _LOOP
    if _LOOP is None:
        _LOOP = asyncio.new_event_loop()
        threading.Thread(target=_LOOP.run_forever, name="serve-driver-loop", daemon=True).start()
    return _LOOP


def call_server(method: str, *args: Any, timeout_s: float = 60.0) -> Any:
    """Call a method of the server deployment from a plain (non-async) driver."""
    from ray import serve

    from deployments.serve.names import SERVER_APP, SERVER_DEPLOYMENT

    async def call() -> Any:
        handle = serve.get_deployment_handle(SERVER_DEPLOYMENT, app_name=SERVER_APP)
        return await getattr(handle, method).remote(*args)

    return asyncio.run_coroutine_threadsafe(call(), _driver_loop()).result(timeout_s)


def stop() -> None:
    import ray
    from ray import serve

    try:
        serve.shutdown()
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    """``python -m deployments.serve.launch env``: the request-path variables as ``K=V`` words (for ``make serve``)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if args != ["env"]:
        print("usage: python -m deployments.serve.launch env", file=sys.stderr)
        return 2
    print(" ".join(f"{k}={v}" for k, v in REQUEST_PATH_ENV.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
