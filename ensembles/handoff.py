"""How a tensor reaches the next ensemble step: the routes placement chooses between.

- ``IN_PROCESS``: producer and consumer run in one process. The consumer
  receives the producer's array object, or a DLPack view of it in the framework
  it wants (:func:`deployments.tensors.as_framework`); the bytes are never copied.
- ``CUDA_IPC``: both run on one node and the tensor is on a GPU: the consumer
  may map the producer's device memory (the exporter and its tests live in
  ``bench/cuda_ipc.py``; serving does not hand tensors on this way yet).
- ``HOST``: anything else (other nodes, CPU tensors across processes). The
  tensor travels as a host numpy array, which Ray's object store moves.
"""

from __future__ import annotations

from enum import Enum


class Route(str, Enum):
    """How a tensor reaches the next step."""

    IN_PROCESS = "in_process"
    CUDA_IPC = "cuda_ipc"
    HOST = "object_store"


__all__ = ["Route"]
