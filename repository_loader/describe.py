"""Turn a validated, completed ``ModelConfig`` into the frozen :class:`ModelDescription`."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from repository_loader import platforms
from repository_loader.config import config_to_json
from repository_loader.datatypes import config_to_wire
from repository_loader.model import (
    DynamicBatching,
    EnsembleStep,
    InstanceGroup,
    InstanceKind,
    ModelDescription,
    QueuePolicy,
    RateLimiter,
    RateLimitResource,
    SequenceBatching,
    SequenceControl,
    TensorSpec,
    WarmupInput,
    WarmupSample,
    frozen_mapping,
)
from repository_loader.proto import model_config_pb2 as pb

DEFAULT_SEQUENCE_IDLE_US = 1_000_000
_Kind = pb.ModelInstanceGroup.Kind
_Control = pb.ModelSequenceBatching.Control
_FLAG_VALUE_TYPES = (("int32_false_true", "INT32"), ("fp32_false_true", "FP32"), ("bool_false_true", "BOOL"))


def describe(
    config: pb.ModelConfig, path: Path, versions: Iterable[int], python_runtime: Path | None = None
) -> ModelDescription:
    """The description of a model whose ``config`` passed validation (``python_runtime``: the
    ``model.py`` of the Python-based backend it names)."""
    backend = config.backend if config.platform != platforms.ENSEMBLE else ""
    return ModelDescription(
        name=config.name,
        path=path,
        platform=config.platform,
        backend=backend,
        max_batch_size=config.max_batch_size,
        inputs=tuple(_tensor(t) for t in config.input),
        outputs=tuple(_tensor(t) for t in config.output),
        versions=tuple(sorted(versions)),
        instance_groups=tuple(_group(config, i, g) for i, g in enumerate(config.instance_group)),
        dynamic_batching=_dynamic(config.dynamic_batching) if config.HasField("dynamic_batching") else None,
        sequence_batching=_sequence(config.sequence_batching)
        if config.HasField("sequence_batching")
        else None,
        ensemble_steps=tuple(_step(s) for s in config.ensemble_scheduling.step),
        warmup=tuple(_warmup(w) for w in config.model_warmup),
        parameters=frozen_mapping({k: v.string_value for k, v in config.parameters.items()}),
        default_model_filename=config.default_model_filename,
        cc_model_filenames=frozen_mapping(dict(config.cc_model_filenames)),
        decoupled=config.model_transaction_policy.decoupled,
        response_cache=config.response_cache.enable,
        optimization=frozen_mapping(config_to_json(config).get("optimization", {})),
        config_json=frozen_mapping(config_to_json(config)),
        python_runtime=str(python_runtime) if python_runtime is not None else "",
    )


def _wire(data_type: int) -> str:
    return config_to_wire(pb.DataType.Name(data_type))


def _tensor(tensor: pb.ModelInput | pb.ModelOutput) -> TensorSpec:
    is_input = isinstance(tensor, pb.ModelInput)
    return TensorSpec(
        name=tensor.name,
        datatype=_wire(tensor.data_type),
        dims=tuple(tensor.dims),
        reshape=tuple(tensor.reshape.shape) if tensor.HasField("reshape") else None,
        optional=tensor.optional if is_input else False,  # type: ignore[union-attr]
        allow_ragged_batch=tensor.allow_ragged_batch if is_input else False,  # type: ignore[union-attr]
        is_shape_tensor=tensor.is_shape_tensor,
        label_filename=None if is_input else (tensor.label_filename or None),  # type: ignore[union-attr]
        format=pb.ModelInput.Format.Name(tensor.format) if is_input else "FORMAT_NONE",  # type: ignore[union-attr]
    )


def default_instance_count(kind: int, backend: str) -> int:
    """Triton's count for a group whose ``count`` is below 1 or left out (2 for ONNX Runtime on CPU)."""
    if kind == _Kind.KIND_CPU:
        return platforms.CPU_DEFAULT_COUNT.get(backend, 1)
    return 1


