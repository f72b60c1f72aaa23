"""The servicer function Serve calls while building a replica's gRPC server
(``deployments.serve.grpc_ingress``), without Ray: passthrough registration, and calls moved onto the
deployment's own loop where Serve runs deployment code on a loop of its own."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import grpc
import pytest

from deployments.protocol.grpc import SERVICE, GrpcOptions
from deployments.protocol.proto import grpc_service_pb2 as pb
from deployments.serve import grpc_ingress


class _Plane:
    """Answers ServerLive, noting the loop it ran on."""

    def __init__(self) -> None:
        self.loops: list[asyncio.AbstractEventLoop] = []

    async def live(self) -> bool:
        self.loops.append(asyncio.get_running_loop())
        return True


class _Server:
    """What Serve's gRPCGenericServer offers the servicer function."""

    def __init__(self) -> None:
        self.passthrough: set[str] = set()
        self.handlers: list[Any] = []

    def add_passthrough_service(self, name: str) -> None:
        self.passthrough.add(name)

    def add_generic_rpc_handlers(self, handlers: tuple[Any, ...]) -> None:
        self.handlers.extend(handlers)


class _Context:
    def invocation_metadata(self) -> tuple[()]:
        return ()

    async def abort(self, code: grpc.StatusCode, message: str) -> None:
        raise RuntimeError(f"{code.name}: {message}")


@pytest.fixture
def deployment_loop() -> Any:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    grpc_ingress.withdraw()


def _register(plane: _Plane, loop: asyncio.AbstractEventLoop) -> None:
    async def register() -> None:
        grpc_ingress.serve_grpc(plane, GrpcOptions())  # type: ignore[arg-type]

    asyncio.run_coroutine_threadsafe(register(), loop).result(5)


def test_nothing_is_added_where_no_replica_registered() -> None:
    grpc_ingress.withdraw()
    server = _Server()
    grpc_ingress.add_inference_service(None, server)
    assert server.handlers == [] and server.passthrough == set()


def test_a_call_runs_on_the_deployments_loop(deployment_loop: asyncio.AbstractEventLoop) -> None:
    plane = _Plane()
    _register(plane, deployment_loop)
    server = _Server()

    async def on_serves_loop() -> tuple[Any, Any]:
        grpc_ingress.add_inference_service(None, server)  # Serve calls it on its own loop
        methods = server.handlers[0]._method_handlers
        live = methods[f"/{SERVICE}/ServerLive"].unary_unary
        answer = await live(pb.ServerLiveRequest(), _Context())
        stream = methods[f"/{SERVICE}/ModelStreamInfer"].stream_stream
        with pytest.raises(RuntimeError, match="UNAVAILABLE"):
            async for _ in stream(None, _Context()):
                pass
        return answer, asyncio.get_running_loop()

    answer, serves_loop = asyncio.run(on_serves_loop())
    assert SERVICE in server.passthrough
    assert answer.live is True
    assert plane.loops == [deployment_loop] and serves_loop is not deployment_loop


def test_on_the_same_loop_the_servicer_is_added_as_it_is() -> None:
    plane = _Plane()
    server = _Server()

    async def same_loop() -> Any:
        grpc_ingress.serve_grpc(plane, GrpcOptions())  # type: ignore[arg-type]
        grpc_ingress.add_inference_service(None, server)
        live = server.handlers[0]._method_handlers[f"/{SERVICE}/ServerLive"].unary_unary
        return await live(pb.ServerLiveRequest(), _Context())

    try:
        assert asyncio.run(same_loop()).live is True
    finally:
        grpc_ingress.withdraw()
    assert plane.loops and SERVICE in server.passthrough


def test_calls_over_http1_run_on_the_deployments_loop(deployment_loop: asyncio.AbstractEventLoop) -> None:
    """The replica's HTTP server (its own loop here) hands a gRPC call to the lane registered by
    ``serve_grpc``; the servicer runs on the deployment's loop, the answer is written where it came."""
    from deployments.protocol.http1_server import TRAILERS_EXTENSION
    from deployments.serve import ingress

    plane = _Plane()
    _register(plane, deployment_loop)
    lane = ingress._grpc_calls
    assert lane is not None
    sent: list[dict[str, Any]] = []

    async def on_the_http_servers_loop() -> asyncio.AbstractEventLoop:
        scope = {
            "type": "http",
            "method": "POST",
            "path": f"/{SERVICE}/ServerLive",
            "headers": [(b"content-type", b"application/grpc")],
            "extensions": {TRAILERS_EXTENSION: {}},
        }

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"\x00\x00\x00\x00\x00", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await lane(scope, receive, send)
        return asyncio.get_running_loop()

    http_loop = asyncio.run(on_the_http_servers_loop())
    assert plane.loops == [deployment_loop] and http_loop is not deployment_loop
    assert sent[-1] == {
        "type": TRAILERS_EXTENSION,
        "headers": [(b"grpc-status", b"0")],
        "more_trailers": False,
    }
    body = b"".join(m["body"] for m in sent if m["type"] == "http.response.body")
    assert pb.ServerLiveResponse.FromString(body[5:]).live is True
    grpc_ingress.withdraw()
    assert ingress._grpc_calls is None
