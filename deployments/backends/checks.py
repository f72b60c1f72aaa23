"""Checks Triton makes on every request before a backend sees it.

Inputs must be declared by the model, carry its data type and a shape that
matches its dims (``-1`` matches any size), all required inputs must be
present, every input of a batching model must have the same number of rows
(at most ``max_batch_size``), and requested outputs must exist.
"""

from __future__ import annotations

from typing import Any

from deployments.backends.arrays import device_of, shape_of, wire_datatype
from deployments.inference import InferRequest
from repository_loader.errors import InvalidArgument
from repository_loader.model import ModelDescription, TensorSpec


def dims_match(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    """True when ``shape`` fits ``dims`` (``-1`` is any size)."""
    return len(shape) == len(dims) and all(d == -1 or d == s for s, d in zip(shape, dims, strict=True))


def _check_input(model: ModelDescription, name: str, array: Any) -> int | None:
    """Check one input; return its row count for batching models."""
    spec = model.input(name)
    if spec is None:
        raise InvalidArgument(f"unexpected inference input '{name}' for model '{model.name}'")
    datatype = wire_datatype(array)
    if datatype != spec.datatype:
        raise InvalidArgument(
            f"inference input '{name}' data-type is '{datatype}', but model '{model.name}' "
            f"expects '{spec.datatype}'"
        )
    shape = shape_of(array)
    batched = model.max_batch_size > 0
    if batched and not shape:
        raise InvalidArgument(
            f"input '{name}' of model '{model.name}' needs a batch dimension (max_batch_size > 0)"
        )
    dims = shape[1:] if batched else shape
    if not spec.is_shape_tensor and not dims_match(dims, spec.dims):
        raise InvalidArgument(
            f"unexpected shape for input '{name}' for model '{model.name}'. Expected "
            f"{spec.full_shape(model.max_batch_size)}, got {list(shape)}"
        )
    return shape[0] if batched else None


def check_request(model: ModelDescription, request: InferRequest, output_names: list[str]) -> None:
    """Raise :class:`InvalidArgument` naming the first rule ``request`` breaks."""
    rows: set[int] = set()
    for name, array in request.inputs.items():
        count = _check_input(model, name, array)
        if count is not None:
            rows.add(count)
    missing = [s.name for s in model.inputs if not s.optional and s.name not in request.inputs]
    if missing:
        raise InvalidArgument(f"model '{model.name}' is missing required input(s) {missing}")
    if len(rows) > 1:
        raise InvalidArgument(
            f"all inputs of a request to model '{model.name}' must have the same batch size, got {sorted(rows)}"
        )
    if rows and max(rows) > model.max_batch_size:
        raise InvalidArgument(
            f"inference request batch-size must be <= {model.max_batch_size} for '{model.name}'"
        )
    for name in request.output_names(output_names):
        if name not in output_names:
            raise InvalidArgument(f"unexpected inference output '{name}' for model '{model.name}'")


def batch_key(model: ModelDescription, request: InferRequest) -> tuple[Any, ...]:
    """Requests with equal keys can be joined along the batch dimension."""
    if model.max_batch_size <= 0:
        return (id(request),)
    return tuple(
        sorted((name, shape_of(a)[1:], wire_datatype(a), device_of(a)) for name, a in request.inputs.items())
    )


def to_model_shape(spec: TensorSpec, array: Any, batched: bool) -> tuple[int, ...] | None:
    """The shape the framework expects for a wire-shaped input (``None``: unchanged)."""
    if spec.reshape is None:
        return None
    shape = shape_of(array)
    return (shape[0], *spec.reshape) if batched else tuple(spec.reshape)


def to_wire_shape(spec: TensorSpec, array: Any, batched: bool) -> tuple[int, ...] | None:
    """The shape clients see for a model-shaped output (``None``: unchanged)."""
    if spec.reshape is None:
        return None
    dims = tuple(spec.dims)
    if dims.count(-1) > 1:
        return None
    shape = shape_of(array)
    return (shape[0], *dims) if batched else dims
