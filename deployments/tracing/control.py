"""Where a process reads and changes the trace settings: :class:`TraceControl`.

The server application holds the settings (:class:`LocalTraces` over its
:class:`~deployments.tracing.store.TraceSettings`); a model replica asks it (``deployments.serve``'s
``RemoteTraces``). Either way the front end has already read the request's changes with Triton's
rules (:func:`~deployments.tracing.store.read_changes`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from deployments.tracing.config import TraceConfig
from deployments.tracing.spans import TRACER, Tracer
from deployments.tracing.store import TraceSettings, TraceState


class TraceControl(Protocol):
    async def settings(self, model: str | None) -> dict[str, Any]:
        """Triton's trace setting document, global (None) or of ``model``."""
        ...

    async def update(self, model: str | None, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Apply ``changes`` (key -> value, None clears); the document after them."""
        ...


Changed = Callable[[TraceState, bool], Awaitable[None]]
"""Told of every change: the new state, and whether the change must settle everywhere before the
answer (an API change: True; a trace using up ``trace_count``: False)."""


class LocalTraces:
    """The settings themselves, in this process; every change reaches this process's tracer and
    ``changed`` (the server application: its replicas, ``deployments.serve.app.TraceBoard``)."""

    def __init__(
        self, config: TraceConfig | None = None, tracer: Tracer = TRACER, changed: Changed | None = None
    ) -> None:
        self.store = TraceSettings(config or TraceConfig())
        self.tracer = tracer
        self.changed = changed

    @property
    def state(self) -> TraceState:
        return self.store.state

    async def settings(self, model: str | None) -> dict[str, Any]:
        return self.store.document(model)

    async def update(self, model: str | None, changes: Mapping[str, Any]) -> dict[str, Any]:
        document = self.store.update(model, changes)
        if changes:
            await self._publish(settle=True)
        return document

    async def take(self, model: str) -> bool:
        """Use up one trace of ``model``'s ``trace_count`` (``Tracer.take``)."""
        taken = self.store.take(model)
        if taken and self.store.state.effective(model).count >= 0:
            await self._publish(settle=False)
        return taken

    async def _publish(self, settle: bool) -> None:
        self.tracer.apply(self.store.state)
        if self.changed is not None:
            await self.changed(self.store.state, settle)


__all__ = ["LocalTraces", "TraceControl"]
