"""A lean HTTP/1.1 client on asyncio streams, one keep-alive connection per in-flight request.

The load generator must cost the client machine as little as possible (the server under test shares
the cores), so requests are pre-encoded bytes written in one call, and responses are read by
``Content-Length`` (or chunked) without decoding their body unless asked.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any


class HttpError(Exception):
    """A request failed: connection trouble or a non-2xx status (with the server's message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


@dataclass(frozen=True)
class Response:
    """Status, lower-cased headers and body of one response."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON (the JSON header part for binary-extension responses)."""
        size = self.headers.get("inference-header-content-length")
        return json.loads(self.body[: int(size)] if size else self.body)


def encode_request(
    method: str, host: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> bytes:
    """The bytes of one HTTP/1.1 request with a keep-alive connection."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class Connection:
    """One persistent connection to ``host:port``; reconnects after the server closes it."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None or self._writer.is_closing():
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        return self._reader, self._writer

    async def send(self, raw_request: bytes) -> Response:
        """Send pre-encoded request bytes and read the whole response."""
        reader, writer = await self._open()
        try:
            writer.write(raw_request)
            return await self._read_response(reader)
        except (ConnectionError, asyncio.IncompleteReadError):
            self.close()
            raise

    async def _read_response(self, reader: asyncio.StreamReader) -> Response:
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        status = int(status_line.split(" ", 2)[1])
        headers: dict[str, str] = {}
        for line in header_lines:
            if ":" in line:
                key, _, value = line.partition(":")
                headers[key.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = await _read_chunked(reader)
        else:
            body = await reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            self.close()
        return Response(status, headers, body)

    def close(self) -> None:
        """Close the socket (the next send reconnects)."""
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    """The body of a chunked response."""
    parts: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


def split_url(url: str) -> tuple[str, int]:
    """``(host, port)`` of ``host:port`` or ``http://host:port``."""
    url = url.removeprefix("http://").rstrip("/")
    host, _, port = url.partition(":")
    return host or "localhost", int(port or 80)


async def get_json(url: str, path: str, timeout: float = 10.0) -> Any:
    """GET ``path`` on ``url`` and return its JSON body; raises ``HttpError`` on a non-200 status."""
    host, port = split_url(url)
    conn = Connection(host, port)
    try:
        resp = await asyncio.wait_for(conn.send(encode_request("GET", f"{host}:{port}", path)), timeout)
    finally:
        conn.close()
    if resp.status != 200:
        raise HttpError(resp.status, resp.body.decode(errors="replace")[:500])
    return resp.json()
