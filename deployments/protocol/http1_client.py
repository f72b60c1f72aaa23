"""A lean HTTP/1.1 client for calls between replicas of one node, over their local sockets.

A replica calls another replica for a sequence's owner, an ensemble step on its own replicas or a
pooled model (``deployments.serve.peers``). Over TCP that call goes through aiohttp to the other
replica's uvicorn port. On the same node the other replica also listens on its local socket
(``deployments.serve.local_sockets``), served by this server's own HTTP/1.1 protocol and its busy
poll, as HAProxy's connections are; this client speaks to it there:

- one request at a time per connection, kept alive and reused (a pool per socket name);
- the request in one write, with ``content-length``;
- a response by length or chunked, read with httptools' parser (the one the server side uses).

Anything that is not a whole response (the peer closed, reset, or sent what does not parse) raises
:class:`PeerClosed` and the connection is dropped; what a caller does then (try TCP, read the
address again) is the caller's.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Mapping

import httptools

Header = tuple[bytes, bytes]
Reply = tuple[int, list[Header], bytes]

READ_SIZE = 256 * 1024


class PeerClosed(ConnectionError):
    """The connection ended, or carried something else, before a whole response."""


class _Response:
    """httptools' callbacks for one response."""

    def __init__(self) -> None:
        self.headers: list[Header] = []
        self.body: list[bytes] = []
        self.complete = False
        self.keep_alive = False
        self.parser: httptools.HttpResponseParser | None = None

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        # read here: once the message is complete the parser has begun the next one
        self.keep_alive = self.parser is not None and self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


class Http1Connection:
    """One keep-alive HTTP/1.1 connection to a peer's stream socket."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.reusable = True

    @classmethod
    async def open_unix(cls, address: bytes | str) -> Http1Connection:
        """A connection to the Unix socket ``address`` (an abstract name starts with a NUL)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, address)
            reader, writer = await asyncio.open_connection(sock=sock, limit=READ_SIZE)
        except BaseException:
            sock.close()
            raise
        return cls(reader, writer)

    async def request(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Reply:
        """Send one request and read its whole response: (status, headers lower-cased, body)."""
        head = [f"{method} {path} HTTP/1.1\r\nhost: localhost\r\ncontent-length: {len(body)}\r\n".encode()]
        for name, value in headers.items():
            if name.lower() not in ("host", "content-length", "transfer-encoding", "connection"):
                head.append(f"{name}: {value}\r\n".encode("latin-1"))
        head.append(b"\r\n")
        self.reusable = False  # until the whole response is read
        try:
            self.writer.writelines([*head, body] if body else head)
            await self.writer.drain()
            response = _Response()
            parser = response.parser = httptools.HttpResponseParser(response)
            while not response.complete:
                data = await self.reader.read(READ_SIZE)
                if not data:
                    raise PeerClosed("the peer closed the connection before a whole response")
                parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.close()
            raise PeerClosed(f"the peer's response did not parse: {exc}") from exc
        except (ConnectionError, OSError) as exc:
            self.close()
            raise PeerClosed(str(exc) or type(exc).__name__) from exc
        self.reusable = response.keep_alive and not self.reader.at_eof()
        return parser.get_status_code(), response.headers, b"".join(response.body)

    def close(self) -> None:
        self.reusable = False
        self.writer.close()


class Http1Pool:
    """Idle keep-alive connections per Unix socket address, opened as needed; no limit on how many
    are open at once (as aiohttp's session between replicas has none)."""

    def __init__(self, max_idle: int = 64) -> None:
        self.max_idle = max_idle
        self._idle: dict[bytes | str, list[Http1Connection]] = {}

    async def request(
        self, address: bytes | str, method: str, path: str, headers: Mapping[str, str], body: bytes
    ) -> Reply:
        """One request on an idle connection to ``address`` or a new one. A connection that cannot be
        made raises ``OSError``; one that ends before a whole response, :class:`PeerClosed`."""
        connection = self._idle_connection(address) or await Http1Connection.open_unix(address)
        try:
            reply = await connection.request(method, path, headers, body)
        except BaseException:
            connection.close()  # cancelled mid-response included: what is left of it must not be read
            raise
        if connection.reusable:
            idle = self._idle.setdefault(address, [])
            if len(idle) < self.max_idle:
                idle.append(connection)
                return reply
        connection.close()
        return reply

    def _idle_connection(self, address: bytes | str) -> Http1Connection | None:
        """The latest idle connection to ``address`` that its peer has not closed meanwhile (one
        closed while idle, by a peer that restarted, is dropped here rather than failing a request)."""
        idle = self._idle.get(address)
        while idle:
            connection = idle.pop()
            if not connection.reader.at_eof() and not connection.writer.is_closing():
                return connection
            connection.close()
        return None

    def forget(self, address: bytes | str) -> None:
        """Close the idle connections to ``address`` (its peer is gone)."""
        for connection in self._idle.pop(address, []):
            connection.close()

    def close(self) -> None:
        for address in list(self._idle):
            self.forget(address)
