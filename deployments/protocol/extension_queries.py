"""Triton's CUDA shared-memory extension, as far as this server serves it: the queries.

This server does not read tensors from CUDA shared memory (it does not list ``cuda_shared_memory``
among its extensions; system shared memory is served, ``deployments.protocol.shared_memory``, and
tracing by ``deployments.tracing``). Clients still ask, and Triton's tests and tools expect the
queries to answer as Triton would when nothing is registered: CUDA shared-memory status lists no
region, and a registration fails with Triton's error for arguments it cannot take (unregistering is
the system regions' unregister: one namespace).

Both front ends (HTTP and gRPC) call these functions; the answers are plain data.
"""

from __future__ import annotations

from typing import Any

from repository_loader.errors import InvalidArgument, NotFound


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
