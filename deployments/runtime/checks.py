"""The one request check: every request against one model's inputs, outputs and batching limit.

A :class:`ModelSchema` is compiled once from a :class:`ModelDescription` (dict
lookups instead of scans, numpy dtypes resolved) and reused for every request
of that model. :meth:`ModelSchema.check_request` runs once per request at the
model runtime's boundary (:class:`deployments.runtime.model.VersionRuntime`),
whatever its origin (HTTP, gRPC, BLS, an ensemble step, warmup); the
schedulers and backends behind it trust their input. The checks and their
wording follow Triton's: unknown or missing inputs, the data type, the shape
against the configured dims (``-1`` is any size), the batch dimension against
``max_batch_size``, one batch size for all inputs, and requested outputs the
model has. The protocol decoders only parse; they use the schema for what
encoding needs (output labels for the classification extension).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from deployments.inference import InferRequest
from deployments.tensors import shape_of, wire_datatype
from repository_loader.datatypes import to_numpy_dtype
from repository_loader.errors import InvalidArgument
from repository_loader.model import ModelDescription, TensorSpec


@dataclass(frozen=True)
class InputRule:
    """One configured input, ready for checking."""

    name: str
    datatype: str
    dtype: np.dtype | None  # None where numpy has no type (BF16 without ml_dtypes)
    dims: tuple[int, ...]
    optional: bool

    def check_shape(self, shape: Sequence[int], model: str, max_batch_size: int) -> None:
        """Raise :class:`InvalidArgument` when ``shape`` does not fit the configured dims."""
        rest = shape[1:] if max_batch_size > 0 else shape
        dims = self.dims
        if len(rest) == len(dims) and (
            tuple(rest) == dims or all(d == -1 or d == r for d, r in zip(dims, rest, strict=True))
        ):
            return
        expected = ([-1] if max_batch_size > 0 else []) + list(dims)
        raise InvalidArgument(
            f"unexpected shape for input '{self.name}' for model '{model}'. "
            f"Expected {_fmt(expected)}, got {_fmt(shape)}"
        )


@dataclass
class ModelSchema:
    """The inputs, outputs and batching limit of one model, compiled for fast request checks."""

    name: str
    max_batch_size: int
    inputs: dict[str, InputRule]
    outputs: dict[str, TensorSpec]
    required: frozenset[str]
    model_path: Path | None = None
    _labels: dict[str, list[str] | None] = field(default_factory=dict, repr=False)

    @classmethod
    def from_description(cls, model: ModelDescription) -> ModelSchema:
        """Compile the schema of ``model``."""
        inputs = {t.name: _rule(t) for t in model.inputs}
        return cls(
            name=model.name,
            max_batch_size=model.max_batch_size,
            inputs=inputs,
            outputs={t.name: t for t in model.outputs},
            required=frozenset(n for n, r in inputs.items() if not r.optional),
            model_path=model.path,
        )

    @property
    def batched(self) -> bool:
        """Whether the first dimension of every tensor is the batch."""
        return self.max_batch_size > 0

    def input_rule(self, name: str) -> InputRule:
        """The rule of input ``name``; :class:`InvalidArgument` for an input the model lacks."""
        rule = self.inputs.get(name)
        if rule is None:
            raise InvalidArgument(f"unexpected inference input '{name}' for model '{self.name}'")
        return rule

    def check_request(self, request: InferRequest) -> None:
        """Raise :class:`InvalidArgument` naming the first of Triton's rules ``request`` breaks."""
        inputs = request.inputs
        batch_sizes: set[int] = set()
        for name, tensor in inputs.items():
            shape = tensor.shape if type(tensor) is np.ndarray else shape_of(tensor)
            self.check_input(name, _datatype(tensor), shape)
            if self.max_batch_size > 0:
                batch_sizes.add(shape[0])
        self.check_complete(inputs, batch_sizes)
        for out in request.requested_outputs or ():
            self.check_output(out.name)

    def check_input(self, name: str, datatype: str, shape: Sequence[int]) -> InputRule:
        """Check one input's name, data type and shape; return its rule."""
        rule = self.input_rule(name)
        if datatype != rule.datatype:
            raise InvalidArgument(
                f"inference input '{name}' data-type is '{datatype}', "
                f"but model '{self.name}' expects '{rule.datatype}'"
            )
        if self.max_batch_size > 0:
            if not shape:
                raise InvalidArgument(
                    f"input '{name}' for model '{self.name}' has no batch dimension; "
                    f"expected shape {_fmt([-1, *rule.dims])}"
                )
            if shape[0] > self.max_batch_size:
                raise InvalidArgument(
                    f"inference request batch-size must be <= {self.max_batch_size} for "
                    f"'{self.name}', input '{name}' has batch-size {shape[0]}"
                )
        rule.check_shape(shape, self.name, self.max_batch_size)
        return rule

    def check_complete(self, names: Collection[str], batch_sizes: set[int]) -> None:
        """After every input: no required input missing, one batch size for all."""
        if len(names) < len(self.required) or not self.required.issubset(names):
            missing = self.required.difference(names)
            expected = (
                f"{len(self.required)} inputs"
                if len(self.required) == len(self.inputs)
                else f"number of inputs between {len(self.required)} and {len(self.inputs)}"
            )
            raise InvalidArgument(
                f"expected {expected} but got {len(names)} inputs for model "
                f"'{self.name}'. Got input(s) {_names(names)}, but missing required input(s) "
                f"{_names(missing)}. Please provide all required input(s)."
            )
        if self.max_batch_size > 0 and len(batch_sizes) > 1:
            raise InvalidArgument(
                f"inputs of a request for model '{self.name}' must share one batch-size, "
                f"got {sorted(batch_sizes)}"
            )

    def check_output(self, name: str) -> None:
        """Raise :class:`InvalidArgument` for a requested output the model lacks."""
        if name not in self.outputs:
            raise InvalidArgument(f"unexpected inference output '{name}' for model '{self.name}'")

    def labels(self, output: str) -> list[str] | None:
        """The labels of ``output`` (its ``label_filename``, one per line; an ensemble output without one:
        those of the step output that produces it), read once; None without."""
        if output in self._labels:
            return self._labels[output]
        spec = self.outputs.get(output)
        labels: list[str] | None = None
        path = None
        if spec is not None and spec.label_filename and self.model_path is not None:
            path = self.model_path / spec.label_filename
        elif spec is not None and spec.step_labels:  # an ensemble's output: its producing step's labels
            path = Path(spec.step_labels)
        if path is not None:
            try:
                labels = path.read_text(encoding="utf-8").splitlines()
            except OSError:
                labels = None
        self._labels[output] = labels
        return labels


def _rule(spec: TensorSpec) -> InputRule:
    try:
        dtype = to_numpy_dtype(spec.datatype)
    except InvalidArgument:
        dtype = None
    return InputRule(spec.name, spec.datatype, dtype, tuple(spec.dims), spec.optional)


def _datatype(tensor: object) -> str:
    """The wire data type of ``tensor``; its own type name where Triton has none (the check then names it)."""
    try:
        return wire_datatype(tensor)
    except (InvalidArgument, TypeError, AttributeError):
        return str(getattr(tensor, "dtype", type(tensor).__name__))


def _fmt(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _names(names: Collection[str]) -> str:
    """``names`` sorted, as Triton lists them: ``['A','B']``."""
    return "[" + ",".join(f"'{n}'" for n in sorted(names)) + "]"
