"""How a tensor reaches the next ensemble step: the routes placement chooses between.

- ``IN_PROCESS``: producer and consumer run in one process. The consumer
  receives the producer's array object, or a DLPack view of it in the framework
  it wants (:func:`deployments.tensors.as_framework`); the bytes are never copied.
- ``REPLICA``: what serving does for every other tensor: the step runs on its
  model's replicas, and the tensor travels in the HTTP request to one of them
  (or back in its response), binary, in host memory; a GPU tensor is copied to
  the host and back onto the consumer's GPU. A decoupled model's stream goes
  through its Serve handle instead.

Two further routes are the experiment of ``bench/cuda_ipc.py``, which serving
does not use yet:

- ``CUDA_IPC``: both run on one node and the tensor is on a GPU: the consumer
  maps the producer's device memory.
- ``HOST``: the tensor travels as a host numpy array, which Ray's object store
  moves.
"""

from __future__ import annotations

from enum import Enum


class Route(str, Enum):
    """How a tensor reaches the next step."""

    IN_PROCESS = "in_process"
    REPLICA = "http"
    CUDA_IPC = "cuda_ipc"
    HOST = "object_store"


__all__ = ["Route"]
