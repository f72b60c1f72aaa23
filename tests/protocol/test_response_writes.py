"""uvicorn's httptools protocol with the coalescing send: same bytes, fewer writes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

uvicorn = pytest.importorskip("uvicorn")
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol  # noqa: E402
from uvicorn.server import ServerState  # noqa: E402

from deployments.serve.response_writes import coalesce_response_writes  # noqa: E402


class Transport(asyncio.Transport):
    """Records every write; enough of a socket transport for uvicorn's protocol."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.parts: list[list[Any]] = []  # what each ``writelines`` was handed
        self.closed = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def writelines(self, parts: Any) -> None:
        """One write of ``parts``, as a vectored write; the parts themselves are kept in ``parts``."""
        parts = list(parts)
        self.parts.append(parts)
        self.write(b"".join(parts))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_protocol(self, protocol: Any) -> None:
        pass


async def _serve(app: Any, raw: bytes) -> Transport:
    config = uvicorn.Config(app, http="httptools", lifespan="off", log_config=None, access_log=False)
    config.load()
    protocol = HttpToolsProtocol(config=config, server_state=ServerState(), app_state={})
    transport = Transport()
    protocol.connection_made(transport)
    protocol.data_received(raw)
    for _ in range(50):
        await asyncio.sleep(0)
    protocol.connection_lost(None)
    return transport


