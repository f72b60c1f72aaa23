"""What the sequence batcher reads from ``sequence_batching``: controls, implicit state, strategy.

:class:`SequenceSettings` gathers the parts of ``ModelSequenceBatching`` the
scheduler acts on (the typed :class:`~repository_loader.model.SequenceBatching`
plus the fields only the config's JSON form carries: ``state``,
``direct.minimum_slot_utilization``, ``oldest.preferred_batch_size``,
``oldest.preserve_ordering``), builds the control tensors a request carries
(``CONTROL_SEQUENCE_START`` / ``_END`` / ``_READY`` / ``_CORRID``) and the
initial implicit state. :func:`backend_model` is the model as a backend sees
it: control and state tensors are inputs (and state outputs are outputs),
as Triton presents them to its backends.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from repository_loader import datatypes
from repository_loader.errors import InvalidArgument, Unavailable
from repository_loader.model import ModelDescription, SequenceBatching, TensorSpec

START, END, READY, CORRID = (
    "CONTROL_SEQUENCE_START",
    "CONTROL_SEQUENCE_END",
    "CONTROL_SEQUENCE_READY",
    "CONTROL_SEQUENCE_CORRID",
)
INITIAL_STATE_FOLDER = "initial_state"
"""Triton reads ``initial_state.data_file`` from this folder of the model's directory."""


@dataclass(frozen=True)
class StateSpec:
    """``ModelSequenceBatching.State``: a tensor the server keeps between requests of a sequence."""

    input_name: str
    output_name: str
    datatype: str  # wire name
    dims: tuple[int, ...]
    initial: np.ndarray  # without the batch dimension


@dataclass(frozen=True)
class SequenceSettings:
    """The sequence batcher's view of one model."""

    model_name: str
    max_batch_size: int
    strategy: str  # "direct" or "oldest"
    idle_ns: int
    delay_ns: int
    controls: Mapping[str, tuple[str, str, tuple[Any, ...]]]  # kind -> (input name, wire type, (false, true))
    states: tuple[StateSpec, ...] = ()
    minimum_slot_utilization: float = 0.0
    max_candidate_sequences: int = 1
    preferred_batch_size: tuple[int, ...] = ()
    preserve_ordering: bool = False
    instances: int = 1  # the instances whose slots one replica holds (replica_instances)
    iterative: bool = False  # iterative_sequence: each request is a sequence of its own

    @property
    def batched(self) -> bool:
        return self.max_batch_size > 0

    @classmethod
    def from_model(cls, model: ModelDescription) -> SequenceSettings:
        seq = model.sequence_batching or SequenceBatching()
        raw = dict(model.config_json.get("sequence_batching") or {})
        direct = raw.get("direct") or {}
        oldest = raw.get("oldest") or {}
        return cls(
            model_name=model.name,
            max_batch_size=model.max_batch_size,
            strategy=seq.strategy,
            idle_ns=int(seq.max_sequence_idle_microseconds) * 1000,
            delay_ns=int(seq.max_queue_delay_microseconds) * 1000,
            controls={c.kind: (c.input_name, c.datatype, tuple(c.values)) for c in seq.controls},
            states=tuple(_state(model, s) for s in raw.get("state") or ()),
            minimum_slot_utilization=float(direct.get("minimum_slot_utilization") or 0.0),
            # 0 (left out): as many candidates as a batch holds, at least 1, as Triton's sequence batcher
            max_candidate_sequences=int(seq.max_candidate_sequences)
            if seq.max_candidate_sequences > 0
            else max(model.max_batch_size, 1),
            preferred_batch_size=tuple(int(p) for p in oldest.get("preferred_batch_size") or ()),
            preserve_ordering=bool(oldest.get("preserve_ordering", False)),
            instances=replica_instances(model),
            iterative=seq.iterative,
        )

    # -- control tensors ---------------------------------------------------

    def control_tensors(
        self, start: bool, end: bool, ready: bool, correlation_id: int | str
    ) -> dict[str, np.ndarray]:
        """The control inputs of one request, shaped ``[1, 1]`` (``[1]`` for a model without batching)."""
        shape = (1, 1) if self.batched else (1,)
        tensors: dict[str, np.ndarray] = {}
        for kind, flag in ((START, start), (END, end), (READY, ready)):
            control = self.controls.get(kind)
            if control is not None:
                name, wire, values = control
                tensors[name] = np.full(shape, values[int(flag)], dtype=datatypes.to_numpy_dtype(wire))
        control = self.controls.get(CORRID)
        if control is not None:
            name, wire, _ = control
            tensors[name] = self._corrid_tensor(wire, correlation_id, shape)
        return tensors

    def _corrid_tensor(self, wire: str, correlation_id: int | str, shape: tuple[int, ...]) -> np.ndarray:
        if wire == "BYTES":
            value = correlation_id if isinstance(correlation_id, str) else str(correlation_id)
            array = np.empty(shape, dtype=np.object_)
            array.fill(value.encode() if correlation_id != 0 else b"")
            return array
        if isinstance(correlation_id, str):
            raise InvalidArgument(
                f"inference request to model '{self.model_name}' has string sequence ID "
                f"'{correlation_id}', but the model's CONTROL_SEQUENCE_CORRID is {wire}"
            )
        dtype = datatypes.to_numpy_dtype(wire)
        info = np.iinfo(dtype)
        if not info.min <= correlation_id <= info.max:
            raise InvalidArgument(
                f"sequence ID {correlation_id} does not fit the {wire} CONTROL_SEQUENCE_CORRID "
                f"of model '{self.model_name}'"
            )
        return np.full(shape, correlation_id, dtype=dtype)

    # -- implicit state ----------------------------------------------------

    def initial_states(self) -> dict[str, np.ndarray]:
        """Fresh state inputs for a sequence that starts (row-shaped for batching models)."""
        return {s.input_name: self._rowed(s.initial.copy()) for s in self.states}

    def _rowed(self, array: np.ndarray) -> np.ndarray:
        return array[np.newaxis, ...] if self.batched else array

    @property
    def state_outputs(self) -> dict[str, str]:
        """Output state name -> input state name."""
        return {s.output_name: s.input_name for s in self.states}


