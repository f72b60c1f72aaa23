"""What every replica's HTTP server does before Serve sees a request.

Serve's direct ingress starts an HTTP server (uvicorn) in each ingress replica and
hands every request to its own ASGI wrapper, which builds request metadata, takes
a slot of ``max_ongoing_requests``, records Serve's request metrics and, unless
told otherwise, watches the client for a disconnect (a receive task and an
``asyncio.wait`` per request) before it calls the application. Skipping it for
the model's own routes took the ``overhead`` scenario from 0.70 / 0.44 of
tritonserver's throughput (concurrency 1 / 32, perf_analyzer) to 0.77 / 0.65.

:func:`middlewares` (named by ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH``, see
``deployments.serve.launch``) wraps Serve's handler in that server:

* **The direct lane.** A replica whose application registered itself with
  :func:`serve_directly` answers the requests under its route prefix by calling
  its application here, without Serve's per-request wrapper. Serve's own routes
  (``/-/healthz``, ``/-/routes``) and every path outside the prefix still go to
  Serve. What the lane gives up, and why this server does not need it: Serve's
  request metrics (the Triton metrics and statistics are recorded by the model
  itself), the ``max_ongoing_requests`` slot (admission is the model's own queue
  policy, ``max_queue_size``, as in Triton) and Serve's ongoing-request count
  (a model that autoscales reports its own, ``ModelDeployment.record_autoscaling_stats``). Shutdown stays
  graceful: Serve stops the HTTP server, which lets in-flight requests finish,
  before it calls the deployment's destructor.
* **gRPC over HTTP/1.1.** A replica that answers the gRPC service (:func:`serve_grpc_calls`, from
  ``deployments.serve.grpc_ingress``) answers ``POST /inference.GRPCInferenceService/<Method>`` here:
  HAProxy hands a model's ``ModelInfer`` calls to its replicas' HTTP ports (HTTP/2 in front,
  HTTP/1.1 behind, ``deployments.serve.haproxy_shim``), and the scope advertises ASGI's trailers
  extension where this process's uvicorn writes them (``deployments.serve.response_writes``).
* **Run to completion.** Everything else carries Serve's "disconnect disabled"
  header, which lets Serve await the application directly. Triton does not
  cancel an HTTP inference whose client went away (the response is dropped), and
  neither does this server, on either path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.middleware import Middleware

from deployments.protocol.grpc_http1 import PATH_PREFIX as GRPC_PATH_PREFIX
from deployments.protocol.http1_server import TRAILERS_EXTENSION
from deployments.serve.hooks import DISCONNECT_DISABLED
from deployments.serve.response_writes import sends_trailers

SERVE_ROUTES = ("/-/",)

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]


class _Route:
    """A registered application, the event loop its deployment runs on, and how many requests it
    answered through the direct lane."""

    __slots__ = ("app", "loop", "answered")

    def __init__(self, app: ASGIApp, loop: asyncio.AbstractEventLoop) -> None:
        self.app = app
        self.loop = loop
        self.answered = 0


# The applications of this process (one replica per Ray actor process), by route prefix without its
# trailing "/" (so "/" is "", which every path extends).
_direct: dict[str, _Route] = {}


# This process's gRPC calls over HTTP/1.1 (``deployments.protocol.grpc_http1.GrpcOverHttp1``), if any.
_grpc_calls: ASGIApp | None = None


def serve_grpc_calls(app: ASGIApp | None) -> None:
    """Answer gRPC calls (``/inference.GRPCInferenceService/...``) in this process with ``app``; None
    stops. ``app`` runs where the request arrives and moves the servicer's part to its own loop."""
    global _grpc_calls
    _grpc_calls = app


def _key(route_prefix: str) -> str:
    return route_prefix.rstrip("/")


def serve_directly(route_prefix: str, app: ASGIApp, enabled: bool = True) -> bool:
    """Answer requests under ``route_prefix`` in this process with ``app``, bypassing Serve's wrapper.

    Called from the deployment's constructor, on the loop its code runs on. Requests are answered
    directly only when the HTTP server runs on that same loop (Serve's throughput-optimized mode,
    which ``deployments.serve.launch`` sets); where Serve runs user code on a thread of its own, they keep
    going through Serve, which moves them onto that loop. False (nothing registered) where no
    loop is running or ``enabled`` is off (``ServerSettings.direct_routes``, from
    ``TRITON_SERVE_DIRECT_ROUTES=0``).
    """
    if not enabled:
        return False
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False
    _direct[_key(route_prefix)] = _Route(app, loop)
    return True


def answered_directly(route_prefix: str) -> int | None:
    """Requests under ``route_prefix`` answered through the direct lane so far; None if not registered."""
    route = _direct.get(_key(route_prefix))
    return None if route is None else route.answered


def withdraw(route_prefix: str) -> None:
    """Stop answering ``route_prefix`` directly (its requests go through Serve again)."""
    _direct.pop(_key(route_prefix), None)


def route_for(path: str, loop: asyncio.AbstractEventLoop) -> _Route | None:
    """The registration whose route prefix holds ``path`` and whose deployment runs on ``loop``, if
    any (the longest prefix wins); Serve's own routes never match."""
    if path.startswith(SERVE_ROUTES):
        return None
    found: _Route | None = None
    longest = -1
    for prefix, route in _direct.items():
        if (
            route.loop is loop
            and path.startswith(prefix)
            and (len(path) == len(prefix) or path[len(prefix)] == "/")
            and len(prefix) > longest
        ):
            found, longest = route, len(prefix)
    return found


class ReplicaIngress:
    """ASGI middleware in front of Serve's direct-ingress handler (see the module's description)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            if _direct or _grpc_calls is not None:
                path: str = scope.get("path") or "/"
                root: str = scope.get("root_path") or ""
                if root and path.startswith(root):
                    path = path[len(root) :] or "/"
                if _grpc_calls is not None and path.startswith(GRPC_PATH_PREFIX):
                    if sends_trailers():
                        extensions = scope.get("extensions")
                        if extensions is None:
                            scope["extensions"] = extensions = {}
                        extensions[TRAILERS_EXTENSION] = {}
                    await _grpc_calls(scope, receive, send)
                    return
                route = route_for(path, asyncio.get_running_loop())
                if route is not None:
                    route.answered += 1
                    await route.app(scope, receive, send)
                    return
            headers = scope["headers"]
            if isinstance(headers, list):
                headers.append(DISCONNECT_DISABLED)
            else:
                scope["headers"] = [*headers, DISCONNECT_DISABLED]
        await self.app(scope, receive, send)


def middlewares() -> list[Middleware]:
    """The replica HTTP servers' extra middleware (Serve's HTTP proxy callback)."""
    return [Middleware(ReplicaIngress)]
