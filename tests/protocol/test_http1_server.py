"""The replica's own HTTP/1.1 server (``deployments.protocol.http1_server``) over real sockets, no Ray:
keep-alive and pipelining, request bodies (length, chunked, large, 100-continue), responses (length,
chunked, HEAD, trailers, streamed), failures, disconnects, graceful shutdown and the busy poll."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from deployments.protocol import http1_server
from deployments.protocol.http1_server import (
    STREAMED_RESPONSE,
    TRAILERS_EXTENSION,
    BusyPoll,
    Http1Protocol,
)

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


class State:
    def __init__(self) -> None:
        self.connections: set[Any] = set()
        self.tasks: set[asyncio.Task[None]] = set()


class Served:
    def __init__(self, server: asyncio.AbstractServer, state: State, port: int) -> None:
        self.server, self.state, self.port = server, state, port

    async def exchange(self, raw: bytes, until: Callable[[bytes], bool] | None = None) -> bytes:
        """Send ``raw`` on a new connection; what comes back until the server closes it (or ``until``)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(raw)
        data = b""
        try:
            while not (until and until(data)):
                chunk = await asyncio.wait_for(reader.read(65536), 5)
                if not chunk:
                    break
                data += chunk
        finally:
            writer.close()
        return data


@contextlib.asynccontextmanager
async def serve(app: App, busy: BusyPoll | None = None) -> AsyncIterator[Served]:
    state = State()
    server = await asyncio.get_running_loop().create_server(
        lambda: Http1Protocol(app, state, busy=busy), "127.0.0.1", 0
    )
    port = server.sockets[0].getsockname()[1]
    try:
        yield Served(server, state, port)
    finally:
        server.close()
        for conn in list(state.connections):
            conn.transport.close()
        await asyncio.sleep(0)


