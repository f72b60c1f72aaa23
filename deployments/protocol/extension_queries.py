"""Triton's trace and CUDA shared-memory extensions, as far as this server serves them: the queries.

This server does not trace requests and does not read tensors from CUDA shared memory (it does not
list ``trace`` or ``cuda_shared_memory`` among its extensions; system shared memory is served,
``deployments.protocol.shared_memory``). Clients still ask, and Triton's tests and tools expect the
queries to answer as Triton would when nothing is traced or registered:

* trace settings read Triton's defaults with ``trace_level: ["OFF"]``; an update that keeps
  tracing off answers the same, one that would turn it on is refused (``UNSUPPORTED``);
* CUDA shared-memory status lists no region, and a registration fails with Triton's error for
  arguments it cannot take (unregistering is the system regions' unregister: one namespace).

Both front ends (HTTP and gRPC) call these functions; the answers are plain data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from repository_loader.errors import InvalidArgument, NotFound, Unsupported

TRACE_DEFAULTS: dict[str, Any] = {
    "trace_file": "",
    "trace_level": ["OFF"],
    "trace_rate": "1000",
    "trace_count": "-1",
    "log_frequency": "0",
    "trace_mode": "triton",
}
_TRACE_KEYS = frozenset(TRACE_DEFAULTS) | {"trace_config"}


def trace_settings(model: str | None = None) -> dict[str, Any]:
    """The trace settings of the server (``model`` None) or of one model: tracing is off."""
    return {k: list(v) if isinstance(v, list) else v for k, v in TRACE_DEFAULTS.items()}


def update_trace_settings(model: str | None, settings: Mapping[str, Any]) -> dict[str, Any]:
    """Apply ``settings``: accepted where tracing stays off (an empty update, ``trace_level: OFF``)."""
    unknown = sorted(set(settings) - _TRACE_KEYS)
    if unknown:
        raise InvalidArgument(f"unknown trace setting(s) {unknown}")
    for key, value in settings.items():
        if value is None or value == [] or (key == "trace_level" and _levels(value) <= {"OFF"}):
            continue
        raise Unsupported(
            f"this server does not trace requests: trace setting '{key}' cannot be changed "
            "(trace_level can only be OFF)"
        )
    return trace_settings(model)


def _levels(value: Any) -> set[str]:
    items: Sequence[Any] = value if isinstance(value, list) else [value]
    return {str(v).upper() for v in items}


def cuda_shared_memory_status(name: str = "") -> list[dict[str, Any]]:
    """The registered CUDA regions: none can be registered here."""
    if name:
        raise NotFound(f"Unable to find cuda shared memory region: '{name}'")
    return []


def register_cuda_shared_memory(name: str) -> None:
    raise InvalidArgument(
        f"failed to register shared memory region '{name}': invalid args "
        "(this server does not read or write tensors in CUDA shared memory)"
    )