def _state(model: ModelDescription, raw: Mapping[str, Any]) -> StateSpec:
    wire = datatypes.config_to_wire(str(raw.get("data_type", "TYPE_FP32")))
    dims = tuple(int(d) for d in raw.get("dims") or ())
    initial = np.zeros(tuple(max(d, 1) for d in dims), dtype=datatypes.to_numpy_dtype(wire))
    for entry in raw.get("initial_state") or ():
        initial = _initial_state(model, wire, entry)
    return StateSpec(str(raw["input_name"]), str(raw["output_name"]), wire, dims, initial)


def _initial_state(model: ModelDescription, wire: str, entry: Mapping[str, Any]) -> np.ndarray:
    """``State.InitialState``: zeros, or the raw row-major contents of ``initial_state/<data_file>``."""
    entry_wire = datatypes.config_to_wire(str(entry.get("data_type") or datatypes.wire_to_config(wire)))
    dims = tuple(int(d) for d in entry.get("dims") or ())
    dtype = datatypes.to_numpy_dtype(entry_wire)
    data_file = entry.get("data_file")
    if not data_file:
        return np.zeros(dims, dtype=dtype)
    path = model.path / INITIAL_STATE_FOLDER / str(data_file)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise Unavailable(f"model '{model.name}': cannot read initial state {path}: {error}") from None
    if entry_wire == "BYTES":
        return datatypes.deserialize_bytes_tensor(raw).reshape(dims)
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(raw) != expected:
        raise Unavailable(
            f"model '{model.name}': initial state {path} holds {len(raw)} bytes, "
            f"dims {list(dims)} of {entry_wire} need {expected}"
        )
    return np.frombuffer(raw, dtype=dtype).reshape(dims).copy()


def model_instances(model: ModelDescription) -> int:
    """How many instances Triton runs of ``model``: every group's count, once per GPU it names.

    Triton's sequence slots are the slots of all these instances. Here each instance is a replica and
    a sequence runs on the replica owning its ID (:func:`replica_instances` says whose slots a replica
    holds). A KIND_GPU group that names no GPUs counts once (the GPUs of the cluster are not known
    here).
    """
    return max(sum(g.count * max(len(g.gpus), 1) for g in model.instance_groups), 1)


def replica_instances(model: ModelDescription) -> int:
    """The instances whose sequence slots one replica of ``model`` holds.

    A model that keeps a sequence's state itself (no ``state`` in ``sequence_batching``) relies on
    Triton's contract: an instance sees no more sequences than its own slots, each always in the same
    batch slot, and keeps their state by instance and slot (Triton's qa sequence models do). Here one
    replica is one instance of the model, so its replica holds that one instance's slots; sequences
    beyond them wait in its backlog. A model with implicit state keeps none: the scheduler hands each
    sequence its state, so its replica holds the slots of every instance (:func:`model_instances`) and
    a sequence never waits while this replica could run it.
    """
    raw = model.config_json.get("sequence_batching") or {}
    return model_instances(model) if raw.get("state") else 1


def backend_model(model: ModelDescription) -> ModelDescription:
    """``model`` as its backend sees it: control and state inputs, and state outputs, added.

    Triton hands these tensors to the backend like any other input; a backend
    checking requests against the model's declared inputs needs them declared.
    """
    settings = SequenceSettings.from_model(model)
    if model.sequence_batching is None:
        return model
    known = {t.name for t in model.inputs}
    extra = [
        TensorSpec(name, wire, (1,)) for name, wire, _ in settings.controls.values() if name not in known
    ]
    extra += [
        TensorSpec(s.input_name, s.datatype, s.dims) for s in settings.states if s.input_name not in known
    ]
    outputs = {t.name for t in model.outputs}
    extra_out = [
        TensorSpec(s.output_name, s.datatype, s.dims) for s in settings.states if s.output_name not in outputs
    ]
    return dataclasses.replace(
        model, inputs=model.inputs + tuple(extra), outputs=model.outputs + tuple(extra_out)
    )


__all__ = [
    "CORRID",
    "END",
    "READY",
    "START",
    "SequenceSettings",
    "StateSpec",
    "backend_model",
    "model_instances",
]
