"""Triton's trace and shared-memory extensions, as far as this server serves them: the queries.

This server does not trace requests and does not read tensors from shared memory (it does not
list ``trace``, ``system_shared_memory`` or ``cuda_shared_memory`` among its extensions). Clients
still ask, and Triton's tests and tools expect the queries to answer as Triton would when nothing is
traced or registered:

* trace settings read Triton's defaults with ``trace_level: ["OFF"]``; an update that keeps
  tracing off answers the same, one that would turn it on is refused (``UNSUPPORTED``);
* shared-memory status lists no region, unregistering succeeds (there is nothing to remove), and
  a registration fails with Triton's error for a region it cannot open, or says that regions are
  not served here when it could.

Both front ends (HTTP and gRPC) call these functions; the answers are plain data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from repository_loader.errors import InternalError, InvalidArgument, NotFound, Unsupported

TRACE_DEFAULTS: dict[str, Any] = {
    "trace_file": "",
    "trace_level": ["OFF"],
    "trace_rate": "1000",
    "trace_count": "-1",
    "log_frequency": "0",
    "trace_mode": "triton",
}
_TRACE_KEYS = frozenset(TRACE_DEFAULTS) | {"trace_config"}
SHM_FOLDER = Path("/dev/shm")


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


def shared_memory_status(kind: str, name: str = "") -> list[dict[str, Any]]:
    """The registered regions of ``kind`` ("system" or "cuda"): none can be registered here."""
    if name:
        raise NotFound(f"Unable to find {kind} shared memory region: '{name}'")
    return []


def register_system_shared_memory(name: str, key: str, offset: int, byte_size: int) -> None:
    """Triton's error for a region that cannot be opened; otherwise that regions are not served."""
    path = SHM_FOLDER / key.lstrip("/")
    if not key.strip("/") or not path.is_file():
        raise InternalError(f"Unable to open shared memory region: '{key}'")
    raise Unsupported(
        f"failed to register system shared memory region '{name}': this server does not read or "
        "write tensors in shared memory; send them in the request"
    )


def register_cuda_shared_memory(name: str) -> None:
    raise InvalidArgument(
        f"failed to register shared memory region '{name}': invalid args "
        "(this server does not read or write tensors in CUDA shared memory)"
    )


def unregister_shared_memory(name: str = "") -> None:
    """Unregister region ``name`` or all (``""``) of either kind: nothing is registered, so nothing is
    to do, and Triton answers success for a name it does not hold too."""
