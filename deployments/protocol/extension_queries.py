"""Triton's shared-memory extensions, as far as this server serves them: the queries.

This server does not read tensors from shared memory (it does not list ``system_shared_memory`` or
``cuda_shared_memory`` among its extensions). Clients still ask, and Triton's tests and tools expect
the queries to answer as Triton would when nothing is registered:

* shared-memory status lists no region, unregistering succeeds (there is nothing to remove), and
  a registration fails with Triton's error for a region it cannot open, or says that regions are
  not served here when it could.

Both front ends (HTTP and gRPC) call these functions; the answers are plain data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from repository_loader.errors import InternalError, InvalidArgument, NotFound, Unsupported

SHM_FOLDER = Path("/dev/shm")


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
