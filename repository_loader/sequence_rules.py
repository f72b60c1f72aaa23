"""Triton's rules for ``sequence_batching``: control inputs, strategies and implicit state."""

from __future__ import annotations

from collections import Counter

from repository_loader.findings import Findings, check_dims
from repository_loader.proto import model_config_pb2 as pb

Control = pb.ModelSequenceBatching.Control
_FLAG_KINDS = (Control.CONTROL_SEQUENCE_START, Control.CONTROL_SEQUENCE_READY, Control.CONTROL_SEQUENCE_END)
_CORRID_TYPES = (pb.TYPE_UINT64, pb.TYPE_INT64, pb.TYPE_UINT32, pb.TYPE_INT32, pb.TYPE_STRING)
_VALUE_FIELDS = ("int32_false_true", "fp32_false_true", "bool_false_true")


def check_sequence_batching(config: pb.ModelConfig, findings: Findings) -> None:
    """Check ``config.sequence_batching`` against Triton's rules."""
    seq = config.sequence_batching
    _check_controls(config, findings)
    _check_strategy(seq, config.max_batch_size, findings)
    _check_states(config, findings)


def _check_controls(config: pb.ModelConfig, findings: Findings) -> None:
    seq = config.sequence_batching
    inputs = {t.name for t in config.input}
    kinds: Counter[int] = Counter()
    for name, count in Counter(c.name for c in seq.control_input).items():
        if count > 1:
            findings.add("sequence_batching.control_input", f"control input '{name}' is listed {count} times")
    for index, control_input in enumerate(seq.control_input):
        where = f"sequence_batching.control_input[{index}]" + (
            f" '{control_input.name}'" if control_input.name else ""
        )
        if not control_input.name:
            findings.add(f"{where}.name", "must not be empty")
        if control_input.name in inputs:
            findings.add(
                f"{where}.name",
                f"'{control_input.name}' is also listed as a model input; the server provides it",
            )
        if len(control_input.control) != 1:
            findings.add(
                f"{where}.control", f"must hold exactly one control, got {len(control_input.control)}"
            )
        for control in control_input.control:
            kinds[control.kind] += 1
            _check_control(control, f"{where}.control", findings)
    for kind, count in kinds.items():
        if count > 1 and kind in Control.Kind.values():
            findings.add(
                "sequence_batching.control_input", f"{Control.Kind.Name(kind)} is given {count} times"
            )


def _check_control(control: pb.ModelSequenceBatching.Control, where: str, findings: Findings) -> None:
    if control.kind not in Control.Kind.values():
        return  # reported by the enum check
    kind = Control.Kind.Name(control.kind)
    given = [name for name in _VALUE_FIELDS if len(getattr(control, name))]
    if control.kind in _FLAG_KINDS:
        if len(given) != 1:
            findings.add(where, f"{kind} needs exactly one of {', '.join(_VALUE_FIELDS)}, got {len(given)}")
        for name in given:
            if len(getattr(control, name)) != 2:
                findings.add(
                    f"{where}.{name}",
                    f"{kind} needs two values (false, true), got {len(getattr(control, name))}",
                )
        if control.data_type != pb.TYPE_INVALID:
            findings.add(
                f"{where}.data_type",
                f"{kind} takes its type from {given[0] if given else 'its values'}; remove data_type",
            )
    else:
        if given:
            findings.add(where, f"{kind} takes no {' / '.join(given)}")
        if control.data_type not in _CORRID_TYPES:
            names = ", ".join(pb.DataType.Name(t) for t in _CORRID_TYPES)
            findings.add(
                f"{where}.data_type",
                f"{kind} needs data_type one of {names}, got {pb.DataType.Name(control.data_type)}",
            )


def _check_strategy(seq: pb.ModelSequenceBatching, max_batch_size: int, findings: Findings) -> None:
    strategy = seq.WhichOneof("strategy_choice")
    if strategy == "oldest":
        oldest = seq.oldest
        if oldest.max_candidate_sequences < 1:
            findings.add(
                "sequence_batching.oldest.max_candidate_sequences",
                f"must be >= 1, got {oldest.max_candidate_sequences}",
            )
        for size in oldest.preferred_batch_size:
            if not 1 <= size <= max_batch_size:
                findings.add(
                    "sequence_batching.oldest.preferred_batch_size",
                    f"{size} must be between 1 and max_batch_size {max_batch_size}",
                )
    elif strategy == "direct":
        utilization = seq.direct.minimum_slot_utilization
        if not 0.0 <= utilization <= 1.0:
            findings.add(
                "sequence_batching.direct.minimum_slot_utilization",
                f"must be between 0 and 1, got {utilization}",
            )


def _check_states(config: pb.ModelConfig, findings: Findings) -> None:
    seq = config.sequence_batching
    for side in ("input_name", "output_name"):
        for name, count in Counter(getattr(s, side) for s in seq.state).items():
            if name and count > 1:
                findings.add(f"sequence_batching.state.{side}", f"'{name}' is used by {count} states")
    for index, state in enumerate(seq.state):
        where = f"sequence_batching.state[{index}]"
        for side in ("input_name", "output_name"):
            if not getattr(state, side):
                findings.add(f"{where}.{side}", "must not be empty")
        if state.data_type == pb.TYPE_INVALID:
            findings.add(f"{where}.data_type", "is required")
        if not state.dims:
            findings.add(f"{where}.dims", "must not be empty")
        check_dims(state.dims, f"{where}.dims", findings)
        if state.use_growable_memory and not state.use_same_buffer_for_input_output:
            findings.add(f"{where}.use_growable_memory", "needs use_same_buffer_for_input_output")
