"""The process's tracer: which requests are traced, and their spans, exported over OTLP/HTTP.

Every process that answers or runs requests (the server application, each model replica, each model
host) holds one :data:`TRACER`. It decides from the latest :class:`~deployments.tracing.store.TraceState`
it was given (``apply``), so a request costs one attribute read (``TRACER.active``) while no setting
traces. A traced request gets Triton's spans (``opentelemetry`` mode):

* ``InferRequest``, the root, in the process whose front end received it (``HTTP_RECV_START``,
  ``HTTP_RECV_END``, ``INFER_RESPONSE_COMPLETE``, ``HTTP_SEND_START``, ``HTTP_SEND_END``; over gRPC the
  ``GRPC_`` events); its parent is the client's W3C ``traceparent`` where one was sent;
* one span per model run, named after the model, with ``REQUEST_START``, ``QUEUE_START``,
  ``REQUEST_END`` and Triton's attributes (``triton.model_name``, ``triton.model_version``,
  ``triton.trace_id``, ``triton.trace_parent_id``, ``triton.request_id``): under the root, or under
  the span of the ensemble or BLS model whose step or call it is, in whichever replica runs it;
* ``compute`` under a (non-ensemble) model's span: ``COMPUTE_START``, ``COMPUTE_INPUT_END``,
  ``COMPUTE_OUTPUT_START``, ``COMPUTE_END``.

A request carries its place in the trace as a :class:`TraceParent` (``InferRequest.trace``): plain,
picklable, and sent to another replica as a ``traceparent`` header. Timestamps are the monotonic
clock's, shifted onto the wall clock once per process (OpenTelemetry reports wall-clock time).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from deployments.tracing.config import TraceConfig, endpoint
from deployments.tracing.store import Setting, TraceState

logger = logging.getLogger(__name__)

_WALL_OFFSET_NS = time.time_ns() - time.monotonic_ns()
TRACE_STEP_HEADER = b"x-triton-trace-step"
"""Internal header of a call between replicas: the request continues a trace started elsewhere (its
value: the Triton trace id of the caller's model span), so no root span is made for it."""

_READ_EVENTS = {"GRPC": "GRPC_WAITREAD"}  # Triton's name of the read, by protocol (HTTP: HTTP_RECV)

Take = Callable[[str], Awaitable[bool]]
"""Uses up one trace of a model's ``trace_count`` where the settings live; False when none is left."""


def wall(monotonic_ns: int) -> int:
    return monotonic_ns + _WALL_OFFSET_NS


@dataclass(frozen=True, slots=True)
class TraceParent:
    """Where a request's spans hang: the W3C trace and span id of its parent, and the parent's Triton
    trace id (``triton.trace_parent_id`` of the spans below it; 0 for the root)."""

    trace_id: int
    span_id: int
    triton_id: int = 0

    def header(self) -> str:
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-01"

    @classmethod
    def from_header(cls, text: str | bytes | None, triton_id: int = 0) -> TraceParent | None:
        """The parent a W3C ``traceparent`` names; None for a missing or malformed one."""
        if not text:
            return None
        if isinstance(text, bytes):
            text = text.decode("latin-1")
        parts = text.strip().split("-")
        if len(parts) < 4 or len(parts[1]) != 32 or len(parts[2]) != 16 or parts[0] == "ff":
            return None
        try:
            trace_id, span_id = int(parts[1], 16), int(parts[2], 16)
        except ValueError:
            return None
        return cls(trace_id, span_id, triton_id) if trace_id and span_id else None


class RootSpan:
    """The ``InferRequest`` span of a request a front end received; :meth:`finish` ends it."""

    __slots__ = ("_prefix", "_span", "parent")

    def __init__(self, span: Any, prefix: str, parent: TraceParent) -> None:
        self._span = span
        self._prefix = prefix
        self.parent = parent

    def finish(self, complete_ns: int, send_start_ns: int, send_end_ns: int) -> None:
        span = self._span
        span.add_event("INFER_RESPONSE_COMPLETE", timestamp=wall(complete_ns))
        span.add_event(f"{self._prefix}_SEND_START", timestamp=wall(send_start_ns))
        span.add_event(f"{self._prefix}_SEND_END", timestamp=wall(send_end_ns))
        span.end(end_time=wall(send_end_ns))


class ModelSpan:
    """A model's span for one request: ``parent`` is what its compute span, steps and BLS calls hang under."""

    __slots__ = ("_span", "parent")

    def __init__(self, span: Any, parent: TraceParent) -> None:
        self._span = span
        self.parent = parent

    def end(self, end_ns: int) -> None:
        self._span.add_event("REQUEST_END", timestamp=wall(end_ns))
        self._span.end(end_time=wall(end_ns))


class Tracer:
    """This process's trace decisions and spans (see the module's docstring)."""

    def __init__(self) -> None:
        self.active = False  # the one check a request pays while nothing is traced
        self.config = TraceConfig()
        self.state = TraceState()
        self.take: Take | None = None
        self._otel: Any = None
        self._provider: Any = None
        self._seen: dict[str | None, int] = {}  # requests counted for each rate (None: the global one)
        self._ids = itertools.count(1)
        self._exporter: Any = None

    def configure(self, config: TraceConfig, take: Take | None = None, exporter: Any = None) -> None:
        """Use ``config`` (the server's ``--trace-config``) from now on; ``take`` uses up counts;
        ``exporter`` (a span exporter; tests) replaces the OTLP/HTTP one."""
        self.config = config
        self.take = take
        self._exporter = exporter
        self._otel = self._provider = None
        self._seen.clear()
        self.state = TraceState(version=-1)
        self.apply(_initial_state(config))

    def apply(self, state: TraceState, force: bool = False) -> None:
        """Decide from ``state`` from now on, where it is newer than what this process holds (or
        whatever it is, with ``force``: the settings' home restarted and counts from 0 again)."""
        if state.version < self.state.version and not force:
            return
        self.state = state
        self.active = self.config.opentelemetry and state.any_on
        if self.active and self._otel is None:
            self._start_exporter()

    def _start_exporter(self) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON

        config = self.config
        provider = TracerProvider(resource=Resource.create(dict(config.resource)), sampler=ALWAYS_ON)
        provider.add_span_processor(
            BatchSpanProcessor(
                self._exporter or OTLPSpanExporter(endpoint=endpoint(config.url)),
                max_queue_size=config.bsp_max_queue_size,
                schedule_delay_millis=max(config.bsp_schedule_delay, 1),
                max_export_batch_size=config.bsp_max_export_batch_size,
            )
        )
        self._provider = provider
        self._otel = provider.get_tracer("triton-inference-server")

    async def start(
        self, model: str, traceparent: bytes | str | None, protocol: str, recv_start_ns: int
    ) -> RootSpan | None:
        """The root span of a request for ``model`` that a front end received, if it is to be traced:
        its model's level is not OFF, and it carries a ``traceparent`` (always traced, as in Triton) or
        it is the rate's n-th request and the count allows one more."""
        setting = self.state.effective(model)
        if not setting.level:
            return None
        remote = TraceParent.from_header(traceparent)
        if remote is None and not await self._sampled(model, setting.rate, setting.count):
            return None
        span = self._span("InferRequest", remote, recv_start_ns, None)
        read = _READ_EVENTS.get(protocol, f"{protocol}_RECV")
        span.add_event(f"{read}_START", timestamp=wall(recv_start_ns))
        span.add_event(f"{read}_END", timestamp=wall(time.monotonic_ns()))
        context = span.get_span_context()
        return RootSpan(span, protocol, TraceParent(context.trace_id, context.span_id))

    async def _sampled(self, model: str, rate: int, count: int) -> bool:
        if rate <= 0 or count == 0:
            return False
        owner = model if "trace_rate" in self.state.models.get(model, {}) else None
        seen = self._seen[owner] = self._seen.get(owner, 0) + 1
        if seen % rate:
            return False
        if count < 0 or self.take is None:
            return True
        try:
            return await self.take(model)
        except Exception as exc:  # the settings' home does not answer: trace nothing rather than fail
            logger.debug("trace count of '%s' not available: %s", model, exc)
            return False

    def model_span(
        self, parent: TraceParent, model: str, version: int, request_id: str, start_ns: int, queue_ns: int
    ) -> ModelSpan:
        """The span of ``model`` running a traced request (``REQUEST_START``, ``QUEUE_START``)."""
        triton_id = next(self._ids)
        attributes: dict[str, Any] = {
            "triton.model_name": model,
            "triton.model_version": int(version),
            "triton.trace_id": triton_id,
            "triton.trace_parent_id": parent.triton_id,
        }
        if request_id:
            attributes["triton.request_id"] = request_id
        span = self._span(model, parent, start_ns, attributes)
        span.add_event("REQUEST_START", timestamp=wall(start_ns))
        span.add_event("QUEUE_START", timestamp=wall(queue_ns))
        context = span.get_span_context()
        return ModelSpan(span, TraceParent(context.trace_id, context.span_id, triton_id))

    def compute_span(
        self, parent: TraceParent, start_ns: int, input_end_ns: int, output_start_ns: int, end_ns: int
    ) -> None:
        """The ``compute`` span of one traced request of a batch, after the batch ran."""
        span = self._span("compute", parent, start_ns, None)
        for name, at in (
            ("COMPUTE_START", start_ns),
            ("COMPUTE_INPUT_END", input_end_ns),
            ("COMPUTE_OUTPUT_START", output_start_ns),
            ("COMPUTE_END", end_ns),
        ):
            span.add_event(name, timestamp=wall(at))
        span.end(end_time=wall(end_ns))

    def _span(
        self, name: str, parent: TraceParent | None, start_ns: int, attributes: dict[str, Any] | None
    ) -> Any:
        if self._otel is None:
            self._start_exporter()
        context = None
        if parent is not None:
            from opentelemetry import trace
            from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

            remote = SpanContext(parent.trace_id, parent.span_id, is_remote=True, trace_flags=TraceFlags(1))
            context = trace.set_span_in_context(NonRecordingSpan(remote))
        return self._otel.start_span(name, context=context, attributes=attributes, start_time=wall(start_ns))

    def flush(self, timeout_ms: int = 5000) -> bool:
        """Export what is queued now (tests, shutdown); True when it went."""
        return bool(self._provider.force_flush(timeout_ms)) if self._provider is not None else True


def _initial_state(config: TraceConfig) -> TraceState:
    return TraceState(
        version=0, defaults=Setting(config.level, config.rate, config.count, config.log_frequency)
    )


TRACER = Tracer()
"""This process's tracer (configured from ``ServerSettings.trace`` where the process starts)."""


def configure(config: TraceConfig, take: Take | None = None) -> None:
    """Configure this process's :data:`TRACER`. Serve deployments call this function rather than
    ``TRACER.configure``: a deployment class may travel by value, and the object it names would be
    a copy of the tracer, not the one the process's front ends read."""
    TRACER.configure(config, take)


__all__ = [
    "TRACER",
    "TRACE_STEP_HEADER",
    "ModelSpan",
    "RootSpan",
    "TraceParent",
    "Tracer",
    "configure",
    "wall",
]
