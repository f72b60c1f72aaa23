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
    """Check ``config.sequence_batching`` against Triton's rules (its wording, after the field)."""
    seq = config.sequence_batching
    if config.response_cache.enable:
        findings.add(
            "response_cache.enable",
            f"Response Cache does not currently support model {config.name} with sequence batching "
            "scheduler. Please disable the response cache.",
        )
    _check_controls(config, findings)
    _check_strategy(seq, config.max_batch_size, config.name, findings)
    _check_states(config, findings)


def _check_controls(config: pb.ModelConfig, findings: Findings) -> None:
    seq, model = config.sequence_batching, config.name
    inputs = {t.name for t in config.input}
    kinds: Counter[int] = Counter()
    for name, count in Counter(c.name for c in seq.control_input).items():
        if name and count > 1:
            findings.add(
                "sequence_batching.control_input",
                f"sequence batching control tensor '{name}' is specified for multiple control kinds for {model}",
            )
    for index, control_input in enumerate(seq.control_input):
        where = f"sequence_batching.control_input[{index}]" + (
            f" '{control_input.name}'" if control_input.name else ""
        )
        if not control_input.name:
            findings.add(f"{where}.name", f"sequence batching control tensor must have a name for {model}")
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
            _check_control(control, f"{where}.control", model, findings)
    for kind, count in kinds.items():
        if count > 1 and kind in Control.Kind.values():
            findings.add(
                "sequence_batching.control_input",
                f"sequence batching specifies multiple {Control.Kind.Name(kind)} tensors for {model}",
            )


def _check_control(
    control: pb.ModelSequenceBatching.Control, where: str, model: str, findings: Findings
) -> None:
    if control.kind not in Control.Kind.values():
        return  # reported by the enum check
    kind = Control.Kind.Name(control.kind)
    given = [name for name in _VALUE_FIELDS if len(getattr(control, name))]
    quoted = "'int32_false_true', 'fp32_false_true' or 'bool_false_true'"
    if control.kind in _FLAG_KINDS:
        if not given:
            findings.add(where, f"sequence batching must specify either {quoted} for {kind} for {model}")
        elif len(given) > 1:
            findings.add(
                where,
                "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and "
                f"'bool_false_true' for {kind} for {model}",
            )
        for name in given:
            if len(getattr(control, name)) != 2:
                findings.add(
                    f"{where}.{name}",
                    f"sequence batching control '{name}' must have exactly 2 entries for {kind} for {model} "
                    f"(got {len(getattr(control, name))})",
                )
        if control.data_type != pb.TYPE_INVALID:
            findings.add(
                f"{where}.data_type",
                f"{kind} takes its type from {given[0] if given else 'its values'}; remove data_type",
            )
        return
    if given:
        findings.add(where, f"sequence batching must not specify either {quoted} for {kind} for {model}")
    if control.data_type not in _CORRID_TYPES:
        findings.add(
            f"{where}.data_type",
            f"unexpected data type for control {kind} for {model}. Allowed data types are TYPE_UINT64, "
            f"TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING (got {pb.DataType.Name(control.data_type)})",
        )


def _check_strategy(
    seq: pb.ModelSequenceBatching, max_batch_size: int, model: str, findings: Findings
) -> None:
    strategy = seq.WhichOneof("strategy_choice")
    if strategy == "oldest":
        oldest = seq.oldest  # max_candidate_sequences 0 (left out): a batch's worth (the runtime's settings)
        for size in oldest.preferred_batch_size:
            where = "sequence_batching.oldest.preferred_batch_size"
            if size <= 0:
                findings.add(where, f"sequence batching preferred batch size must be positive for {model}")
            elif size > max_batch_size:
                findings.add(
                    where,
                    f"sequence batching preferred batch size must be <= max batch size for {model} "
                    f"({size} is above max_batch_size {max_batch_size})",
                )
    elif strategy == "direct":
        utilization = seq.direct.minimum_slot_utilization
        if not 0.0 <= utilization <= 1.0:
            findings.add(
                "sequence_batching.direct.minimum_slot_utilization",
                f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {model} "
                f"(got {utilization})",
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
