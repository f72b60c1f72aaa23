"""Triton's trace extension: the settings (``--trace-config``, ``v2[/models/<m>]/trace/setting``,
gRPC ``TraceSetting``) and OpenTelemetry spans of traced requests (docs/operations.md, Tracing).

* :mod:`~deployments.tracing.config`: the ``--trace-config`` flags the server starts with;
* :mod:`~deployments.tracing.store`: the global and per-model settings, Triton's rules and wording;
* :mod:`~deployments.tracing.spans`: the process's :data:`~deployments.tracing.spans.TRACER`, which
  decides which requests are traced and records their spans.

Ray-free: the server application holds the settings, its replicas learn them through
``deployments.serve`` (``TraceBoard``).
"""

from deployments.tracing.config import TraceConfig, TraceConfigError, parse_trace_config
from deployments.tracing.spans import TRACE_STEP_HEADER, TRACER, TraceParent, configure
from deployments.tracing.store import TraceSettings, TraceState, read_changes

__all__ = [
    "TRACER",
    "TRACE_STEP_HEADER",
    "TraceConfig",
    "TraceConfigError",
    "TraceParent",
    "TraceSettings",
    "TraceState",
    "configure",
    "parse_trace_config",
    "read_changes",
]