def _group(config: pb.ModelConfig, index: int, group: pb.ModelInstanceGroup) -> InstanceGroup:
    count = group.count if group.count >= 1 else default_instance_count(group.kind, config.backend)
    return InstanceGroup(
        name=group.name or f"{config.name}_{index}",
        kind=InstanceKind(_Kind.Name(group.kind)),
        count=count,
        gpus=tuple(group.gpus),
        host_policy=group.host_policy,
        passive=group.passive,
        rate_limiter=RateLimiter(
            resources=tuple(
                RateLimitResource(name=r.name, count=r.count, global_=getattr(r, "global"))
                for r in group.rate_limiter.resources
            ),
            priority=group.rate_limiter.priority,
        ),
    )


def _queue_policy(policy: pb.ModelQueuePolicy) -> QueuePolicy:
    return QueuePolicy(
        timeout_action=pb.ModelQueuePolicy.TimeoutAction.Name(policy.timeout_action),
        default_timeout_microseconds=policy.default_timeout_microseconds,
        allow_timeout_override=policy.allow_timeout_override,
        max_queue_size=policy.max_queue_size,
    )


def _dynamic(batching: pb.ModelDynamicBatching) -> DynamicBatching:
    return DynamicBatching(
        preferred_batch_size=tuple(batching.preferred_batch_size),
        max_queue_delay_microseconds=batching.max_queue_delay_microseconds,
        preserve_ordering=batching.preserve_ordering,
        priority_levels=batching.priority_levels,
        default_priority_level=batching.default_priority_level,
        default_queue_policy=_queue_policy(batching.default_queue_policy),
        priority_queue_policy=frozen_mapping(
            {int(level): _queue_policy(p) for level, p in batching.priority_queue_policy.items()}
        ),
    )


def _sequence(seq: pb.ModelSequenceBatching) -> SequenceBatching:
    strategy = seq.WhichOneof("strategy_choice") or "direct"
    delay = (
        seq.oldest.max_queue_delay_microseconds
        if strategy == "oldest"
        else seq.direct.max_queue_delay_microseconds
    )
    return SequenceBatching(
        strategy=strategy,
        max_sequence_idle_microseconds=seq.max_sequence_idle_microseconds or DEFAULT_SEQUENCE_IDLE_US,
        controls=tuple(_control(ci.name, c) for ci in seq.control_input for c in ci.control),
        max_candidate_sequences=seq.oldest.max_candidate_sequences if strategy == "oldest" else 0,
        max_queue_delay_microseconds=delay,
        iterative=seq.iterative_sequence,
    )


def _control(input_name: str, control: pb.ModelSequenceBatching.Control) -> SequenceControl:
    kind = _Control.Kind.Name(control.kind)
    for field_name, wire in _FLAG_VALUE_TYPES:
        values = list(getattr(control, field_name))
        if values:
            return SequenceControl(input_name, kind, wire, tuple(values))
    return SequenceControl(input_name, kind, _wire(control.data_type), ())


def _step(step: pb.ModelEnsembling.Step) -> EnsembleStep:
    return EnsembleStep(
        model_name=step.model_name,
        model_version=step.model_version if step.model_version > 0 else -1,
        input_map=frozen_mapping(dict(step.input_map)),
        output_map=frozen_mapping(dict(step.output_map)),
        model_namespace=step.model_namespace,
    )


def _warmup(sample: pb.ModelWarmup) -> WarmupSample:
    inputs = {
        name: WarmupInput(
            datatype=_wire(value.data_type),
            dims=tuple(value.dims),
            source=value.WhichOneof("input_data_type") or "zero_data",
            input_data_file=value.input_data_file or None,
        )
        for name, value in sample.inputs.items()
    }
    return WarmupSample(
        name=sample.name,
        batch_size=sample.batch_size,
        inputs=frozen_mapping(inputs),
        count=sample.count or 1,
    )
