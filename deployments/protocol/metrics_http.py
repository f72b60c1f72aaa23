"""Triton's metrics endpoint: ``GET /metrics`` on its own port (tritonserver's ``--metrics-port``, 8002).

A small HTTP/1.1 listener on the event loop of the process that renders the text (the server
application's replica); it answers ``/metrics`` with Prometheus text format 0.0.4, every other
path with 404, keeps connections alive between scrapes, and binds only the address it is given.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable

logger = logging.getLogger(__name__)

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
MAX_HEADER_BYTES = 64 * 1024

Render = Callable[[], Awaitable[str]]


def bind(host: str, port: int) -> socket.socket:
    """The listening socket on ``host:port`` (port 0: any free port); raises ``OSError`` when the port is
    taken, so a misconfigured server fails at start rather than later on the event loop."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


async def start_metrics_server(sock: socket.socket, render: Render) -> asyncio.Server:
    """Answer scrapes on ``sock`` (from :func:`bind`); ``render`` gives the text of each scrape."""

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await _answer(reader, writer, render):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(connection, sock=sock, limit=MAX_HEADER_BYTES)


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, render: Render) -> bool:
    """Answer one request; False when the connection is to close."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        await _reply(writer, 400, b"text/plain", b"bad request\n", keep_alive=False)
        return False
    method, target, version = parts
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)
    }
    length = int(headers.get("content-length", "0") or 0)
    if length:
        await reader.readexactly(length)
    keep_alive = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
    path = target.split("?", 1)[0].rstrip("/")
    if path != "/metrics":
        await _reply(writer, 404, b"text/plain", b"not found\n", keep_alive)
    elif method not in ("GET", "HEAD"):
        await _reply(writer, 405, b"text/plain", b"method not allowed\n", keep_alive)
    else:
        try:
            body = (await render()).encode()
        except Exception as exc:  # a failed scrape must not end the listener
            logger.warning("metrics unavailable: %s", exc)
            await _reply(writer, 500, b"text/plain", f"metrics unavailable: {exc}\n".encode(), keep_alive)
            return keep_alive
        await _reply(writer, 200, CONTENT_TYPE, b"" if method == "HEAD" else body, keep_alive, len(body))
    return keep_alive


async def _reply(
    writer: asyncio.StreamWriter,
    status: int,
    content_type: bytes,
    body: bytes,
    keep_alive: bool,
    length: int | None = None,
) -> None:
    reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed"}.get(
        status, b"Internal Server Error"
    )
    head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: %s\r\n\r\n" % (
        status,
        reason,
        content_type,
        len(body) if length is None else length,
        b"keep-alive" if keep_alive else b"close",
    )
    writer.write(head + body)
    await writer.drain()
