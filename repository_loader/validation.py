"""Triton's rules for one model's configuration.

Every rule that fails adds one message naming the model, the config file and
the field; all of a model's problems are reported together. Rules that involve
other models (ensemble steps) live in :mod:`repository_loader.ensemble_rules`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from google.protobuf.message import Message

from repository_loader import platforms
from repository_loader.findings import Findings, ModelFiles, check_dims, check_unique
from repository_loader.proto import model_config_pb2 as pb
from repository_loader.sequence_rules import check_sequence_batching

Kind = pb.ModelInstanceGroup.Kind
_BATCH_INPUT_TYPES = (pb.TYPE_INT32, pb.TYPE_FP32)
_ACCELERATORS = {
    "gpu_execution_accelerator": frozenset({"tensorrt", "cuda"}),
    "cpu_execution_accelerator": frozenset({"openvino"}),
}


def validate_config(config: pb.ModelConfig, findings: Findings, files: ModelFiles) -> None:
    """Check ``config`` (already completed) against Triton's rules, adding to ``findings``."""
    check_enums(config, "", findings)
    check_identity(config, findings)
    is_ensemble = config.platform == platforms.ENSEMBLE
    check_tensors(config, findings, files)
    check_batch_io(config, findings)
    if is_ensemble:
        check_ensemble_shape(config, findings)
    else:
        check_not_ensemble(config, findings)
        check_instance_groups(config, findings)
    check_dynamic_batching(config, findings)
    if config.HasField("sequence_batching"):
        check_sequence_batching(config, findings)
    check_warmup(config, findings, files)
    check_version_policy(config, findings)
    check_transaction_and_cache(config, findings)
    check_optimization(config, findings)


# --- generic -----------------------------------------------------------------


def check_enums(message: Message, path: str, findings: Findings) -> None:
    """Every enum field holds a value its enum defines (numbers in the text are accepted by protobuf)."""
    for fd, value in message.ListFields():
        where = f"{path}{fd.name}"
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            values = value.values()
            if fd.message_type.fields_by_name["value"].message_type is not None:
                for item in values:
                    check_enums(item, f"{where}.", findings)
        elif fd.message_type is not None:
            items = value if _is_repeated(fd) else [value]
            for index, item in enumerate(items):
                suffix = f"[{index}]." if _is_repeated(fd) else "."
                check_enums(item, f"{where}{suffix}", findings)
        elif fd.enum_type is not None:
            for number in value if _is_repeated(fd) else [value]:
                if fd.enum_type.values_by_number.get(number) is None:
                    names = ", ".join(v.name for v in fd.enum_type.values)
                    findings.add(where, f"unknown value {number} (expected one of {names})")


def _is_repeated(fd: object) -> bool:
    is_repeated = getattr(fd, "is_repeated", None)
    if isinstance(is_repeated, bool):
        return is_repeated
    return bool(fd.label == fd.LABEL_REPEATED)  # type: ignore[attr-defined]


def check_identity(config: pb.ModelConfig, findings: Findings) -> None:
    """Platform and backend name something this server runs, and agree with each other."""
    if config.max_batch_size < 0:
        findings.add("max_batch_size", f"must be >= 0, got {config.max_batch_size}")
    platform, backend = config.platform, config.backend
    if platform and platform not in platforms.SUPPORTED_PLATFORMS:
        findings.add("platform", _unsupported("platform", platform, platforms.TRITON_ONLY_PLATFORMS))
    if backend and backend not in platforms.SUPPORTED_BACKENDS:
        findings.add("backend", _unsupported("backend", backend, platforms.TRITON_ONLY_BACKENDS))
    expected = platforms.PLATFORM_BACKEND.get(platform)
    if expected and backend and backend != expected:
        findings.add("backend", f"'{backend}' does not match platform '{platform}' (expects '{expected}')")
    if platform == platforms.ENSEMBLE and backend:
        findings.add("backend", f"an ensemble has no backend, got '{backend}'")
    if not platform and not backend:
        findings.add(
            "platform",
            "neither platform nor backend is set, and no model file names one "
            "(expected model.onnx, model.pt, model.plan or model.py)",
        )


