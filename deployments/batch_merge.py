"""Concatenating the requests of a batch by rows, and splitting the outputs back.

For backends that run a batch as one call (ONNX Runtime, TorchScript): the
inputs of the batch's requests are joined along the batch dimension, and
each output is cut back into one view per request by the rows each request
brought. Inputs that allow ragged batching are joined as Triton does: each
request's elements flattened and concatenated into one 1-D tensor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from deployments.inference import InferRequest
from repository_loader.errors import InternalError, InvalidArgument


@dataclass(frozen=True)
class MergedBatch:
    """The joined inputs of a batch and the rows each request contributed, in order."""

    inputs: dict[str, np.ndarray]
    rows: tuple[int, ...]

    @property
    def total_rows(self) -> int:
        return sum(self.rows)


def merge_inputs(
    requests: Sequence[InferRequest], ragged: frozenset[str] = frozenset(), model_name: str = ""
) -> MergedBatch:
    """Join the inputs of ``requests`` along the batch dimension (no copy for a single request)."""
    if not requests:
        raise InternalError(f"model '{model_name}': cannot merge an empty batch")
    names = list(requests[0].inputs)
    for request in requests[1:]:
        if set(request.inputs) != set(names):
            raise InvalidArgument(
                f"model '{model_name}': requests '{requests[0].id}' and '{request.id}' of one batch "
                f"carry different inputs ({sorted(names)} vs {sorted(request.inputs)})"
            )
    rows = tuple(r.batch_rows() for r in requests)
    merged = {name: _join([np.asarray(r.inputs[name]) for r in requests], name in ragged) for name in names}
    return MergedBatch(merged, rows)


def _join(tensors: list[np.ndarray], ragged: bool) -> np.ndarray:
    if ragged:
        tensors = [t.reshape(-1) for t in tensors]
    if len(tensors) == 1:
        return tensors[0]
    return np.concatenate(tensors, axis=0)


def split_outputs(
    outputs: Mapping[str, np.ndarray], rows: Sequence[int], model_name: str = ""
) -> list[dict[str, np.ndarray]]:
    """Cut each batched output into one view per request, by ``rows``."""
    total = sum(rows)
    bounds = np.cumsum(rows)[:-1]
    per_request: list[dict[str, np.ndarray]] = [{} for _ in rows]
    for name, tensor in outputs.items():
        array = np.asarray(tensor)
        if array.ndim == 0 or array.shape[0] != total:
            raise InternalError(
                f"model '{model_name}': output '{name}' has shape {list(array.shape)} but the batch "
                f"holds {total} rows; a batched output's first dimension must equal the batch rows"
            )
        for index, part in enumerate(np.split(array, bounds, axis=0)):
            per_request[index][name] = part
    return per_request


__all__ = ["MergedBatch", "merge_inputs", "split_outputs"]