async def plain(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
    await send({"type": "http.response.body", "body": b"hello"})


async def chunked(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ab", "more_body": True})
    await send({"type": "http.response.body", "body": b"cd"})


async def fails_after_start(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
    raise RuntimeError("the app broke mid-response")


async def trailed(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [], "trailers": True})
    await send({"type": "http.response.body", "body": b"ab", "more_body": True})
    await send({"type": "http.response.body", "body": b"cd"})
    await send({"type": "http.response.trailers", "headers": [(b"Grpc-Status", b"0")], "more_trailers": True})
    await send({"type": "http.response.trailers", "headers": [(b"grpc-message", b"ok")]})


async def trailed_without_body(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [], "trailers": True})
    await send({"type": "http.response.trailers", "headers": [(b"grpc-status", b"5")]})


async def trailed_with_length(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    headers = [(b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": headers, "trailers": True})
    await send({"type": "http.response.body", "body": b"ab"})
    await send({"type": "http.response.trailers", "headers": [(b"grpc-status", b"0")]})


async def streamed(scope: Any, receive: Any, send: Any) -> None:
    from deployments.protocol.http1_server import STREAMED_RESPONSE

    await receive()
    start = {"type": "http.response.start", "status": 200, "headers": [], "trailers": True}
    await send({**start, STREAMED_RESPONSE: True})
    await send({"type": "http.response.body", "body": b"ab", "more_body": True})
    await send({"type": "http.response.body", "body": b"cd", "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    await send({"type": "http.response.trailers", "headers": [(b"grpc-status", b"0")]})


MIB = bytes(range(256)) * 4096


async def large(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(MIB))]}
    )
    await send({"type": "http.response.body", "body": MIB})


async def large_trailed(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [], "trailers": True})
    await send({"type": "http.response.body", "body": b"\x00\x00\x10\x00\x00", "more_body": True})
    await send({"type": "http.response.body", "body": MIB})
    await send({"type": "http.response.trailers", "headers": [(b"grpc-status", b"0")]})


GET = b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n"


@pytest.fixture(scope="module")
def installed() -> bool:
    return coalesce_response_writes()


async def test_head_and_body_leave_in_one_write(installed: bool) -> None:
    assert installed
    transport = await _serve(plain, GET)
    assert len(transport.writes) == 1
    head, _, body = transport.writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"content-length: 5" in head and body == b"hello"


async def test_chunked_response_keeps_every_byte(installed: bool) -> None:
    transport = await _serve(chunked, GET)
    data = b"".join(transport.writes)
    assert data.startswith(b"HTTP/1.1 200 OK") and b"transfer-encoding: chunked" in data
    assert data.endswith(b"\r\n\r\n2\r\nab\r\n2\r\ncd\r\n0\r\n\r\n")
    assert len(transport.writes) == 2  # head + first chunk, then the rest


async def test_head_request_gets_its_head(installed: bool) -> None:
    transport = await _serve(plain, b"HEAD /x HTTP/1.1\r\nhost: t\r\n\r\n")
    assert len(transport.writes) == 1 and transport.writes[0].startswith(b"HTTP/1.1 200 OK")
    assert transport.writes[0].endswith(b"\r\n\r\n")


async def test_app_failing_after_start_closes_the_connection(installed: bool) -> None:
    transport = await _serve(fails_after_start, GET)
    assert transport.closed  # as uvicorn does: the response is incomplete, the connection ends


def test_installing_twice_wraps_once(installed: bool) -> None:
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    assert coalesce_response_writes()
    inner = getattr(RequestResponseCycle.send, "__wrapped__")  # noqa: B009 - mypy sees no such attribute
    assert not hasattr(inner, "__wrapped__")


async def test_trailers_end_the_chunked_body(installed: bool) -> None:
    transport = await _serve(trailed, GET + GET)
    data = b"".join(transport.writes)
    one = b"2\r\nab\r\n2\r\ncd\r\n0\r\ngrpc-status: 0\r\ngrpc-message: ok\r\n\r\n"
    assert data.count(b"HTTP/1.1 200 OK") == 2  # the connection answered its next request too
    assert data.count(one) == 2 and data.endswith(one)
    assert len(transport.writes) == 2  # head, body and trailers of each response in one write


async def test_trailers_after_no_body_leave_with_the_head(installed: bool) -> None:
    transport = await _serve(trailed_without_body, GET)
    assert len(transport.writes) == 1
    assert transport.writes[0].endswith(b"transfer-encoding: chunked\r\n\r\n0\r\ngrpc-status: 5\r\n\r\n")


async def test_trailers_on_a_response_with_a_length_are_refused(installed: bool) -> None:
    transport = await _serve(trailed_with_length, GET)
    assert b"grpc-status" not in b"".join(transport.writes)
    assert transport.closed  # the app's error ends the connection, as any failure mid-response


def test_trailers_are_in_place_with_the_coalescing(installed: bool) -> None:
    from deployments.serve.response_writes import sends_trailers

    assert sends_trailers()


async def test_a_large_body_is_handed_to_the_transport_as_it_came(installed: bool) -> None:
    transport = await _serve(large, GET)
    assert len(transport.parts) == 1 and any(part is MIB for part in transport.parts[0])
    assert transport.writes[0].endswith(b"\r\n\r\n" + MIB)


async def test_a_large_trailed_body_is_held_as_parts_never_joined(installed: bool) -> None:
    transport = await _serve(large_trailed, GET)
    # one write: the head, the frame prefix's chunk, the body's chunk (uvicorn frames it), the trailers
    assert len(transport.writes) == 1 and len(transport.parts) == 1
    assert max(len(part) for part in transport.parts[0]) == len(MIB) + len(b"100000\r\n\r\n")
    body = transport.writes[0].partition(b"\r\n\r\n")[2]
    assert body == b"5\r\n\x00\x00\x10\x00\x00\r\n100000\r\n" + MIB + b"\r\n0\r\ngrpc-status: 0\r\n\r\n"


async def test_a_streamed_response_writes_each_part_as_it_comes_then_its_trailers(installed: bool) -> None:
    """A gRPC stream's answers leave one by one (the head with the first), not held for the trailers."""
    transport = await _serve(streamed, GET + GET)
    first = transport.writes[0]
    assert first.startswith(b"HTTP/1.1 200 OK") and first.endswith(b"\r\n\r\n2\r\nab\r\n")
    assert transport.writes[1:3] == [b"2\r\ncd\r\n", b"0\r\ngrpc-status: 0\r\n\r\n"]
    assert b"".join(transport.writes).count(b"HTTP/1.1 200 OK") == 2  # the connection goes on
