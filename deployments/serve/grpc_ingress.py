"""gRPC in one hop: each replica answers ``inference.GRPCInferenceService`` on Serve's own per-replica
gRPC port, behind HAProxy's gRPC frontend (docs/grpc.md).

With ``grpc_options`` naming :data:`SERVICER_FUNCTION` (``serve_config.yaml``; ``triton-serve serve``
and the test suite set it from ``grpc_port``), Serve's HAProxy binds the gRPC port and every ingress
replica starts a gRPC server of its own (ports 40000+). Serve then calls
:func:`add_inference_service` while it builds that server, after the deployment's constructor ran:

* In a replica that registered a data plane with :func:`serve_grpc` (a model replica: its model's
  runtime; the server replica: every model, through the controller), the service is added as a
  *passthrough* service, so its calls run this project's servicer there, without Serve's
  per-request wrapper (the gRPC counterpart of the direct HTTP lane, ``deployments.serve.ingress``).
* Anywhere else (Serve's own proxy actors) nothing is added: they answer only Serve's API service.

HAProxy routes each ``ModelInfer`` call (over HTTP/1.1, to the replica's HTTP port) and each
``ModelStreamInfer`` stream (to the replica's gRPC port) to the replicas of the model named at the
head of the first message (``deployments.serve.haproxy_shim``), and every other call (metadata, the
repository API, a compressed message) to the server application's replicas. The servicer only
decodes and encodes: where each inference runs (this replica, a sequence's owner, another model's
replica for a stream's later request) is the data plane's router's decision
(``deployments.runtime.router``).

Where Serve runs deployment code on an event loop of its own (no ``RAY_SERVE_THROUGHPUT_OPTIMIZED``),
unary calls are moved onto that loop; streams need the request-path environment and are refused
UNAVAILABLE without it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import grpc

from deployments.protocol.dataplane import ModelDataPlane
from deployments.protocol.grpc import SERVICE, GRPCInferenceServicer, GrpcOptions, restricted_metadata_key
from deployments.protocol.grpc_http1 import GrpcOverHttp1
from deployments.serve import hooks, ingress
from deployments.settings import RestrictedApi, ServerSettings, compile_header_pattern, restriction_for

logger = logging.getLogger("ray.serve")

SERVICER_FUNCTION = "deployments.serve.grpc_ingress:add_inference_service"
"""The ``grpc_options.grpc_servicer_functions`` entry that turns on gRPC through Serve's ports."""


class _Registered:
    __slots__ = ("servicer", "loop")

    def __init__(self, servicer: GRPCInferenceServicer, loop: asyncio.AbstractEventLoop) -> None:
        self.servicer = servicer
        self.loop = loop


# The data plane of this process's replica (one replica per Ray actor process), once registered.
_local: _Registered | None = None


def grpc_options(settings: ServerSettings) -> GrpcOptions:
    """The gRPC front end's options from the server settings (one place for both ways it is served)."""
    return GrpcOptions(
        host=settings.grpc_host,
        port=settings.grpc_port,
        max_receive_message_bytes=settings.grpc_max_receive_message_bytes,
        max_send_message_bytes=settings.grpc_max_send_message_bytes,
        compression=settings.grpc_compression,
        restricted=settings.grpc_restricted_api,
        header_forward=compile_header_pattern(settings.grpc_header_forward_pattern),
        response_delay_s=settings.grpc_response_delay_s,
    )


def serve_options(settings: ServerSettings) -> dict[str, Any] | None:
    """Serve's ``grpc_options`` for ``settings`` (None when ``allow_grpc`` is off)."""
    if not settings.allow_grpc:
        return None
    return {"port": settings.grpc_port, "grpc_servicer_functions": [SERVICER_FUNCTION]}


def serve_grpc(dataplane: ModelDataPlane, options: GrpcOptions) -> None:
    """Answer the gRPC service in this replica over ``dataplane``: its unary calls on the replica's HTTP
    port at once (over HTTP/1.1, ``deployments.serve.ingress``), every call on Serve's gRPC server once
    Serve starts it. Called from the deployment's constructor, on the loop its code runs on."""
    global _local
    loop = asyncio.get_running_loop()
    servicer = GRPCInferenceServicer(dataplane, options)
    _local = _Registered(servicer, loop)
    ingress.serve_grpc_calls(GrpcOverHttp1(servicer, run=_runner(loop)))


