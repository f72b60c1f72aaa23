"""Triton's rules for one model's configuration (its ``model_config_utils.cc``).

Every rule that fails adds one message naming the model, the config file and
the field, followed by Triton's own wording for the problem (operators grep
their logs for it); all of a model's problems are reported together. Inputs and
outputs are checked in :mod:`repository_loader.io_rules`, sequence batching in
:mod:`repository_loader.sequence_rules`, fields the server does not act on in
:mod:`repository_loader.unimplemented`; rules that involve other models
(ensemble steps) live in :mod:`repository_loader.ensemble_rules`.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import Message

from repository_loader import platforms
from repository_loader.autoscaling import parse_autoscaling
from repository_loader.datatypes import config_to_wire
from repository_loader.errors import InvalidArgument
from repository_loader.findings import Findings, ModelFiles, check_dims, check_unique
from repository_loader.io_rules import check_batch_io, check_tensors
from repository_loader.proto import model_config_pb2 as pb
from repository_loader.sequence_rules import check_sequence_batching
from repository_loader.unimplemented import check_unimplemented

Kind = pb.ModelInstanceGroup.Kind
Timeout = pb.ModelQueuePolicy.TimeoutAction
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
    check_model_metrics(config, findings)
    check_rate_limiter(config, findings)
    check_autoscaling(config, findings)
    check_unimplemented(config, findings)


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
    name = config.name
    if config.max_batch_size < 0:
        findings.add(
            "max_batch_size",
            f"'max_batch_size' must be non-negative value for {name} (got {config.max_batch_size})",
        )
    platform, backend = config.platform, config.backend
    if platform and platform not in platforms.SUPPORTED_PLATFORMS:
        findings.add("platform", _unsupported("platform", platform, platforms.TRITON_ONLY_PLATFORMS))
    if backend and backend not in platforms.SUPPORTED_BACKENDS and not platforms.is_python_based(config):
        findings.add("backend", _unsupported("backend", backend, platforms.TRITON_ONLY_BACKENDS))
    expected = platforms.PLATFORM_BACKEND.get(platform)
    if expected and backend and backend != expected:
        findings.add(
            "backend",
            f"unexpected 'platform' and 'backend' pair, got:{platform}, {backend} "
            f"(platform '{platform}' expects backend '{expected}')",
        )
    if platform == platforms.ENSEMBLE and backend:
        findings.add(
            "backend",
            f"Ensemble model '{name}' must have platform type '{platform}' and empty backend type "
            f"(got backend '{backend}')",
        )
    if not platform and not backend:
        findings.add(
            "platform",
            f"must specify 'platform' or 'backend' for '{name}' (no model file names one either: "
            "expected model.onnx, model.pt, model.plan or model.py)",
        )


def _unsupported(what: str, name: str, triton_only: frozenset[str]) -> str:
    supported = platforms.SUPPORTED_PLATFORMS if what == "platform" else platforms.SUPPORTED_BACKENDS
    choices = ", ".join(sorted(supported))
    python_based = (
        ""
        if what == "platform"
        else f", or a Python-based backend's {name}/model.py in the backend directory"
    )
    if name in triton_only:
        return f"{what} '{name}' is not supported by this server (supported: {choices}{python_based})"
    return f"unknown {what} '{name}' (supported: {choices}{python_based})"


# --- scheduling ---------------------------------------------------------------


def check_ensemble_shape(config: pb.ModelConfig, findings: Findings) -> None:
    """What an ensemble may and must carry (its steps are checked in ensemble_rules)."""
    name = config.name
    if not config.HasField("ensemble_scheduling"):
        findings.add(
            "ensemble_scheduling",
            f"ensemble scheduling must be set for ensemble {name} whose platform is ensemble",
        )
    elif not config.ensemble_scheduling.step:
        findings.add("ensemble_scheduling.step", f"must specify 'step' for ensemble '{name}'")
    if config.instance_group:
        findings.add("instance_group", f"instance group should not be specified for ensemble '{name}'")
    if config.HasField("optimization"):
        findings.add("optimization", f"optimization should not be specified for ensemble '{name}'")
    if config.model_warmup:
        findings.add("model_warmup", f"model_warmup can not be specified for ensemble '{name}'")
    if not config.input:
        findings.add("input", "an ensemble needs at least one input")
    if not config.output:
        findings.add("output", "an ensemble needs at least one output")


def check_not_ensemble(config: pb.ModelConfig, findings: Findings) -> None:
    if config.HasField("ensemble_scheduling"):
        findings.add(
            "ensemble_scheduling",
            f"ensemble scheduling cannot be set for model '{config.name}' whose platform is not ensemble "
            f"(platform '{config.platform or config.backend or ''}')",
        )


def _group_label(config: pb.ModelConfig, index: int, group: pb.ModelInstanceGroup) -> str:
    """The group's name as Triton reports it (``<model>_<index>`` when unnamed)."""
    return f"instance group {group.name or f'{config.name}_{index}'} of model {config.name}"


