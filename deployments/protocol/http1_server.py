"""A small HTTP/1.1 server for ASGI applications: the replica's end of the hop from HAProxy.

Every request a model replica answers arrives from HAProxy over one of a few kept-alive
connections, on the replica's local socket (``deployments.serve.local_sockets``). uvicorn's
httptools protocol serves any client; for each request it builds a request-response cycle, an
event, a keep-alive timer and a write per message, and this server wraps its ``send`` again to write
a response in one system call and to add ASGI's trailers (``deployments.serve.response_writes``).
:class:`Http1Protocol` is the same protocol cut to what that hop needs, on the same parser
(httptools): one object per request, the response's head, body and trailers written together in
one ``writelines`` when the response is complete (a streamed response: each body message as it
comes), and no timers.

What it implements, as uvicorn does: keep-alive and pipelined requests (answered in order, reading
paused while one waits), request bodies in ``Content-Length`` or chunked form handed to the
application as they arrive (reading paused above :data:`HIGH_WATER` bytes not yet received by the
application), ``Expect: 100-continue``, responses with ``Content-Length`` or chunked, HEAD, ASGI's
HTTP trailers extension, ``Connection: close`` either way, write flow control, ``http.disconnect``
when the connection is lost (and, once a request's body is read, when its response completes), a
500 for an application that fails before it starts its response, and the graceful shutdown of the
server it joins (:class:`ServerState`: the connections and the tasks a shutdown waits for).

What it leaves out, because HAProxy does it in front: the keep-alive timeout (HAProxy closes the idle
connections of its pool), limits on the request head (HAProxy's buffer bounds it), WebSocket
upgrades (the request is answered, then the connection closed), the ``date`` and ``server`` headers, and the access log.
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from http import HTTPStatus
from typing import Any, Protocol

import httptools

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]
]

HIGH_WATER = 65536
"""Request body bytes held for the application before the connection stops reading."""
IDLE_CLOSE_GRACE_S = 1.0
"""How long a graceful shutdown keeps an idle connection open, answering a request that comes on it
(then closing). HAProxy reuses its idle connections to a replica; one it writes a request on just as
the replica closes it gets no answer, and HAProxy cannot tell whether the request ran, so it refuses
the client's call (gRPC: ``RST_STREAM`` ``REFUSED_STREAM``, which the gRPC client passes on as
UNAVAILABLE) instead of sending it to another replica. A request that comes in this window is
answered with ``Connection: close``, so HAProxy opens a new connection for the next one, which the
closed listener refuses and HAProxy sends elsewhere; an idle connection HAProxy did not use within
it is no longer one it picks."""
TRAILERS_EXTENSION = "http.response.trailers"
STREAMED_RESPONSE = "triton_serve.streamed"
"""A key of ``http.response.start`` (a gRPC stream's, ``deployments.protocol.grpc_http1``): each body
message is written as it comes, not held for the trailers (also read by
``deployments.serve.response_writes`` on uvicorn's server)."""


def _status_line(code: int) -> bytes:
    try:
        phrase = HTTPStatus(code).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (code, phrase)


_STATUS_LINES = {code: _status_line(code) for code in range(100, 600)}
_LAST_CHUNK = b"0\r\n\r\n"
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_DISCONNECT: Message = {"type": "http.disconnect"}
_FAILED = (
    b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 21\r\nconnection: close\r\n\r\nInternal Server Error"
)
_BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"


class BusyPoll:
    """Keeps the event loop polling for a while after the last response, instead of sleeping in the kernel.

    A process that sleeps between requests wakes each time on a cold processor (on a virtual machine,
    often a descheduled one): the wake-up's latency, and the first instructions after it, cost more
    than the request's own work on a fast model. When this server answered the last request it was
    running, it keeps a callback on the loop (each turn of the loop then polls its sockets without
    waiting) for up to ``budget_us`` microseconds, so a request that arrives meanwhile is read at once
    on a warm processor. A poll that ended without a request (the client is slow, or gone) is a miss:
    the next ``1, 2, 4, ... 64`` idle periods are slept through, so a model called now and then polls
    for no more than ``budget_us`` per 64 requests; a hit starts over. ``budget_us`` 0: never.
    """

    __slots__ = (
        "budget_s",
        "loop",
        "clock",
        "running",
        "deadline",
        "polling",
        "scheduled",
        "skip",
        "penalty",
    )

    def __init__(
        self,
        budget_us: int,
        loop: asyncio.AbstractEventLoop | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.budget_s = max(0, budget_us) / 1e6
        self.loop = loop or asyncio.get_event_loop()
        self.clock = clock  # not the loop's: uvloop's time() counts whole milliseconds
        self.running = 0  # requests read and not yet answered
        self.deadline = 0.0
        self.polling = False  # waiting for a request, polling
        self.scheduled = False  # the polling callback is on the loop
        self.skip = 0  # idle periods still to sleep through after a miss
        self.penalty = 0

    def started(self) -> None:
        """A request arrived (its head was read)."""
        self.running += 1
        if self.polling:
            self.polling = False
            self.penalty = 0

    def answered(self) -> None:
        """A request's response was written, or the request dropped with its connection."""
        self.running -= 1
        if self.running or not self.budget_s:
            return
        if self.skip:
            self.skip -= 1
            return
        self.deadline = self.clock() + self.budget_s
        self.polling = True
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self._poll)

    def _poll(self) -> None:
        if self.polling and self.clock() < self.deadline:
            self.loop.call_soon(self._poll)
            return
        self.scheduled = False
        if self.polling:  # nothing came: a miss
            self.polling = False
            self.penalty = min(64, self.penalty * 2 or 1)
            self.skip = self.penalty


class ServerState(Protocol):
    """What a server shares with its connections: uvicorn's ``ServerState`` has these."""

    connections: set[Any]
    tasks: set[asyncio.Task[None]]


def _bad_header(name: bytes, value: bytes) -> bool:
    return (
        b"\r" in value or b"\n" in value or b"\0" in value or b":" in name or b"\r" in name or b"\n" in name
    )


class _Exchange:
    """One request and its response on a connection: the ASGI ``receive`` and ``send`` of its call."""

    __slots__ = (
        "conn",
        "scope",
        "body",
        "buffered",
        "more_body",
        "handed",
        "waiter",
        "expect_continue",
        "keep_alive",
        "head_only",
        "started",
        "complete",
        "chunked",
        "length_left",
        "trailers_due",
        "streamed",
        "held",
        "trailer_lines",
        "counted",
    )

    def __init__(self, conn: Http1Protocol, scope: Scope, keep_alive: bool, expect_continue: bool) -> None:
        self.conn = conn
        self.scope = scope
        self.body: list[bytes] = []
        self.buffered = 0
        self.more_body = True
        self.handed = False  # the whole body was handed to the application
        self.waiter: asyncio.Future[None] | None = None
        self.expect_continue = expect_continue
        self.keep_alive = keep_alive
        self.head_only = scope["method"] == "HEAD"
        self.started = False
        self.complete = False
        self.chunked = False
        self.length_left: int | None = None
        self.trailers_due = False
        self.streamed = False
        self.held: list[bytes] = []
        self.trailer_lines: list[bytes] = []
        self.counted = True  # in the busy poll's count of running requests

    # request side, fed by the parser
    def feed(self, chunk: bytes) -> None:
        self.body.append(chunk)
        self.buffered += len(chunk)
        if self.buffered > HIGH_WATER:
            self.conn.pause_reading()
        self._wake()

    def end_of_body(self) -> None:
        self.more_body = False
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def receive(self) -> Message:
        conn = self.conn
        if self.expect_continue:
            self.expect_continue = False
            if not self.started and not conn.lost:
                conn.transport.write(_CONTINUE)
        while True:
            if conn.lost or self.complete:
                return _DISCONNECT
            if not self.handed and (self.body or not self.more_body):
                body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
                self.body = []
                self.buffered = 0
                more = self.more_body
                self.handed = not more
                if conn.paused and conn.current is self and not conn.waiting:
                    conn.resume_reading()
                return {"type": "http.request", "body": body, "more_body": more}
            # wait for more of the body, or (all of it handed over) for the response's end or the connection's
            if conn.paused and conn.current is self and not conn.waiting:
                conn.resume_reading()
            waiter = self.waiter = conn.loop.create_future()
            await waiter

    # response side, called by the application
    async def send(self, message: Message) -> None:
        conn = self.conn
        if conn.lost:
            return
        kind = message["type"]
        if not self.started:
            if kind != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got '{kind}'.")
            self._start(message)
            return
        if self.complete:
            raise RuntimeError(f"Unexpected ASGI message '{kind}' sent, after response already completed.")
        if kind == "http.response.body":
            self._body(message.get("body", b""), message.get("more_body", False))
        elif kind == TRAILERS_EXTENSION and self.trailers_due:
            self._trailers(message)
        else:
            raise RuntimeError(f"Unexpected ASGI message '{kind}' sent.")
        if conn.write_paused and not conn.lost:
            await conn.drain()

    def _start(self, message: Message) -> None:
        status = message["status"]
        head = [_STATUS_LINES.get(status) or _status_line(status)]
        close = False
        length: int | None = None
        chunked = False
        for name, value in message.get("headers", ()):
            if _bad_header(name, value):
                raise RuntimeError("Invalid HTTP header.")
            name = name.lower()
            if name == b"content-length":
                if length is None and not chunked:
                    length = int(value)
            elif name == b"transfer-encoding":
                chunked = value.lower() == b"chunked"
            elif name == b"connection" and b"close" in [t.strip() for t in value.lower().split(b",")]:
                close = True
            head += (name, b": ", value, b"\r\n")
        if close:
            self.keep_alive = False
        elif not self.keep_alive:
            head.append(b"connection: close\r\n")
        if message.get("trailers"):
            if length is not None:
                raise RuntimeError("HTTP trailers need a chunked response (no content-length)")
            self.trailers_due = True
            self.streamed = bool(message.get(STREAMED_RESPONSE))
            if not chunked:
                chunked = True
                head.append(b"transfer-encoding: chunked\r\n")
        elif length is None and not chunked and not self.head_only and status not in (204, 304):
            chunked = True
            head.append(b"transfer-encoding: chunked\r\n")
        head.append(b"\r\n")
        self.started = True
        self.expect_continue = False
        self.chunked = chunked and not self.head_only
        self.length_left = None if chunked or self.head_only else (length or 0)
        self.held = head

    def _body(self, body: bytes, more_body: bool) -> None:
        held = self.held
        if self.head_only:
            pass
        elif self.chunked:
            if body:
                held += (b"%x\r\n" % len(body), body, b"\r\n")
            if not more_body and not self.trailers_due:
                held.append(_LAST_CHUNK)
        elif body:
            left = (self.length_left or 0) - len(body)
            if left < 0:
                raise RuntimeError("Response content longer than Content-Length")
            self.length_left = left
            held.append(body)
        if self.trailers_due:  # the body leaves with the trailers, unless the response is streamed
            if self.streamed:
                self._flush()
            return
        if more_body:
            self._flush()
            return
        if self.length_left:
            raise RuntimeError("Response content shorter than Content-Length")
        self._finish()

    def _trailers(self, message: Message) -> None:
        for name, value in message.get("headers", ()):
            if _bad_header(name, value):
                raise RuntimeError("Invalid HTTP trailer.")
            self.trailer_lines.append(bytes(name).lower() + b": " + bytes(value) + b"\r\n")
        if message.get("more_trailers", False):
            return
        self.held += (b"0\r\n", *self.trailer_lines, b"\r\n")
        self.trailers_due = False
        self._finish()

    def _flush(self) -> None:
        if self.held:
            self.conn.transport.writelines(self.held)
            self.held = []

    def _finish(self) -> None:
        self._flush()
        self.complete = True
        self._wake()
        self.release()
        self.conn.answered(self)

    def release(self) -> None:
        """Out of the busy poll's count: answered, or dropped."""
        if self.counted:
            self.counted = False
            busy = self.conn.busy
            if busy is not None:
                busy.answered()


class Http1Protocol(asyncio.Protocol):
    """One HTTP/1.1 connection served to an ASGI application (see the module's description).

    ``state``: the server's connections and tasks (a graceful shutdown closes the idle connections,
    lets the busy ones finish their response, and waits for the tasks); ``app_state``: the lifespan
    state each request's scope gets a copy of; ``busy``: the server's :class:`BusyPoll`, if it polls.
    The scope's ``extensions`` hold :data:`TRAILERS_EXTENSION`.
    """

    def __init__(
        self,
        app: ASGIApp,
        state: ServerState,
        app_state: dict[str, Any] | None = None,
        root_path: str = "",
        busy: BusyPoll | None = None,
    ) -> None:
        self.app = app
        self.busy = busy
        self.state = state
        self.app_state = app_state or {}
        self.root_path = root_path
        self.loop = asyncio.get_event_loop()
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.server: tuple[str, int] | None = None
        self.client: tuple[str, int] | None = None
        self.lost = False
        self.paused = False
        self.write_paused = False
        self.drained: asyncio.Future[None] | None = None
        self.closing = False
        # the request being parsed, the one being answered, and those parsed behind it
        self.parsing: _Exchange | None = None
        self.current: _Exchange | None = None
        self.waiting: deque[_Exchange] = deque()
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._expect = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server = _address(transport.get_extra_info("sockname"))
        self.client = _address(transport.get_extra_info("peername"))
        self.state.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.state.connections.discard(self)
        for exchange in {self.current, self.parsing, *self.waiting}:
            if exchange is not None:
                exchange.release()
                exchange._wake()
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)
        self.waiting.clear()

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # the request before the upgrade runs; nothing after it is read (no protocol is switched to)
            self._finish()
        except httptools.HttpParserError:
            self._refuse(b"Invalid HTTP request received.")

    def eof_received(self) -> bool | None:
        return None

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)
        self.drained = None

    # flow control
    def pause_reading(self) -> None:
        if not self.paused and not self.lost:
            self.paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.paused and not self.lost:
            self.paused = False
            self.transport.resume_reading()

    async def drain(self) -> None:
        if self.drained is None:
            self.drained = self.loop.create_future()
        await self.drained

    def shutdown(self) -> None:
        """The server's graceful shutdown: a busy connection closes after its response; an idle one
        stays open :data:`IDLE_CLOSE_GRACE_S`, answering a request that comes meanwhile, then closes."""
        self.closing = True
        if self.current is not None:
            self.current.keep_alive = False
        else:
            self.loop.call_later(IDLE_CLOSE_GRACE_S, self._finish)

    def _finish(self) -> None:
        """Close now if no request is being answered, else after its response."""
        self.closing = True
        for exchange in (self.current, self.parsing):  # one parsed before the shutdown closes too
            if exchange is not None:
                exchange.keep_alive = False
        if self.current is None and self.parsing is None:
            self._close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._expect = False

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self._expect = True
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self.parser
        version = parser.get_http_version()
        url = httptools.parse_url(self._url)
        raw_path: bytes = url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": version,
            "server": self.server,
            "client": self.client,
            "scheme": "http",
            "method": parser.get_method().decode("ascii"),
            "root_path": self.root_path,
            "path": self.root_path + path,
            "raw_path": self.root_path.encode("ascii") + raw_path,
            "query_string": url.query or b"",
            "headers": self._headers,
            "state": self.app_state.copy(),
            "extensions": {TRAILERS_EXTENSION: {}},
        }
        keep_alive = version != "1.0" and parser.should_keep_alive() and not self.closing
        exchange = _Exchange(self, scope, keep_alive, self._expect)
        if self.busy is not None:
            self.busy.started()
        else:
            exchange.counted = False
        self.parsing = exchange
        if self.current is None:
            self._begin(exchange)
        else:
            self.waiting.append(exchange)
            self.pause_reading()

    def on_body(self, body: bytes) -> None:
        exchange = self.parsing
        if exchange is not None and not exchange.complete:
            exchange.feed(body)

    def on_message_complete(self) -> None:
        exchange = self.parsing
        if exchange is not None:
            self.parsing = None
            exchange.end_of_body()

    # requests
    def _begin(self, exchange: _Exchange) -> None:
        self.current = exchange
        task = self.loop.create_task(self._run(exchange))
        tasks = self.state.tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _run(self, exchange: _Exchange) -> None:
        try:
            await self.app(exchange.scope, exchange.receive, exchange.send)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError) and self.lost:
                pass
            else:
                logger.error("Exception in ASGI application", exc_info=exc)
            if not exchange.started and not self.lost:
                exchange.complete = True
                self.transport.write(_FAILED)
            self._close()
            if not isinstance(exc, Exception):
                raise
            return
        if exchange.complete or self.lost:
            return
        if not exchange.started:
            logger.error("ASGI callable returned without starting response.")
            exchange.complete = True
            self.transport.write(_FAILED)
        else:
            logger.error("ASGI callable returned without completing response.")
        self._close()

    def answered(self, exchange: _Exchange) -> None:
        """``exchange``'s response was written: close, or answer the next request."""
        if exchange is not self.current:
            return
        self.current = None
        if not exchange.keep_alive:
            self._close()
            return
        if self.waiting:
            self._begin(self.waiting.popleft())
        if not self.waiting:
            self.resume_reading()

    def _refuse(self, reason: bytes) -> None:
        if not self.lost:
            self.transport.write(_BAD_REQUEST + b"content-length: %d\r\n\r\n" % len(reason) + reason)
        self._close()

    def _close(self) -> None:
        self.closing = True
        if not self.lost:
            self.transport.close()


def _address(value: Any) -> tuple[str, int] | None:
    if isinstance(value, tuple) and len(value) >= 2:
        return (str(value[0]), int(value[1]))
    return None