async def echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers ``<method> <path>?<query>`` and the request body, with a content-length."""
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    text = f"{scope['method']} {scope['path']}?{scope['query_string'].decode()} ".encode() + body
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(text))]}
    )
    await send({"type": "http.response.body", "body": text})


def _client(port: int) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", port, timeout=5)


async def test_keep_alive_bodies_and_paths() -> None:
    async with serve(echo) as served:

        def run() -> list[tuple[int, bytes]]:
            conn = _client(served.port)
            got = []
            for method, path, body in [
                ("POST", "/v2/models/m/infer", b"x" * 10),
                ("GET", "/a%20b/c?x=1", None),
                ("POST", "/chunked", iter([b"ab", b"cd"])),
            ]:
                conn.request(method, path, body=body)  # an iterator goes chunked
                response = conn.getresponse()
                got.append((response.status, response.read()))
            conn.close()
            return got

        got = await asyncio.to_thread(run)
    assert got == [
        (200, b"POST /v2/models/m/infer? " + b"x" * 10),
        (200, b"GET /a b/c?x=1 "),
        (200, b"POST /chunked? abcd"),
    ]


async def test_the_scope_is_asgi_http() -> None:
    seen: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope)
        await echo(scope, receive, send)

    async with serve(app) as served:
        await served.exchange(b"GET /x%2Fy?q HTTP/1.1\r\nHost: h\r\nX-One: 1\r\nconnection: close\r\n\r\n")
    (scope,) = seen
    assert scope["type"] == "http" and scope["http_version"] == "1.1" and scope["method"] == "GET"
    assert scope["path"] == "/x/y" and scope["raw_path"] == b"/x%2Fy" and scope["query_string"] == b"q"
    assert scope["headers"] == [(b"host", b"h"), (b"x-one", b"1"), (b"connection", b"close")]
    assert TRAILERS_EXTENSION in scope["extensions"] and scope["client"][0] == "127.0.0.1"


async def test_pipelined_requests_are_answered_in_order() -> None:
    order: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/slow":
            await asyncio.sleep(0.05)
        order.append(scope["path"])
        await echo(scope, receive, send)

    raw = b"".join(
        b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nabc" % p
        for p in (b"/slow", b"/fast", b"/last")
    )
    async with serve(app) as served:
        data = await served.exchange(
            raw, until=lambda d: d.count(b"HTTP/1.1 200") == 3 and d.endswith(b"abc")
        )
    assert order == ["/slow", "/fast", "/last"]
    bodies = [part.split(b"\r\n\r\n", 1)[1] for part in data.split(b"HTTP/1.1 200 OK\r\n")[1:]]
    assert bodies == [b"POST /slow? abc", b"POST /fast? abc", b"POST /last? abc"]


async def test_a_large_body_arrives_whole_while_reading_pauses() -> None:
    sizes: list[int] = []

    async def slow_reader(scope: dict[str, Any], receive: Any, send: Any) -> None:
        total = 0
        more = True
        while more:
            message = await receive()
            total += len(message["body"])
            more = message["more_body"]
            await asyncio.sleep(0.001)
        sizes.append(total)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body"})

    body = bytes(range(256)) * 8192  # 2 MiB, many times HIGH_WATER
    async with serve(slow_reader) as served:

        def run() -> int:
            conn = _client(served.port)
            conn.request("POST", "/big", body=body)
            status = conn.getresponse().status
            conn.close()
            return status

        assert await asyncio.to_thread(run) == 204
    assert sizes == [len(body)]


async def test_expect_100_continue_is_answered_when_the_body_is_read() -> None:
    async with serve(echo) as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(b"POST /e HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nexpect: 100-continue\r\n\r\n")
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writer.write(b"ok")
        final = await asyncio.wait_for(reader.readuntil(b"POST /e? ok"), 5)
        writer.close()
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n" and final.startswith(b"HTTP/1.1 200 OK")


async def test_a_response_without_length_is_chunked_and_head_has_no_body() -> None:
    async def parts(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        for piece in (b"one ", b"two ", b""):
            await send({"type": "http.response.body", "body": piece, "more_body": bool(piece)})

    async with serve(parts) as served:

        def run() -> tuple[bytes, str | None, bytes]:
            conn = _client(served.port)
            conn.request("GET", "/")
            response = conn.getresponse()
            got = (response.read(), response.getheader("transfer-encoding"))
            conn.request("HEAD", "/")
            head = conn.getresponse()
            return got[0], got[1], head.read()

        body, encoding, head_body = await asyncio.to_thread(run)
    assert body == b"one two " and encoding == "chunked" and head_body == b""


async def test_trailers_end_the_body_in_one_write() -> None:
    async def grpc_like(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [], "trailers": True})
        await send({"type": "http.response.body", "body": b"MSG", "more_body": False})
        await asyncio.sleep(0.02)  # nothing leaves before the trailers
        await send(
            {"type": "http.response.trailers", "headers": [(b"Grpc-Status", b"0")], "more_trailers": True}
        )
        await send({"type": "http.response.trailers", "headers": [(b"grpc-message", b"")]})

    async with serve(grpc_like) as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(b"POST /g HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        first = await asyncio.wait_for(reader.read(65536), 5)
        writer.close()
    assert first == (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nMSG\r\n0\r\ngrpc-status: 0\r\ngrpc-message: \r\n\r\n"
    )


async def test_a_streamed_response_writes_each_message_before_its_trailers() -> None:
    release = asyncio.Event()

    async def stream(scope: dict[str, Any], receive: Any, send: Any) -> None:
        start = {"type": "http.response.start", "status": 200, "headers": [], "trailers": True}
        await send({**start, STREAMED_RESPONSE: True})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        await release.wait()
        await send({"type": "http.response.trailers", "headers": [(b"grpc-status", b"0")]})

    async with serve(stream) as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(b"POST /s HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        first = await asyncio.wait_for(reader.readuntil(b"first\r\n"), 5)
        release.set()
        rest = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writer.close()
    assert first.endswith(b"\r\n\r\n5\r\nfirst\r\n") and rest == b"0\r\ngrpc-status: 0\r\n\r\n"


@pytest.mark.parametrize("when", ["before", "after", "never"])
async def test_a_failing_application_gets_500_or_a_closed_connection(when: str, caplog) -> None:
    async def failing(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if when == "after":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"9")]})
            await send({"type": "http.response.body", "body": b"part", "more_body": True})
        if when != "never":
            raise ValueError("boom")

    async with serve(failing) as served:
        data = await served.exchange(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        await asyncio.sleep(0.01)
        assert not served.state.connections and not served.state.tasks
    if when == "after":
        assert data.startswith(b"HTTP/1.1 200 OK") and data.endswith(b"part")
    else:
        assert data.startswith(b"HTTP/1.1 500 Internal Server Error") and b"connection: close" in data
    assert ("boom" in caplog.text) == (when != "never")


async def test_connection_close_and_http_1_0_close_after_the_response() -> None:
    async with serve(echo) as served:
        closed = await served.exchange(b"GET /a HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        old = await served.exchange(b"GET /b HTTP/1.0\r\n\r\n")
    assert closed.startswith(b"HTTP/1.1 200 OK") and b"connection: close\r\n" in closed
    assert closed.endswith(b"GET /a? ") and old.endswith(b"GET /b? ") and b"connection: close\r\n" in old


async def test_a_bad_request_or_header_is_refused() -> None:
    async def bad_header(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x", b"a\r\nb: c")]})

    async with serve(echo) as served:
        refused = await served.exchange(b"NOT HTTP\r\n\r\n")
    async with serve(bad_header) as served:
        failed = await served.exchange(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    assert refused.startswith(b"HTTP/1.1 400 Bad Request") and failed.startswith(b"HTTP/1.1 500")
    assert b"b: c" not in failed


async def test_the_client_leaving_is_a_disconnect() -> None:
    events: list[str] = []
    gone = asyncio.Event()

    async def waits(scope: dict[str, Any], receive: Any, send: Any) -> None:
        events.append((await receive())["type"])
        events.append((await receive())["type"])  # after the whole body: waits for the client to leave
        gone.set()

    async with serve(waits) as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\n\r\nz")
        await asyncio.sleep(0.05)
        assert events == ["http.request"]
        writer.close()
        await asyncio.wait_for(gone.wait(), 5)
    assert events == ["http.request", "http.disconnect"]


async def test_shutdown_closes_idle_connections_after_the_grace_and_lets_a_busy_one_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http1_server, "IDLE_CLOSE_GRACE_S", 0.3)
    release = asyncio.Event()

    async def held(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await release.wait()
        await echo(scope, receive, send)

    async with serve(held) as served:
        idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", served.port)
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(b"GET /busy HTTP/1.1\r\nhost: x\r\n\r\n")
        await asyncio.sleep(0.05)
        assert len(served.state.connections) == 2 and len(served.state.tasks) == 1
        loop = asyncio.get_running_loop()
        began = loop.time()
        for conn in list(served.state.connections):
            conn.shutdown()
        assert await asyncio.wait_for(idle_reader.read(), 5) == b""
        assert loop.time() - began >= 0.25  # open through the grace, then closed
        release.set()
        answer = await asyncio.wait_for(reader.read(), 5)  # then closed
        idle_writer.close()
        writer.close()
    assert b"connection: close\r\n" in answer and answer.endswith(b"GET /busy? ")


async def test_a_request_on_an_idle_connection_during_shutdown_is_answered_then_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # HAProxy may write a request on an idle connection as the replica shuts down: it is answered
    # (not dropped unanswered, which HAProxy would pass on as a refused call), and the connection closes
    monkeypatch.setattr(http1_server, "IDLE_CLOSE_GRACE_S", 5.0)
    async with serve(echo) as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        await asyncio.sleep(0.05)
        for conn in list(served.state.connections):
            conn.shutdown()
        await asyncio.sleep(0.05)
        writer.write(b"GET /late HTTP/1.1\r\nhost: x\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 2)  # answered, then closed well before the grace
        writer.close()
    assert answer.startswith(b"HTTP/1.1 200") and b"connection: close\r\n" in answer
    assert answer.endswith(b"GET /late? ")


class _Loop:
    """The two things :class:`BusyPoll` asks of its loop, with a clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.soon: list[Callable[[], None]] = []

    def time(self) -> float:
        return self.now

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.soon.append(callback)

    def turn(self, advance_us: float = 10) -> None:
        self.now += advance_us / 1e6
        ready, self.soon = self.soon, []
        for callback in ready:
            callback()


