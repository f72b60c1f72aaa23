"""Base class of the framework backends: one ``run`` over the rows of a whole batch.

:class:`TensorBackend` turns the requests of a batch into one framework call:
it groups requests whose inputs can be joined (:meth:`InferRequest.batch_key`,
the dynamic batcher's key), joins their rows (numpy on the host, torch for
device arrays), reshapes wire shapes to model shapes (``reshape`` in the
config), calls :meth:`TensorBackend.run`, reshapes back and hands every request
exactly its own rows of the outputs it asked for. Requests were checked at the
model runtime's boundary (:mod:`deployments.runtime.checks`) and are trusted
here. A framework call that fails gives every request of its group a response
carrying a :class:`ServerError` (:meth:`InferResponse.failed`); the other
groups are unaffected.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Hashable, Sequence
from typing import Any

from deployments import tensors
from deployments.backends.base import Backend, BackendContext, in_thread, timed
from deployments.inference import InferRequest, InferResponse, Tensor
from repository_loader.errors import InternalError, ServerError
from repository_loader.model import TensorSpec

_EMA = 0.2  # weight of the newest run in the running time estimate


class TensorBackend(Backend):
    """A backend whose model maps named input tensors to named output tensors.

    Subclasses implement :meth:`load` and :meth:`run`. ``run`` is a blocking
    call; it runs on the event loop while the model proves fast (estimated
    under :attr:`inline_threshold_s` for the batch at hand) and in a worker
    thread otherwise, so a slow model never stalls the replica's loop.
    """

    inline_threshold_s: float = 0.0005

    def __init__(self, context: BackendContext) -> None:
        super().__init__(context)
        self._seconds_per_row: float | None = None  # None until the first run is measured
        self._output_names = [o.name for o in self.model.outputs]
        self._batched = self.model.max_batch_size > 0
        self._shape_tensors = frozenset(t.name for t in self.model.inputs if t.is_shape_tensor)

    @abc.abstractmethod
    def run(self, inputs: dict[str, Tensor], output_names: list[str]) -> dict[str, Tensor]:
        """Run the framework on model-shaped inputs; return the named outputs."""

    async def execute(self, requests: Sequence[InferRequest]) -> list[InferResponse]:
        responses: list[InferResponse | None] = [None] * len(requests)
        groups: dict[Hashable, list[int]] = {}
        for index, request in enumerate(requests):
            # ragged inputs join only at equal shapes here: the framework call takes dense tensors
            key = request.batch_key(shape_tensors=self._shape_tensors) if self._batched else index
            groups.setdefault(key, []).append(index)
        for indexes in groups.values():
            group = [requests[i] for i in indexes]
            for index, response in zip(indexes, await self._execute_group(group), strict=True):
                responses[index] = response
        return [r for r in responses if r is not None]

    # --- one group of joinable requests ---------------------------------

    async def _execute_group(self, group: list[InferRequest]) -> list[InferResponse]:
        names = self._outputs_for(group)
        try:
            with timed("input"):
                inputs = self._join_inputs(group)
            outputs = await self._call_run(inputs, names, self._rows(group))
            with timed("output"):
                outputs = self._wire_outputs(outputs, names)
        except ServerError as error:
            return [InferResponse.failed(r, error) for r in group]
        except Exception as error:  # a framework error must not fail the replica
            wrapped = InternalError(
                f"model '{self.model.name}' failed to execute: {type(error).__name__}: {error}"
            )
            return [InferResponse.failed(r, wrapped) for r in group]
        with timed("output"):
            return self._split(group, outputs)

    def _split(self, group: list[InferRequest], outputs: dict[str, Tensor]) -> list[InferResponse]:
        """Every request's own rows of the joined outputs."""
        if len(group) == 1:
            return [self._response(group[0], outputs)]
        responses = []
        start = 0
        for request in group:
            stop = start + request.batch_rows()
            rows = {name: tensors.slice_rows(a, start, stop) for name, a in outputs.items()}
            responses.append(self._response(request, rows))
            start = stop
        return responses

    def _rows(self, group: list[InferRequest]) -> int:
        return sum(r.batch_rows() for r in group) if self._batched else 1

    def _outputs_for(self, group: list[InferRequest]) -> list[str]:
        wanted: set[str] = set()
        for request in group:
            wanted.update(request.output_names(self._output_names))
        return [name for name in self._output_names if name in wanted]

    def _join_inputs(self, group: list[InferRequest]) -> dict[str, Tensor]:
        joined: dict[str, Tensor] = {}
        for name in group[0].inputs:
            array = tensors.concat_rows([r.inputs[name] for r in group])
            spec = self.model.input(name)
            shape = to_model_shape(spec, array, self._batched) if spec else None
            joined[name] = array if shape is None else self._reshape(array, shape, name)
        return joined

    def _wire_outputs(self, outputs: dict[str, Tensor], names: list[str]) -> dict[str, Tensor]:
        result: dict[str, Tensor] = {}
        for name in names:
            if name not in outputs:
                raise InternalError(f"model '{self.model.name}' produced no output '{name}'")
            array = outputs[name]
            spec = self.model.output(name)
            shape = to_wire_shape(spec, array, self._batched) if spec else None
            result[name] = array if shape is None else self._reshape(array, shape, name)
        return result

    def _reshape(self, array: Tensor, shape: tuple[int, ...], name: str) -> Tensor:
        try:
            return tensors.reshape(array, shape)
        except (ValueError, RuntimeError) as error:
            raise InternalError(
                f"tensor '{name}' of model '{self.model.name}' with shape {list(tensors.shape_of(array))} "
                f"cannot take the configured reshape {list(shape)}: {error}"
            ) from None

    # --- running the framework --------------------------------------------

    async def _call_run(self, inputs: dict[str, Tensor], names: list[str], rows: int) -> dict[str, Tensor]:
        estimate = self._seconds_per_row
        if estimate is not None and estimate * rows < self.inline_threshold_s:
            return self._timed_run(inputs, names, rows)
        return await in_thread(None, self._timed_run, inputs, names, rows)

    def _timed_run(self, inputs: dict[str, Tensor], names: list[str], rows: int) -> dict[str, Tensor]:
        start = time.perf_counter()
        outputs = self.run(inputs, names)
        per_row = (time.perf_counter() - start) / max(rows, 1)
        previous = self._seconds_per_row
        self._seconds_per_row = per_row if previous is None else (1 - _EMA) * previous + _EMA * per_row
        return outputs

    # --- responses ----------------------------------------------------------

    def _response(self, request: InferRequest, outputs: dict[str, Tensor]) -> InferResponse:
        names = request.output_names(self._output_names)
        if request.requested_outputs is not None:
            outputs = {name: outputs[name] for name in names}
        return InferResponse(
            outputs=outputs,
            model_name=self.model.name,
            model_version=str(self.context.version),
            id=request.id,
        )


def to_model_shape(spec: TensorSpec, array: Any, batched: bool) -> tuple[int, ...] | None:
    """The shape the framework expects for a wire-shaped input (``None``: unchanged)."""
    if spec.reshape is None:
        return None
    shape = tensors.shape_of(array)
    return (shape[0], *spec.reshape) if batched else tuple(spec.reshape)


def to_wire_shape(spec: TensorSpec, array: Any, batched: bool) -> tuple[int, ...] | None:
    """The shape clients see for a model-shaped output (``None``: unchanged)."""
    if spec.reshape is None:
        return None
    dims = tuple(spec.dims)
    if dims.count(-1) > 1:
        return None
    shape = tensors.shape_of(array)
    return (shape[0], *dims) if batched else dims
