"""Triton's response cache (``local``): results of earlier requests, answered without running the model.

A model opts in with ``response_cache { enable: true }`` and the server with
``cache_config: local,size=<bytes>`` (Triton's ``--cache-config``). One cache
serves every model of a replica process, as Triton's local cache serves every
model of its server; its entries hold at most ``size`` bytes of memory (each
output's data, its array header and its name: Triton's size bounds its buffer,
bookkeeping included, so a 200-byte cache keeps no response of two 64-byte
outputs there either), and it drops the least recently used entries to make room.

The key is what Triton's documentation names: the model, its version and every
input (name, data type, shape and bytes); the names of the requested outputs
are added, so a request for fewer outputs never reads a fuller answer. Only
host inputs are hashed and only successful responses with host outputs are
kept (Triton's limitations too); sequence and decoupled models cannot enable
the cache (validation refuses them).
"""

from __future__ import annotations

import hashlib
import logging
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from deployments import tensors
from deployments.inference import InferRequest, InferResponse

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CachedResponse:
    """The outputs and parameters of one successful response, read-only copies on the host."""

    outputs: dict[str, np.ndarray]
    parameters: dict[str, Any]
    nbytes: int


def _held_bytes(name: str, array: np.ndarray) -> int:
    """The memory one kept output holds: its name, the copy's header and data, and for BYTES each
    element object (``array`` owns its data, so ``getsizeof`` counts it)."""
    held = len(name) + sys.getsizeof(array)
    if array.dtype == np.object_:
        held += sum(sys.getsizeof(x) for x in array.reshape(-1))
    return held


def _frozen_copy(array: np.ndarray) -> np.ndarray:
    copy = np.array(array, copy=True)
    copy.flags.writeable = False
    return copy


class ResponseCache:
    """A least-recently-used map from request keys to responses, bounded by ``size`` bytes."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.used = 0
        self._entries: OrderedDict[bytes, CachedResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def key(request: InferRequest, model: str, version: int) -> bytes | None:
        """The request's hash, or None where it cannot be hashed (an input in device memory)."""
        digest = hashlib.blake2b(digest_size=16)
        digest.update(f"{model}\0{version}\0".encode())
        for name in sorted(request.inputs):
            data = request.inputs[name]
            if not tensors.is_host(data):
                return None
            array = tensors.to_numpy(data)
            datatype = tensors.wire_datatype(array)
            digest.update(f"{name}\0{datatype}\0{array.shape}\0".encode())
            if array.dtype == np.object_:
                for item in array.reshape(-1):
                    raw = item if isinstance(item, bytes) else str(item).encode()
                    digest.update(len(raw).to_bytes(8, "little"))
                    digest.update(raw)
            else:
                digest.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)
        if request.requested_outputs is not None:
            digest.update("\0".join(sorted(o.name for o in request.requested_outputs)).encode())
        return digest.digest()

    def get(self, key: bytes) -> CachedResponse | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: bytes, response: InferResponse) -> bool:
        """Keep ``response`` under ``key``; False where it cannot be kept (device outputs, too large)."""
        if response.error is not None or key in self._entries:
            return False
        if not all(tensors.is_host(t) for t in response.outputs.values()):
            return False
        outputs = {name: _frozen_copy(tensors.to_numpy(t)) for name, t in response.outputs.items()}
        nbytes = sum(_held_bytes(name, a) for name, a in outputs.items())
        if nbytes > self.size:
            logger.error(
                "Failed to insert key into the response cache: the response holds %d bytes, the cache %d",
                nbytes,
                self.size,
            )
            return False
        while self.used + nbytes > self.size:
            _, dropped = self._entries.popitem(last=False)
            self.used -= dropped.nbytes
        self._entries[key] = CachedResponse(outputs, dict(response.parameters), nbytes)
        self.used += nbytes
        return True


_process_cache: ResponseCache | None = None


def configure(size: int | None) -> ResponseCache | None:
    """Set this process's cache (``None`` or 0: no cache); a cache of the same size is kept as it is."""
    global _process_cache
    if not size:
        _process_cache = None
    elif _process_cache is None or _process_cache.size != size:
        _process_cache = ResponseCache(size)
    return _process_cache


def current() -> ResponseCache | None:
    """This process's cache, if the server configured one."""
    return _process_cache
