"""Transport-neutral inference requests and responses.

The HTTP and gRPC front ends decode into these; the batcher, the backends and
the ensemble scheduler consume them. Tensors are numpy arrays on the host
(BYTES as ``object`` arrays of ``bytes``) or any DLPack-capable array on a
device (torch, CuPy), never copied on the way through.

Errors have one path: from the model runtime's boundary
(:meth:`deployments.runtime.model.ModelRuntime.infer`) down through the
schedulers and the backends, a request that fails gets an :class:`InferResponse`
whose ``error`` is set (built by :meth:`InferResponse.failed`), never an
exception, so that one request's failure never fails the others of its batch.
Only a front end turns ``response.error`` into its protocol's status.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from deployments.tensors import Tensor, device_of, shape_of
from deployments.tracing.spans import TraceParent
from repository_loader.errors import ServerError

_NONE: frozenset[str] = frozenset()


@dataclass
class RequestedOutput:
    """An entry of the request's ``outputs`` list."""

    name: str
    binary: bool | None = None  # binary_data parameter; None = server default
    class_count: int = 0  # classification extension: top-k as "score:index[:label]"
    # shared-memory extension: where the output is written (a ``protocol.shared_memory.SharedRef``);
    # the front end writes it, the response then carries the output's name, data type and shape only
    shared: Any = None


@dataclass
class InferRequest:
    model_name: str
    inputs: dict[str, Tensor]
    model_version: str = ""  # "" = the version policy's choice (latest)
    id: str = ""
    requested_outputs: list[RequestedOutput] | None = None  # None = all outputs
    parameters: dict[str, Any] = field(default_factory=dict)
    correlation_id: int | str = 0
    sequence_start: bool = False
    sequence_end: bool = False
    priority: int = 0
    timeout_us: int = 0
    # nanosecond timestamps filled by the serving layer, for statistics
    arrival_ns: int = 0
    # the client went away (a cancelled gRPC call): the model sees it as ``request.is_cancelled()``
    cancelled: bool = field(default=False, compare=False)
    # which request this is to the runtime that counts it waiting: kept by ``dataclasses.replace``, so
    # a copy a scheduler makes (a sequence's control inputs added) is still the same request
    ticket: int = field(default=0, compare=False)
    # an input or a requested output lies in shared memory: the front end reads the inputs (in place
    # of ``protocol.shared_memory.SharedInput`` placeholders) before the request goes on
    shared_memory: bool = field(default=False, compare=False)
    # a traced request: where its model's span hangs (set by the front end, an ensemble step, a BLS call)
    trace: TraceParent | None = field(default=None, compare=False)

    def batch_rows(self) -> int:
        """Rows this request adds to a batch (first dimension of its inputs)."""
        for t in self.inputs.values():
            shape = t.shape if isinstance(t, np.ndarray) else shape_of(t)
            return int(shape[0]) if shape else 1
        return 1

    def batch_key(self, ragged: frozenset[str] = _NONE, shape_tensors: frozenset[str] = _NONE) -> Hashable:
        """What must be equal for two requests to share a batch (the dynamic batcher, the tensor backend).

        Every input's dimensions after the batch dimension, except inputs in
        ``ragged`` (``allow_ragged_batch``); the values of ``shape_tensors``;
        which inputs are present (optional inputs given in one request and not
        the other); and the device of tensors that are not numpy arrays.
        """
        parts: list[tuple] = []
        for name, tensor in self.inputs.items():
            if name in ragged:
                parts.append((name, None))
                continue
            if isinstance(tensor, np.ndarray):
                part: tuple = (name, tensor.shape[1:])
            else:
                part = (name, shape_of(tensor)[1:], device_of(tensor))
            if name in shape_tensors:
                part += (_tensor_values(tensor),)
            parts.append(part)
        parts.sort(key=_first)
        return tuple(parts)

    def output_names(self, all_outputs: list[str]) -> list[str]:
        if self.requested_outputs is None:
            return list(all_outputs)
        return [o.name for o in self.requested_outputs]


@dataclass
class InferResponse:
    outputs: dict[str, Tensor] = field(default_factory=dict)
    error: ServerError | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    final: bool = True  # decoupled models: the last response of a request
    model_name: str = ""
    model_version: str = ""
    id: str = ""

    @classmethod
    def failed(cls, request: InferRequest, error: ServerError) -> InferResponse:
        """The response of ``request`` when it fails: ``error`` and no outputs (the one error builder)."""
        return cls(
            error=error, model_name=request.model_name, model_version=request.model_version, id=request.id
        )


class ModelExecutor(Protocol):
    """Runs an inference on another model (BLS, ensembles). Provided by the serving layer.

    A request's failure comes back in ``response.error``, as from the model runtime.
    """

    async def infer(self, request: InferRequest) -> InferResponse: ...


class StreamingExecutor(ModelExecutor, Protocol):
    """Optional capability of a :class:`ModelExecutor`: every response of a decoupled model.

    ``stream`` yields the responses of ``request`` in order, the last with
    ``final`` set (BLS ``exec(decoupled=True)``). Without it, BLS gets the one
    response ``infer`` gives.
    """

    def stream(self, request: InferRequest) -> AsyncIterator[InferResponse]: ...


class ModelControlExecutor(Protocol):
    """Optional capability of a :class:`ModelExecutor`: BLS model control (``pb_utils.load_model`` ...).

    The server applies its model control mode; a refused call raises a ``ServerError``.
    ``config`` is a JSON override of the model configuration ("" for none) and
    ``files`` maps ``"file:<path>"`` to the content of an override model directory.
    """

    async def load_model(self, name: str, config: str, files: Mapping[str, bytes]) -> None: ...

    async def unload_model(self, name: str, unload_dependents: bool) -> None: ...

    async def is_model_ready(self, name: str, version: str) -> bool: ...


def _first(part: tuple) -> str:
    return part[0]


def _tensor_values(tensor: object) -> tuple:
    tolist = getattr(tensor, "tolist", None)
    values = tolist() if tolist is not None else tensor
    return tuple(map(repr, values)) if isinstance(values, list) else (repr(values),)