def _unsupported(what: str, name: str, triton_only: frozenset[str]) -> str:
    supported = platforms.SUPPORTED_PLATFORMS if what == "platform" else platforms.SUPPORTED_BACKENDS
    choices = ", ".join(sorted(supported))
    if name in triton_only:
        return f"{what} '{name}' is not supported by this server (supported: {choices})"
    return f"unknown {what} '{name}' (supported: {choices})"


# --- inputs and outputs -------------------------------------------------------


def check_tensors(config: pb.ModelConfig, findings: Findings, files: ModelFiles) -> None:
    is_trt = platforms.backend_for(config.platform, config.backend) == "tensorrt"
    for kind, tensors in (("input", config.input), ("output", config.output)):
        check_unique((t.name for t in tensors), kind, findings)
        for index, tensor in enumerate(tensors):
            where = f"{kind}[{index}]" + (f" '{tensor.name}'" if tensor.name else "")
            _check_tensor(tensor, where, findings)
            if tensor.is_shape_tensor and not is_trt:
                findings.add(
                    f"{where}.is_shape_tensor", "shape tensors are supported only for TensorRT models"
                )
    for index, tensor in enumerate(config.input):
        if tensor.format != pb.ModelInput.FORMAT_NONE and len(tensor.dims) != 3:
            findings.add(
                f"input[{index}] '{tensor.name}'.format",
                f"{pb.ModelInput.Format.Name(tensor.format)} needs exactly 3 dims, got {list(tensor.dims)}",
            )
    for index, output in enumerate(config.output):
        if output.label_filename and not files.exists(output.label_filename):
            findings.add(
                f"output[{index}] '{output.name}'.label_filename",
                f"label file '{output.label_filename}' not found in the model folder",
            )


def _check_tensor(tensor: pb.ModelInput | pb.ModelOutput, where: str, findings: Findings) -> None:
    if not tensor.name:
        findings.add(f"{where}.name", "must not be empty")
    if tensor.data_type == pb.TYPE_INVALID:
        findings.add(f"{where}.data_type", "is required (e.g. TYPE_FP32)")
    if not tensor.dims and not tensor.is_shape_tensor:
        findings.add(
            f"{where}.dims", "must not be empty (use dims: [ 1 ] with reshape: { shape: [ ] } for scalars)"
        )
    check_dims(tensor.dims, f"{where}.dims", findings)
    if tensor.HasField("reshape"):
        check_dims(tensor.reshape.shape, f"{where}.reshape.shape", findings)
        _check_reshape(list(tensor.dims), list(tensor.reshape.shape), where, findings)


def _check_reshape(dims: list[int], shape: list[int], where: str, findings: Findings) -> None:
    variable_dims, variable_shape = dims.count(-1), shape.count(-1)
    if variable_dims != variable_shape:
        findings.add(
            f"{where}.reshape",
            f"dims {dims} and reshape {shape} must have the same number of variable-size (-1) dimensions",
        )
        return
    fixed_dims = math.prod(d for d in dims if d != -1)
    fixed_shape = math.prod(d for d in shape if d != -1)
    if fixed_dims != fixed_shape:
        findings.add(
            f"{where}.reshape",
            f"element count mismatch: dims {dims} hold {fixed_dims} elements, reshape {shape} holds {fixed_shape}",
        )