def test_the_busy_poll_polls_after_the_last_response_and_backs_off_after_misses() -> None:
    loop = _Loop()
    busy = BusyPoll(100, loop, loop.time)  # type: ignore[arg-type]
    busy.started()
    busy.started()
    busy.answered()
    assert not loop.soon  # one still running: nothing to poll for
    busy.answered()
    assert busy.polling and len(loop.soon) == 1
    for _ in range(5):
        loop.turn()
    busy.started()  # a hit within the budget: polling stops, no penalty
    loop.turn()
    assert not busy.polling and not loop.soon and busy.skip == 0
    misses = []
    for _ in range(8):
        busy.answered()
        while loop.soon:
            loop.turn(50)
        misses.append(busy.skip)
        while busy.skip:  # the idle periods slept through
            busy.started()
            busy.answered()
            assert not loop.soon
        busy.started()
    assert misses == [1, 2, 4, 8, 16, 32, 64, 64]
    busy.answered()
    loop.turn(10)
    busy.started()  # a hit starts over
    busy.answered()
    assert busy.penalty == 0 and busy.polling


async def test_the_busy_poll_counts_every_request_of_the_server() -> None:
    busy = BusyPoll(200)
    async with serve(echo, busy) as served:

        def run() -> int:
            conn = _client(served.port)
            for _ in range(3):
                conn.request("POST", "/x", body=b"1")
                conn.getresponse().read()
            conn.close()
            return 3

        await asyncio.to_thread(run)
        _, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nab")
        await asyncio.sleep(0.05)
        assert busy.running == 1
        writer.close()  # the request is dropped unanswered
        await asyncio.sleep(0.05)
    assert busy.running == 0


def test_status_lines_have_their_reason() -> None:
    assert http1_server._STATUS_LINES[404] == b"HTTP/1.1 404 Not Found\r\n"
    assert http1_server._status_line(599) == b"HTTP/1.1 599 \r\n"
