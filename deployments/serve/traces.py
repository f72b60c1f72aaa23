"""How the trace settings reach every replica: the server application publishes, replicas long-poll.

The server application holds the settings (``deployments.tracing.control.LocalTraces``). Every model
replica and model host replica follows them (:func:`follow_traces`): it asks the server for the
settings newer than the version it holds (``ServerDeployment.trace_state``, a long poll of
``POLL_S``), applies what comes back to its tracer, and asks again at once, which also tells the
server it has that version. A change made through the API answers only once every replica that
follows has asked again with the new version (at most ``ACK_TIMEOUT_S``; a replica that stopped
asking is not waited for), so a request sent after the answer is traced by the new settings,
whichever replica it reaches. A trace that uses up ``trace_count`` publishes without that wait.

A replica reads and changes the settings through the server (:class:`RemoteTraces`), so every front
end answers the same document.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from deployments.runtime.broadcast import Broadcast
from deployments.serve.server_api import ServerClient
from deployments.tracing import TRACER
from deployments.tracing.spans import Tracer
from deployments.tracing.store import TraceState

logger = logging.getLogger("ray.serve")

POLL_S = 30.0  # how long one long poll waits for a change
ACK_TIMEOUT_S = 2.0  # how long a change waits for the replicas to take it up
FORGET_S = POLL_S + 30.0  # a replica that has not asked for this long has stopped following


class TraceBoard:
    """The server side: the current settings, and which version each following replica holds."""

    def __init__(self, ack_timeout_s: float = ACK_TIMEOUT_S) -> None:
        self.state = TraceState()
        self._ack_timeout_s = ack_timeout_s
        self._changes = Broadcast()  # wakes every waiter (any thread) on every change
        self._asks = Broadcast()  # wakes :meth:`_settled` whenever a replica asks
        self._held: dict[str, tuple[int, float]] = {}  # replica -> (version it holds, when it asked)
        self._waiting: dict[str, int] = {}  # replicas inside a long poll -> how many polls

    async def publish(self, state: TraceState, settle: bool) -> None:
        """Make ``state`` current; with ``settle``, return once the following replicas hold it."""
        self.state = state
        self._changes.notify()
        if settle:
            await self._settled(state.version)

    async def wait(self, replica: str, seen: int, timeout_s: float) -> TraceState | None:
        """``replica``'s long poll: the settings once their version differs from ``seen``, None after
        ``timeout_s`` without a change."""
        self._held[replica] = (seen, time.monotonic())
        self._asks.notify()
        if self.state.version != seen:
            return self.state
        self._waiting[replica] = self._waiting.get(replica, 0) + 1
        try:
            if not await self._changes.until(lambda: self.state.version != seen, timeout_s):
                return None
            return self.state
        finally:
            left = self._waiting[replica] - 1
            if left:
                self._waiting[replica] = left
            else:
                self._waiting.pop(replica)

    def _behind(self, version: int) -> list[str]:
        now = time.monotonic()
        for replica, (_, when) in list(self._held.items()):
            if replica not in self._waiting and now - when > FORGET_S:
                del self._held[replica]
        return [
            replica
            for replica, (held, when) in self._held.items()
            if held != version and (replica in self._waiting or now - when < self._ack_timeout_s)
        ]

    async def _settled(self, version: int) -> None:
        if not await self._asks.until(lambda: not self._behind(version), self._ack_timeout_s):
            logger.warning(
                "trace settings: replicas %s did not take up version %d", self._behind(version), version
            )


class RemoteTraces:
    """A replica's :class:`~deployments.tracing.control.TraceControl`: the server application's settings."""

    def __init__(self, server: ServerClient) -> None:
        self.server = server

    async def settings(self, model: str | None) -> dict[str, Any]:
        return await self.server.trace_settings(model)

    async def update(self, model: str | None, changes: Mapping[str, Any]) -> dict[str, Any]:
        return await self.server.trace_update(model, dict(changes))

    async def take(self, model: str) -> bool:
        return await self.server.trace_take(model)


async def follow_traces(server: ServerClient, replica: str, tracer: Tracer = TRACER) -> None:
    """A replica's loop: hold the server's trace settings, applying each change as it comes."""
    failing = False
    while True:
        try:
            state = await server.trace_state(replica, tracer.state.version, POLL_S)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the server is starting or restarting: ask again soon
            (logger.debug if failing else logger.warning)("trace settings not available: %r", exc)
            failing = True
            await asyncio.sleep(1.0)
            continue
        failing = False
        if state is not None:
            tracer.apply(state, force=True)


__all__ = ["ACK_TIMEOUT_S", "POLL_S", "RemoteTraces", "TraceBoard", "follow_traces"]