def check_batch_io(config: pb.ModelConfig, findings: Findings) -> None:
    """batch_input / batch_output name existing tensors on a batching model."""
    inputs = {t.name for t in config.input}
    outputs = {t.name for t in config.output}
    if (config.batch_input or config.batch_output) and config.max_batch_size == 0:
        findings.add("batch_input", "batch inputs and outputs need max_batch_size > 0")
    for index, item in enumerate(config.batch_input):
        where = f"batch_input[{index}]"
        if not item.target_name:
            findings.add(f"{where}.target_name", "must name at least one input")
        if item.data_type not in _BATCH_INPUT_TYPES:
            findings.add(f"{where}.data_type", "must be TYPE_INT32 or TYPE_FP32")
        for source in item.source_input:
            if source not in inputs:
                findings.add(f"{where}.source_input", f"'{source}' is not an input of the model")
    for index, out in enumerate(config.batch_output):
        where = f"batch_output[{index}]"
        for target in out.target_name:
            if target not in outputs:
                findings.add(f"{where}.target_name", f"'{target}' is not an output of the model")
        for source in out.source_input:
            if source not in inputs:
                findings.add(f"{where}.source_input", f"'{source}' is not an input of the model")


# --- scheduling ---------------------------------------------------------------


def check_ensemble_shape(config: pb.ModelConfig, findings: Findings) -> None:
    """What an ensemble may and must carry (its steps are checked in ensemble_rules)."""
    if not config.HasField("ensemble_scheduling"):
        findings.add("ensemble_scheduling", "an ensemble needs ensemble_scheduling with at least one step")
    elif not config.ensemble_scheduling.step:
        findings.add("ensemble_scheduling.step", "an ensemble needs at least one step")
    if config.instance_group:
        findings.add("instance_group", "an ensemble has no instances of its own; remove instance_group")
    if config.model_warmup:
        findings.add("model_warmup", "warmup cannot be specified for an ensemble")
    if not config.input:
        findings.add("input", "an ensemble needs at least one input")
    if not config.output:
        findings.add("output", "an ensemble needs at least one output")


def check_not_ensemble(config: pb.ModelConfig, findings: Findings) -> None:
    if config.HasField("ensemble_scheduling"):
        platform = config.platform or config.backend or "(none)"
        findings.add("ensemble_scheduling", f"only allowed with platform \"ensemble\", not '{platform}'")


def check_instance_groups(config: pb.ModelConfig, findings: Findings) -> None:
    backend = platforms.backend_for(config.platform, config.backend)
    check_unique((g.name for g in config.instance_group), "instance_group", findings)
    for index, group in enumerate(config.instance_group):
        where = f"instance_group[{index}]" + (f" '{group.name}'" if group.name else "")
        if group.count < 0:
            findings.add(f"{where}.count", f"must be >= 1, got {group.count}")
        if group.gpus and group.kind in (Kind.KIND_CPU, Kind.KIND_MODEL):
            findings.add(f"{where}.gpus", f"gpus cannot be set for {Kind.Name(group.kind)}")
        for gpu in group.gpus:
            if gpu < 0:
                findings.add(f"{where}.gpus", f"GPU id must be >= 0, got {gpu}")
        if group.profile and backend != "tensorrt":
            findings.add(f"{where}.profile", "optimization profiles are supported only for TensorRT models")
        if group.secondary_devices and group.kind != Kind.KIND_GPU:
            findings.add(f"{where}.secondary_devices", "secondary devices need kind KIND_GPU")


def check_dynamic_batching(config: pb.ModelConfig, findings: Findings) -> None:
    if not config.HasField("dynamic_batching"):
        return
    batching = config.dynamic_batching
    _check_preferred(batching.preferred_batch_size, config.max_batch_size, "dynamic_batching", findings)
    levels, default = batching.priority_levels, batching.default_priority_level
    where = "dynamic_batching"
    if levels == 0 and default != 0:
        findings.add(f"{where}.default_priority_level", "is set but priority_levels is 0")
    if levels > 0 and not 1 <= default <= levels:
        findings.add(
            f"{where}.default_priority_level",
            f"must be between 1 and priority_levels ({levels}), got {default}",
        )
    for level in batching.priority_queue_policy:
        if not 1 <= level <= levels:
            findings.add(
                f"{where}.priority_queue_policy",
                f"priority level {level} is outside 1..priority_levels ({levels})",
            )


