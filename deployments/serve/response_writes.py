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
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from deployments.serve import hooks

logger = logging.getLogger(__name__)

_MARK = "_triton_serve_coalesced"


class _HeldWrites:
    """Stands in for a connection's transport: keeps what is written instead of sending it."""

    __slots__ = ("transport", "held")

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.held: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.held.append(bytes(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


class _PrefixedWrites:
    """Stands in for a connection's transport: the first write carries ``head`` in front of it."""

    __slots__ = ("transport", "head")

    def __init__(self, transport: Any, head: bytes) -> None:
        self.transport = transport
        self.head: bytes | None = head

    def write(self, data: bytes) -> None:
        if self.head is not None:
            data, self.head = self.head + data, None
        self.transport.write(data)

    def flush(self) -> None:
        if self.head is not None:
            head, self.head = self.head, None
            self.transport.write(head)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


Send = Callable[[Any, dict[str, Any]], Awaitable[None]]


def coalesced(send: Send) -> Send:
    """Wrap a request-response cycle's ``send`` so that the head goes out with the first body chunk."""

    async def send_coalesced(cycle: Any, message: dict[str, Any]) -> None:
        head: bytes | None = cycle.__dict__.pop("_held_head", None)
        if head is None and message.get("type") == "http.response.start" and not cycle.response_started:
            transport = cycle.transport
            holder = _HeldWrites(transport)
            cycle.transport = holder
            try:
                await send(cycle, message)
            finally:
                cycle.transport = transport
            if holder.held:
                cycle._held_head = b"".join(holder.held)
            return
        if head is None:
            await send(cycle, message)
            return
        transport = cycle.transport
        prefixed = _PrefixedWrites(transport, head)
        cycle.transport = prefixed
        try:
            await send(cycle, message)
        finally:
            cycle.transport = transport
            prefixed.flush()

    send_coalesced.__wrapped__ = send  # type: ignore[attr-defined]
    return send_coalesced


def coalesce_response_writes() -> bool:
    """Install the coalescing ``send`` on uvicorn's httptools cycle; True when it is in place."""
    cycle: Any = hooks.uvicorn_cycle()
    if cycle is None:
        return False
    if getattr(cycle, _MARK, False):
        return True
    cycle.send = coalesced(cycle.send)
    setattr(cycle, _MARK, True)
    logger.debug("uvicorn responses: head and first body chunk in one write")
    return True