def check_instance_groups(config: pb.ModelConfig, findings: Findings) -> None:
    """Triton's ``ValidateInstanceGroup`` (GPU availability is the deployment plan's to judge)."""
    backend = platforms.effective_backend(config)
    check_unique((g.name for g in config.instance_group), "instance_group", findings)
    for index, group in enumerate(config.instance_group):
        where = f"instance_group[{index}]" + (f" '{group.name}'" if group.name else "")
        label = _group_label(config, index, group)
        if group.gpus and group.kind in (Kind.KIND_CPU, Kind.KIND_MODEL):
            findings.add(
                f"{where}.gpus", f"{label} has kind {Kind.Name(group.kind)} but specifies one or more GPUs"
            )
        for gpu in group.gpus:
            if gpu < 0:
                findings.add(f"{where}.gpus", f"{label} specifies invalid or unsupported gpu id {gpu}")
        if group.profile and backend != "tensorrt":
            findings.add(
                f"{where}.profile",
                f"{label} and platform {config.platform} specifies profile field which is only supported "
                "for TensorRT models",
            )
        for profile in group.profile if backend == "tensorrt" else ():
            if not profile.strip().isdigit():
                findings.add(
                    f"{where}.profile",
                    f"{label} and platform {config.platform} specifies invalid profile {profile}. The field "
                    "should contain the string representation of a non-negative integer.",
                )
        if group.secondary_devices and group.kind != Kind.KIND_GPU:
            findings.add(f"{where}.secondary_devices", "secondary devices need kind KIND_GPU")


def check_dynamic_batching(config: pb.ModelConfig, findings: Findings) -> None:
    """Preferred sizes, priority levels and ``preserve_ordering`` as Triton checks them."""
    if not config.HasField("dynamic_batching"):
        return
    batching, name, where = config.dynamic_batching, config.name, "dynamic_batching"
    _check_preferred(batching.preferred_batch_size, config.max_batch_size, name, findings)
    levels, default = batching.priority_levels, batching.default_priority_level
    if levels == 0 and (default != 0 or batching.priority_queue_policy):
        findings.warn(
            f"{where}.default_priority_level",
            "priority_levels is 0, so default_priority_level and priority_queue_policy are ignored",
        )
    if levels > 0 and not 1 <= default <= levels:
        findings.add(
            f"{where}.default_priority_level",
            f"default priority level must be in range [1, {levels}] for {name} (got {default})",
        )
    for level in batching.priority_queue_policy if levels > 0 else ():
        if not 1 <= level <= levels:
            findings.add(
                f"{where}.priority_queue_policy",
                f"priority queue policy must have priority level in range [1, {levels}] for {name} "
                f"(got {level})",
            )
    if batching.preserve_ordering:
        _check_preserve_ordering(batching, name, findings)


def _check_preserve_ordering(batching: pb.ModelDynamicBatching, name: str, findings: Findings) -> None:
    where = "dynamic_batching.preserve_ordering"
    if batching.priority_levels > 1:
        findings.add(where, f"Only one priority level is allowed when 'preserve_ordering' is true for {name}")
    policies = [("default_queue_policy", batching.default_queue_policy)] + [
        (f"priority_queue_policy[{level}]", policy)
        for level, policy in batching.priority_queue_policy.items()
    ]
    for label, policy in policies:
        if policy.default_timeout_microseconds != 0 and policy.timeout_action == Timeout.DELAY:
            findings.add(
                f"dynamic_batching.{label}.timeout_action",
                f"Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for {name}",
            )