def _check_preferred(sizes: Sequence[int], max_batch_size: int, where: str, findings: Findings) -> None:
    for size in sizes:
        if size < 1:
            findings.add(f"{where}.preferred_batch_size", f"must be >= 1, got {size}")
        elif size > max_batch_size:
            findings.add(
                f"{where}.preferred_batch_size",
                f"{size} is above max_batch_size {max_batch_size}"
                + (" (the model does not batch)" if max_batch_size == 0 else ""),
            )


# --- warmup, versions, policies -------------------------------------------------


def check_warmup(config: pb.ModelConfig, findings: Findings, files: ModelFiles) -> None:
    inputs = {t.name: t for t in config.input}
    controls = {c.name for c in config.sequence_batching.control_input}
    limit = max(1, config.max_batch_size)
    for index, sample in enumerate(config.model_warmup):
        where = f"model_warmup[{index}]" + (f" '{sample.name}'" if sample.name else "")
        if not sample.name:
            findings.add(f"{where}.name", "must not be empty")
        if not 1 <= sample.batch_size <= limit:
            findings.add(f"{where}.batch_size", f"must be between 1 and {limit}, got {sample.batch_size}")
        for name, value in sample.inputs.items():
            spec = inputs.get(name)
            if spec is None and name not in controls:
                findings.add(f"{where}.inputs", f"'{name}' is not an input of the model")
                continue
            if spec is not None and value.data_type != spec.data_type:
                findings.add(
                    f"{where}.inputs['{name}'].data_type",
                    f"{pb.DataType.Name(value.data_type)} does not match the input's "
                    f"{pb.DataType.Name(spec.data_type)}",
                )
            check_dims(value.dims, f"{where}.inputs['{name}'].dims", findings)
            if value.WhichOneof("input_data_type") is None:
                findings.add(
                    f"{where}.inputs['{name}']", "set one of zero_data, random_data or input_data_file"
                )
            if value.input_data_file and not files.exists(f"warmup/{value.input_data_file}"):
                findings.add(
                    f"{where}.inputs['{name}'].input_data_file",
                    f"'warmup/{value.input_data_file}' not found in the model folder",
                )
        for name, spec in inputs.items():
            if not spec.optional and name not in sample.inputs:
                findings.add(f"{where}.inputs", f"input '{name}' is missing")


def check_version_policy(config: pb.ModelConfig, findings: Findings) -> None:
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "latest" and policy.latest.num_versions < 1:
        findings.add("version_policy.latest.num_versions", "must be >= 1")
    if choice == "specific":
        if not policy.specific.versions:
            findings.add("version_policy.specific.versions", "must list at least one version")
        for version in policy.specific.versions:
            if version < 1:
                findings.add(
                    "version_policy.specific.versions", f"version {version} is invalid (must be >= 1)"
                )


def check_transaction_and_cache(config: pb.ModelConfig, findings: Findings) -> None:
    decoupled = config.model_transaction_policy.decoupled
    backend = platforms.backend_for(config.platform, config.backend)
    if decoupled and config.platform != platforms.ENSEMBLE and backend not in platforms.DECOUPLED_BACKENDS:
        findings.add(
            "model_transaction_policy.decoupled", f"backend '{backend}' does not support decoupled models"
        )
    if decoupled and config.response_cache.enable:
        findings.add("response_cache.enable", "the response cache does not support decoupled models")


def check_optimization(config: pb.ModelConfig, findings: Findings) -> None:
    accelerators = config.optimization.execution_accelerators
    for field_name, known in _ACCELERATORS.items():
        for index, accelerator in enumerate(getattr(accelerators, field_name)):
            if accelerator.name not in known:
                findings.add(
                    f"optimization.execution_accelerators.{field_name}[{index}].name",
                    f"unknown execution accelerator '{accelerator.name}' (known: {', '.join(sorted(known))})",
                )
