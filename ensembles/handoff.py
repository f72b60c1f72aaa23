"""Tensor hand-off between ensemble steps without needless copies.

Three routes, chosen by :class:`HandoffPolicy` from where the producer and the
consumer of a tensor live:

- ``IN_PROCESS``: both run in one process. The consumer receives the
  producer's array object, or a DLPack view of it in the framework it wants
  (:func:`as_framework`); the bytes are never copied.
- ``CUDA_IPC``: both run on one node and the tensor is on a GPU. The producer
  exports a CUDA IPC handle (:class:`IpcRegistry`), keeps the buffer alive
  until the consumer releases it, and the consumer maps the same device memory.
- ``HOST``: anything else (other nodes, CPU tensors across processes). The
  tensor travels as a host numpy array, which Ray's object store moves.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from repository_loader.errors import InternalError, Unsupported

Tensor = Any

_DLPACK_CPU = 1
_DLPACK_CUDA = 2


class Route(str, Enum):
    """How a tensor reaches the next step."""

    IN_PROCESS = "in_process"
    CUDA_IPC = "cuda_ipc"
    HOST = "object_store"


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


def device_of(tensor: Tensor) -> str:
    """``"cpu"`` or ``"cuda:<index>"`` for numpy arrays and any DLPack-capable array."""
    if isinstance(tensor, np.ndarray):
        return "cpu"
    device = getattr(tensor, "device", None)
    if device is not None and hasattr(device, "type"):  # torch.device
        return "cpu" if device.type == "cpu" else f"{device.type}:{device.index or 0}"
    if hasattr(tensor, "__dlpack_device__"):
        kind, index = tensor.__dlpack_device__()
        return "cpu" if int(kind) == _DLPACK_CPU else f"cuda:{index}"
    return "cpu"


def buffer_address(tensor: Tensor) -> int:
    """Address of the first element: equal addresses mean the same memory."""
    if isinstance(tensor, np.ndarray):
        return int(tensor.__array_interface__["data"][0])
    if hasattr(tensor, "data_ptr"):
        return int(tensor.data_ptr())
    if hasattr(tensor, "__cuda_array_interface__"):
        return int(tensor.__cuda_array_interface__["data"][0])
    return int(np.from_dlpack(tensor).__array_interface__["data"][0])


def as_framework(tensor: Tensor, framework: str | None) -> Tensor:
    """The same memory seen as a ``"numpy"`` or ``"torch"`` array (``None``: as it is).

    A zero-copy DLPack view; a device tensor cannot be seen as numpy and is
    refused rather than copied.
    """
    if framework is None:
        return tensor
    if framework == "numpy":
        if isinstance(tensor, np.ndarray):
            return tensor
        if device_of(tensor) != "cpu":
            raise Unsupported("a device tensor cannot be handed on as numpy without a copy to the host")
        return np.from_dlpack(tensor)
    if framework == "torch":
        import torch

        if isinstance(tensor, torch.Tensor):
            return tensor
        return torch.from_dlpack(tensor)
    raise Unsupported(f"unknown tensor framework '{framework}' (expected 'numpy' or 'torch')")


def to_host(tensor: Tensor) -> np.ndarray:
    """A numpy array of the tensor: a view for host tensors, a copy only for device tensors."""
    if isinstance(tensor, np.ndarray):
        return tensor
    if device_of(tensor) == "cpu":
        return np.from_dlpack(tensor)
    import torch

    t = tensor if isinstance(tensor, torch.Tensor) else torch.from_dlpack(tensor)
    return t.detach().cpu().numpy()


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
        import torch
        from torch.multiprocessing.reductions import reduce_tensor

        t = tensor if isinstance(tensor, torch.Tensor) else torch.from_dlpack(tensor)
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
    return HostPayload(to_host(tensor))


def open_payload(payload: Payload, framework: str | None = None) -> Tensor:
    """The consumer's tensor for a payload (a CUDA IPC payload maps the producer's memory)."""
    if isinstance(payload, InProcessPayload):
        return as_framework(payload.tensor, framework)
    if isinstance(payload, HostPayload):
        return as_framework(payload.array, framework)
    tensor = payload.rebuild(*payload.args)
    return as_framework(tensor, framework)
