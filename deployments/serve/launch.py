"""Start Ray Serve with this server's request path settings, in this process.

Used by ``triton-serve serve`` and by the test suite. The settings of the
request path (docs/operations.md) are environment variables that Ray reads when it
starts, so :func:`configure_environment` runs before Ray is imported.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from deployments.protocol.grpc import restricted_metadata_key
from deployments.serve.haproxy_shim import STREAM_GUARD_ENV, die_with_parent
from deployments.serve.request_path import REQUEST_PATH_ENV, request_path_env
from deployments.serve.server_api import ServerClient
from deployments.settings import (
    RestrictedApi,
    ServerSettings,
    SettingsError,
    parse_restricted,
    restriction_for,
)

T = TypeVar("T")


LOG_DEDUP_ENV = "RAY_DEDUP_LOGS"
"""Ray's driver folds log lines that differ only in their numbers (pids, times, counts) into one
"[repeated Nx across cluster]"; the server's log shows every line, as tritonserver's does (each
replica's "ready", the rate limiter's pool counts)."""


def configure_environment(direct_ingress: bool = True) -> None:
    """Set the request-path variables (kept where the user already set them), and Ray's log
    deduplication off for the process that prints the server's log (:data:`LOG_DEDUP_ENV`)."""
    if direct_ingress:
        for key, value in request_path_env().items():
            os.environ.setdefault(key, value)
    os.environ.setdefault(LOG_DEDUP_ENV, "0")
    project = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH", "")
    if project not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = project + (os.pathsep + path if path else "")


def guard_streams(restricted: tuple[RestrictedApi, ...]) -> None:
    """Tell the HAProxy that Serve starts (a Ray started from this process inherits the variable) which
    metadata a ``ModelStreamInfer`` stream must carry where gRPC inference is restricted
    (``deployments.serve.haproxy_shim.STREAM_GUARD_ENV``)."""
    guard = restriction_for(restricted, "inference")
    if guard is not None:
        os.environ[STREAM_GUARD_ENV] = f"{restricted_metadata_key(guard)}={guard.value}"
    else:
        os.environ.pop(STREAM_GUARD_ENV, None)


def restricted_in_config(path: Path) -> tuple[RestrictedApi, ...]:
    """The server application's ``grpc_restricted_api`` in Serve config file ``path`` (none where the
    file is not one or names no server application)."""
    try:
        config = yaml.safe_load(path.read_text())
        for app in config.get("applications") or ():
            if str(app.get("import_path", "")).startswith("deployments.serve.app:"):
                return parse_restricted((app.get("args") or {}).get("grpc_restricted_api"))
    except (OSError, AttributeError, TypeError, yaml.YAMLError, SettingsError):
        pass  # the server itself says what is wrong with its arguments
    return ()


def start(
    settings: ServerSettings,
    ray_init: dict[str, Any] | None = None,
    after_ray_init: Callable[[], None] | None = None,
) -> None:
    """Start Ray (if needed), Serve and the server application; wait until every model settled.
    ``after_ray_init`` runs once Ray is up (Ray's start puts its failure-signal handler on SIGTERM,
    which prints a stack trace: a caller sets its own handlers again there)."""
    configure_environment()
    guard_streams(settings.grpc_restricted_api)
    import ray
    from ray import serve

    from deployments.serve.app import bind_server
    from deployments.serve.names import SERVER_APP, SERVER_ROUTE

    if not ray.is_initialized():
        ray.init(**(ray_init or {}))
        if after_ray_init is not None:
            after_ray_init()
    from deployments.serve.grpc_ingress import serve_options

    serve.start(
        http_options={"host": settings.http_host, "port": settings.http_port},
        grpc_options=serve_options(settings),
    )
    serve.run(bind_server(settings), name=SERVER_APP, route_prefix=SERVER_ROUTE)
    deadline = time.monotonic() + settings.deploy_timeout_s
    while not call_server(lambda server: server.is_started()):
        if time.monotonic() > deadline:
            raise TimeoutError("the model repository did not finish loading")
        time.sleep(0.5)
    if settings.allow_grpc:
        from deployments.serve.grpc_ingress import wait_until_answering

        if not wait_until_answering(
            settings.http_host,
            settings.grpc_port,
            max(deadline - time.monotonic(), 10.0),
            settings.grpc_restricted_api,
        ):
            raise TimeoutError(f"the gRPC service did not answer on port {settings.grpc_port}")


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


def call_server(call: Callable[[ServerClient], Awaitable[T]], timeout_s: float = 60.0) -> T:
    """Call the server deployment from a plain (non-async) driver: ``call`` gets its typed client,
    e.g. ``call_server(lambda server: server.index())``."""

    async def run() -> T:
        return await call(ServerClient())

    return asyncio.run_coroutine_threadsafe(run(), _driver_loop()).result(timeout_s)


def stop() -> None:
    import ray
    from ray import serve

    try:
        serve.shutdown()
    finally:
        ray.shutdown()


USAGE = """usage:
  python -m deployments.serve.launch env                     the variables as K=V words
  python -m deployments.serve.launch run [SERVE RUN ARGS]    serve run with them (make serve)
  python -m deployments.serve.launch ray-start [ARGS]        ray start with them (clusters)"""


def main(argv: list[str] | None = None) -> int:
    """``env``: the request-path variables as ``K=V`` words; ``run`` / ``ray-start``: ``serve run`` /
    ``ray start`` with them in the environment (``make serve``, ``triton-serve ray-start``)."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["env"]:
        print(" ".join(f"{k}={v}" for k, v in request_path_env().items()))
        return 0
    if args and args[0] in ("run", "ray-start"):
        configure_environment()
        configs = [Path(a) for a in args[1:] if a.endswith((".yaml", ".yml"))]
        if args[0] == "run" and configs:
            guard_streams(restricted_in_config(configs[0]))
        if args[0] == "run":
            # `make` does not pass its SIGTERM on: `serve run` ends with whatever started it, and a
            # SIGTERM shuts Serve down as Ctrl-C does
            die_with_parent(signal.SIGTERM)
            from deployments.serve import hooks

            return hooks.serve_run(args[1:])
        from deployments.serve import hooks

        return hooks.ray_start(args[1:])
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())

__all__ = [
    "REQUEST_PATH_ENV",
    "call_server",
    "configure_environment",
    "main",
    "request_path_env",
    "start",
    "stop",
]