def withdraw() -> None:
    """Stop answering the service (a replica that stops answering it)."""
    global _local
    _local = None
    ingress.serve_grpc_calls(None)


def _runner(loop: asyncio.AbstractEventLoop) -> Callable[[Coroutine[Any, Any, Any]], Awaitable[Any]]:
    """Runs a coroutine on ``loop`` (the deployment's), wherever it is awaited from."""

    async def run(call: Coroutine[Any, Any, Any]) -> Any:
        if asyncio.get_running_loop() is loop:
            return await call
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call, loop))

    return run


def add_inference_service(servicer: Any, server: Any) -> None:
    """Serve's servicer function (``grpc_options.grpc_servicer_functions``): see the module's description."""
    local = _local
    if local is None:
        return
    handler = local.servicer.handler()
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is not None and loop is not local.loop:
        handler = _on_loop(handler, local.loop)
    hooks.add_passthrough_service(server, SERVICE)
    server.add_generic_rpc_handlers((handler,))
    logger.info("gRPC service %s answered in this replica", SERVICE)


def _on_loop(handler: Any, loop: asyncio.AbstractEventLoop) -> grpc.GenericRpcHandler:
    """``handler`` with each unary method run on ``loop`` (the deployment's), streams refused."""
    methods: dict[str, grpc.RpcMethodHandler] = {}
    for path, method in handler._method_handlers.items():
        name = path.rsplit("/", 1)[-1]
        if method.unary_unary is not None:
            methods[name] = method._replace(unary_unary=_hop(method.unary_unary, loop))
        else:
            methods[name] = method._replace(stream_stream=_refuse_stream)
    return grpc.method_handlers_generic_handler(SERVICE, methods)


def _hop(call: Callable[[Any, Any], Coroutine[Any, Any, Any]], loop: asyncio.AbstractEventLoop) -> Any:
    run = _runner(loop)

    async def handle(request: Any, context: Any) -> Any:
        return await run(call(request, context))

    return handle


async def _refuse_stream(requests: Any, context: Any) -> Any:
    await context.abort(
        grpc.StatusCode.UNAVAILABLE,
        "ModelStreamInfer needs the server's request-path environment (RAY_SERVE_THROUGHPUT_OPTIMIZED=1)",
    )
    yield  # pragma: no cover  (an async generator: abort raises)


ANSWER_POLL_S = 0.05
"""Pause between two ``ServerLive`` calls while waiting for the gRPC port: readiness after a restart
of the server application waits for it (a refused call costs HAProxy microseconds, and the 0.2 s this
was before added about a tenth of a second, on average, to every restart)."""


def wait_until_answering(
    host: str, port: int, timeout_s: float, restricted: tuple[RestrictedApi, ...] = ()
) -> bool:
    """Whether ``ServerLive`` answered live on ``host:port`` within ``timeout_s`` (HAProxy takes up the
    server replica's gRPC port a moment after the HTTP routes answer). ``restricted``: the server's
    ``grpc_restricted_api``; where it guards ``health`` the call carries that header, as a client must."""
    import time

    from deployments.protocol.proto import grpc_service_pb2 as pb

    target = f"{'127.0.0.1' if host in ('', '0.0.0.0') else host}:{port}"
    rule = restriction_for(restricted, "health")
    metadata = ((restricted_metadata_key(rule), rule.value),) if rule is not None else None
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(target) as channel:
        live = channel.unary_unary(
            f"/{SERVICE}/ServerLive",
            request_serializer=pb.ServerLiveRequest.SerializeToString,
            response_deserializer=pb.ServerLiveResponse.FromString,
        )
        while time.monotonic() < deadline:
            try:
                if live(pb.ServerLiveRequest(), timeout=2.0, metadata=metadata).live:
                    return True
            except grpc.RpcError:
                pass
            time.sleep(ANSWER_POLL_S)
    return False


__all__ = [
    "SERVICER_FUNCTION",
    "add_inference_service",
    "grpc_options",
    "serve_grpc",
    "serve_options",
    "wait_until_answering",
    "withdraw",
]
