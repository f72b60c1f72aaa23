"""One socket write per small HTTP response in the replica's HTTP server.

Serve's direct ingress runs uvicorn with its httptools protocol, which writes a
response's status line and headers as soon as ``http.response.start`` arrives
and the body with ``http.response.body``: two ``send`` calls per response. On
a loopback hop to HAProxy each send also wakes the reader, so a trivial
model's replica spent more than a third of its time in those two calls. Holding
the head back and writing it together with the first body chunk halves that
(perf_analyzer: +15-20% throughput on a trivial model, bench/results/overhead).

:func:`coalesce_response_writes` installs this on uvicorn's request-response
cycle class (reached through ``deployments.serve.hooks``), once per process. It changes when bytes are written, never which:
a response whose body never comes still gets its head written when the cycle
ends the way it would have (the next ``send``), and every other protocol path
is uvicorn's own. Where uvicorn's httptools protocol is missing or looks
different from what this expects, nothing is changed.

The same ``send`` adds ASGI's HTTP trailers extension, which uvicorn lacks: a
response started with ``"trailers": True`` is written chunked and ends with the
fields of its ``http.response.trailers`` message in the last chunk
(``0\r\n<name>: <value>\r\n\r\n``) instead of the bare terminator; the head, body and
trailers of such a response leave in one write, unless its start message says it is streamed
(``grpc_http1.STREAMED_RESPONSE``: a gRPC stream's answers), where each body message leaves as it
comes (the head with the first). What is held back is kept as the parts uvicorn
wrote and handed to the transport's ``writelines`` (a vectored write on uvloop), never joined here:
a large response was copied several times on its way out before. gRPC's
status travels there when HAProxy hands a gRPC call to a replica over HTTP/1.1
(``deployments.protocol.grpc_http1``). :func:`sends_trailers` says whether it is
in place; the replica's ingress then advertises the extension in the scope.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from deployments.protocol.http1_server import STREAMED_RESPONSE
from deployments.serve import hooks

logger = logging.getLogger(__name__)

_MARK = "_triton_serve_coalesced"
TRAILERS = "http.response.trailers"
_LAST_CHUNK = b"0\r\n\r\n"


class _HeldWrites:
    """Stands in for a connection's transport: keeps what is written instead of sending it."""

    __slots__ = ("transport", "held")

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.held: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.held.append(bytes(data))  # no copy of bytes, the common case

    def writelines(self, parts: Iterable[bytes]) -> None:
        self.held.extend(bytes(part) for part in parts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


class _PrefixedWrites:
    """Stands in for a connection's transport: the first write carries the ``head`` parts in front of
    it, handed on as parts (``writelines``: one system call, no bytes joined on uvloop)."""

    __slots__ = ("transport", "head")

    def __init__(self, transport: Any, head: list[bytes]) -> None:
        self.transport = transport
        self.head: list[bytes] | None = head

    def write(self, data: bytes) -> None:
        self.writelines([data])

    def writelines(self, parts: Iterable[bytes]) -> None:
        if self.head is not None:
            parts, self.head = [*self.head, *parts], None
        self.transport.writelines(parts)

    def flush(self) -> None:
        if self.head is not None:
            head, self.head = self.head, None
            self.transport.writelines(head)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


class _TrailedWrites:
    """Stands in for a connection's transport: the chunked body's terminator carries ``fields``."""

    __slots__ = ("transport", "fields")

    def __init__(self, transport: Any, fields: bytes) -> None:
        self.transport = transport
        self.fields = fields

    def write(self, data: bytes) -> None:
        self.writelines([data])

    def writelines(self, parts: Iterable[bytes]) -> None:
        parts = list(parts)
        if parts and parts[-1].endswith(_LAST_CHUNK):  # the terminator comes alone: a small part
            parts[-1] = parts[-1][: -len(_LAST_CHUNK)] + b"0\r\n" + self.fields + b"\r\n"
        self.transport.writelines(parts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


def _trailer_fields(cycle: Any, message: dict[str, Any]) -> bytes | None:
    """The trailer lines of ``message`` (an ``http.response.trailers``) once the last one arrived, else
    None; kept on ``cycle`` between messages."""
    held: list[bytes] = cycle.__dict__.setdefault("_trailer_lines", [])
    for name, value in message.get("headers", ()):
        if any(c in name + value for c in (b"\r", b"\n", b"\0")) or b":" in name:
            raise RuntimeError("Invalid HTTP trailer.")
        held.append(bytes(name).lower() + b": " + bytes(value) + b"\r\n")
    if message.get("more_trailers", False):
        return None
    del cycle.__dict__["_trailer_lines"]
    return b"".join(held)


Send = Callable[[Any, dict[str, Any]], Awaitable[None]]


def coalesced(send: Send) -> Send:
    """Wrap a request-response cycle's ``send`` so that the head goes out with the first body chunk."""

    async def send_coalesced(cycle: Any, message: dict[str, Any]) -> None:
        kind = message.get("type")
        fields: bytes | None = None
        if kind == "http.response.start" and message.get("trailers"):
            cycle._trailers_due = True
            cycle._streamed = bool(message.get(STREAMED_RESPONSE))
        elif kind == "http.response.body" and cycle.__dict__.get("_trailers_due"):
            if cycle._streamed:  # each part leaves as it comes; the trailers end the body
                if not message.get("body"):
                    return
                message = {**message, "more_body": True}
            else:
                # the response ends with its trailers: its body is held and leaves with them, in one write
                transport = cycle.transport
                holder = _HeldWrites(transport)
                cycle.transport = holder
                try:
                    await send(cycle, {**message, "more_body": True})
                finally:
                    cycle.transport = transport
                cycle._held_head = [
                    *cycle.__dict__.pop("_held_head", ()),
                    *holder.held,
                ]  # parts, never joined
                return
        elif kind == TRAILERS and cycle.__dict__.get("_trailers_due"):
            if not cycle.chunked_encoding:
                raise RuntimeError("HTTP trailers need a chunked response (no content-length)")
            fields = _trailer_fields(cycle, message)
            if fields is None:
                return
            del cycle.__dict__["_trailers_due"]
            message = {"type": "http.response.body", "body": b"", "more_body": False}
        head: list[bytes] | None = cycle.__dict__.pop("_held_head", None)
        if head is None and kind == "http.response.start" and not cycle.response_started:
            transport = cycle.transport
            holder = _HeldWrites(transport)
            cycle.transport = holder
            try:
                await send(cycle, message)
            finally:
                cycle.transport = transport
            if holder.held:
                cycle._held_head = holder.held
            return
        if head is None and fields is None:
            await send(cycle, message)
            return
        transport = cycle.transport
        written: Any = transport if fields is None else _TrailedWrites(transport, fields)
        prefixed = None if head is None else _PrefixedWrites(written, head)
        cycle.transport = written if prefixed is None else prefixed
        try:
            await send(cycle, message)
        finally:
            cycle.transport = transport
            if prefixed is not None:
                prefixed.flush()

    send_coalesced.__wrapped__ = send  # type: ignore[attr-defined]
    return send_coalesced


_installed = False  # once true, for the process's life: the wrapper is never taken off


def sends_trailers() -> bool:
    """Whether uvicorn's httptools server writes ASGI's HTTP trailers in this process (asked per gRPC
    call: a yes is remembered)."""
    global _installed
    if not _installed:
        cycle: Any = hooks.uvicorn_cycle()
        _installed = cycle is not None and bool(getattr(cycle, _MARK, False))
    return _installed


def coalesce_response_writes() -> bool:
    """Install the coalescing (and trailer-writing) ``send`` on uvicorn's httptools cycle; True when it
    is in place."""
    cycle: Any = hooks.uvicorn_cycle()
    if cycle is None:
        return False
    if getattr(cycle, _MARK, False):
        return True
    cycle.send = coalesced(cycle.send)
    setattr(cycle, _MARK, True)
    logger.debug("uvicorn responses: head and first body chunk in one write")
    return True