def _check_preferred(sizes: Sequence[int], max_batch_size: int, name: str, findings: Findings) -> None:
    where = "dynamic_batching.preferred_batch_size"
    for size in sizes:
        if size <= 0:
            findings.add(where, f"dynamic batching preferred size must be positive for {name} (got {size})")
        elif size > max_batch_size:
            findings.add(
                where,
                f"dynamic batching preferred size must be <= max batch size for {name} "
                f"({size} is above max_batch_size {max_batch_size}"
                + (", the model does not batch)" if max_batch_size == 0 else ")"),
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
                    f"inference input '{name}' data-type is '{_protocol_name(value.data_type)}', "
                    f"but model '{config.name}' expects '{_protocol_name(spec.data_type)}'",
                )
            check_dims(value.dims, f"{where}.inputs['{name}'].dims", findings)
            if -1 in value.dims:
                findings.add(
                    f"{where}.inputs['{name}'].dims",
                    "warmup setting expects all variable-size dimensions are specified for input "
                    f"'{name}' (got {list(value.dims)})",
                )
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


def _protocol_name(data_type: int) -> str:
    """Triton's ``DataTypeToProtocolString``: ``TYPE_FP32`` -> ``FP32``, ``<invalid>`` when unset."""
    try:
        return config_to_wire(pb.DataType.Name(data_type))
    except InvalidArgument:
        return "<invalid>"


def check_version_policy(config: pb.ModelConfig, findings: Findings) -> None:
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "latest" and policy.latest.num_versions < 1:
        findings.add(
            "version_policy.latest.num_versions",
            f"at least one version must be available under the version policy of model '{config.name}'",
        )
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
    backend = platforms.effective_backend(config)
    if decoupled and config.platform != platforms.ENSEMBLE and backend not in platforms.DECOUPLED_BACKENDS:
        findings.add(
            "model_transaction_policy.decoupled", f"backend '{backend}' does not support decoupled models"
        )
    if decoupled and config.response_cache.enable:
        findings.add(
            "response_cache.enable",
            f"Response Cache does not currently support model {config.name} with 'decoupled' transaction "
            "policy. Please disable the response cache.",
        )


def check_optimization(config: pb.ModelConfig, findings: Findings) -> None:
    accelerators = config.optimization.execution_accelerators
    for field_name, known in _ACCELERATORS.items():
        for index, accelerator in enumerate(getattr(accelerators, field_name)):
            if accelerator.name not in known:
                findings.add(
                    f"optimization.execution_accelerators.{field_name}[{index}].name",
                    f"unknown execution accelerator '{accelerator.name}' (known: {', '.join(sorted(known))})",
                )


def check_model_metrics(config: pb.ModelConfig, findings: Findings) -> None:
    """Triton's ``ValidateModelMetrics``."""
    for index, control in enumerate(config.model_metrics.metric_control):
        where = f"model_metrics.metric_control[{index}]"
        if not control.HasField("metric_identifier"):
            findings.add(where, "metric control must specify 'metric_identifier'")
        elif not control.metric_identifier.family:
            findings.add(f"{where}.metric_identifier", "metric identifier must specify non-empty 'family'")
        if not control.HasField("histogram_options"):
            findings.add(where, "metric control must specify 'histogram_options'")
        elif not control.histogram_options.buckets:
            findings.add(f"{where}.histogram_options", "histogram options must specify non-empty 'buckets'")


def check_rate_limiter(config: pb.ModelConfig, findings: Findings) -> None:
    """Each rate-limiter resource has a name, once per group."""
    for index, group in enumerate(config.instance_group):
        where = f"instance_group[{index}].rate_limiter.resources"
        names = [(r.name, getattr(r, "global")) for r in group.rate_limiter.resources]
        for position, (name, _) in enumerate(names):
            if not name:
                findings.add(f"{where}[{position}].name", "rate limiter resource must specify 'name'")
        for name, is_global in set(names):
            if name and names.count((name, is_global)) > 1:
                findings.add(where, f"resource '{name}' is listed more than once")


def check_autoscaling(config: pb.ModelConfig, findings: Findings) -> None:
    """The ``ray.autoscaling.*`` parameters (``repository_loader.autoscaling``), where any is set."""
    parameters = {k: v.string_value for k, v in config.parameters.items()}
    _, problems = parse_autoscaling(parameters, stateful=config.HasField("sequence_batching"))
    for key, problem in problems:
        findings.add(f"parameters '{key}'", problem)
