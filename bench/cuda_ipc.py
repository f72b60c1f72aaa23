"""CUDA IPC hand-off between processes on one node: the experiment behind ``Route.CUDA_IPC``.

Serving hands tensors on in process (:func:`deployments.tensors.as_framework`)
or through the object store; this module is what a cross-process GPU hand-off
would use, kept beside the pipeline benchmark (``bench/gpu_pipeline.py``) and
tested in ``tests/ensembles/test_handoff.py``:

- :class:`HandoffPolicy` chooses the :class:`ensembles.handoff.Route` for a
  producer and a consumer :class:`Location`;
- :func:`export_tensor` makes the payload the producer sends on: the tensor
  itself in process, a host array for the object store, or a CUDA IPC handle
  (:class:`IpcRegistry` keeps the producer's buffer alive until the consumer
  releases it);
- :func:`open_payload` gives the consumer its tensor (a CUDA IPC payload maps
  the producer's device memory).
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from deployments.tensors import Tensor, as_framework, to_numpy, to_torch
from ensembles.handoff import Route
from repository_loader.errors import InternalError, Unsupported


@dataclass(frozen=True)
class Location:
    """Where a step runs: the node, the process (replica) and the device of its tensors."""

    node: str
    process: str
    device: str = "cpu"  # "cpu" or "cuda:<index>"

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")


class HandoffPolicy:
    """Chooses the route for a tensor going from a producer to a consumer."""

    def route(self, producer: Location, consumer: Location) -> Route:
        if producer.node == consumer.node and producer.process == consumer.process:
            return Route.IN_PROCESS
        if producer.node == consumer.node and producer.on_gpu and consumer.on_gpu:
            return Route.CUDA_IPC
        return Route.HOST


@dataclass(frozen=True)
class InProcessPayload:
    """The producer's own array object."""

    tensor: Tensor


@dataclass(frozen=True)
class HostPayload:
    """A host array, for the object store."""

    array: np.ndarray


@dataclass(frozen=True)
class CudaIpcPayload:
    """A CUDA IPC handle to a producer's device tensor; carries no tensor bytes."""

    key: int
    owner: str  # the exporting process, to which the release goes
    rebuild: Any  # torch's rebuild function
    args: tuple[Any, ...]
    nbytes: int


Payload = InProcessPayload | HostPayload | CudaIpcPayload


class IpcRegistry:
    """The producer's side of CUDA IPC: keeps exported tensors alive until released."""

    def __init__(self, owner: str = "") -> None:
        self.owner = owner
        self._alive: dict[int, Tensor] = {}
        self._keys = itertools.count(1)
        self._lock = threading.Lock()

    def export(self, tensor: Tensor) -> CudaIpcPayload:
        """A handle the consumer opens with :func:`open_payload`."""
        from torch.multiprocessing.reductions import reduce_tensor

        t = to_torch(tensor)
        if not t.is_cuda:
            raise Unsupported("CUDA IPC hands on device tensors only; this one is on the host")
        rebuild, args = reduce_tensor(t)
        with self._lock:
            key = next(self._keys)
            self._alive[key] = t
        return CudaIpcPayload(key, self.owner, rebuild, tuple(args), t.element_size() * t.numel())

    def release(self, key: int) -> None:
        """The consumer is done with ``key``: the producer's buffer may be freed."""
        with self._lock:
            if self._alive.pop(key, None) is None:
                raise InternalError(f"CUDA IPC handle {key} is not held (released twice?)")

    def __len__(self) -> int:
        with self._lock:
            return len(self._alive)


def export_tensor(tensor: Tensor, route: Route, registry: IpcRegistry | None = None) -> Payload:
    """What the producer sends on for ``route``."""
    if route is Route.IN_PROCESS:
        return InProcessPayload(tensor)
    if route is Route.CUDA_IPC:
        if registry is None:
            raise InternalError("CUDA IPC hand-off needs the producer's IpcRegistry")
        return registry.export(tensor)
    return HostPayload(to_numpy(tensor))


def open_payload(payload: Payload, framework: str | None = None) -> Tensor:
    """The consumer's tensor for a payload (a CUDA IPC payload maps the producer's memory)."""
    if isinstance(payload, InProcessPayload):
        return as_framework(payload.tensor, framework)
    if isinstance(payload, HostPayload):
        return as_framework(payload.array, framework)
    tensor = payload.rebuild(*payload.args)
    return as_framework(tensor, framework)
