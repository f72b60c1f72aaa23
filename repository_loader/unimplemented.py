"""Config fields this server accepts but does not act on: never silently ignored.

Each entry says what Triton does with the field and what this server does
instead. ``WARN`` fields leave a model's results unchanged (a cache, a
scheduler hint, a memory or GPU tuning knob): the model loads, and a warning
naming the field goes to the log and to ``triton-serve validate``. ``FAIL``
fields would change what the model computes or what it receives if ignored
(batch inputs/outputs, repository agents that decrypt or transform files):
the model does not load.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from repository_loader import platforms
from repository_loader.findings import Findings
from repository_loader.proto import model_config_pb2 as pb


class Policy(str, Enum):
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Unimplemented:
    """One field (a dotted path) this server does not implement, and why that matters."""

    field: str
    policy: Policy
    consequence: str
    present: Callable[[pb.ModelConfig], bool]


def _any_group(test: Callable[[pb.ModelInstanceGroup], bool]) -> Callable[[pb.ModelConfig], bool]:
    return lambda config: any(test(group) for group in config.instance_group)


def _optimization(name: str) -> Callable[[pb.ModelConfig], bool]:
    return lambda config: config.optimization.HasField(name)


def _not_onnx(test: Callable[[pb.ModelConfig], bool]) -> Callable[[pb.ModelConfig], bool]:
    """The ONNX Runtime backend reads this optimization setting; other backends do not."""
    return lambda config: (
        platforms.backend_for(config.platform, config.backend) != "onnxruntime" and test(config)
    )


def _any_state(test: Callable[[pb.ModelSequenceBatching.State], bool]) -> Callable[[pb.ModelConfig], bool]:
    return lambda config: any(test(state) for state in config.sequence_batching.state)


UNIMPLEMENTED: tuple[Unimplemented, ...] = (
    Unimplemented(
        "batch_input",
        Policy.FAIL,
        "batch inputs are not produced by this server; the model would not receive them",
        lambda c: bool(c.batch_input),
    ),
    Unimplemented(
        "batch_output",
        Policy.FAIL,
        "batch outputs are not scattered by this server; responses would carry the whole batch",
        lambda c: bool(c.batch_output),
    ),
    Unimplemented(
        "model_repository_agents",
        Policy.FAIL,
        "repository agents are not run by this server; the model files would be used untransformed",
        lambda c: bool(c.model_repository_agents.agents),
    ),
    Unimplemented(
        "instance_group.host_policy",
        Policy.WARN,
        "host policies (--host-policy) are not implemented; instances use the default placement",
        _any_group(lambda g: bool(g.host_policy)),
    ),
    Unimplemented(
        "instance_group.secondary_devices",
        Policy.WARN,
        "secondary devices (TensorRT DLA) are not used",
        _any_group(lambda g: bool(g.secondary_devices)),
    ),
    Unimplemented(
        "instance_group.profile",
        Policy.WARN,
        "instances are not bound to the listed TensorRT profiles; a request uses the first profile that fits",
        _any_group(lambda g: bool(g.profile)),
    ),
    Unimplemented(
        "model_operations",
        Policy.WARN,
        "custom operation libraries are not loaded",
        lambda c: bool(c.model_operations.op_library_filename),
    ),
    Unimplemented(
        "model_metrics",
        Policy.WARN,
        "per-model metric controls (histogram buckets) are not applied",
        lambda c: bool(c.model_metrics.metric_control),
    ),
    Unimplemented(
        "metric_tags",
        Policy.WARN,
        "metric tags are not added to the model's metrics",
        lambda c: bool(c.metric_tags),
    ),
    Unimplemented(
        "runtime",
        Policy.WARN,
        "backend runtimes are not selectable; the backend's built-in runtime is used",
        lambda c: bool(c.runtime) and not platforms.is_python_based(c),
    ),
    Unimplemented(
        "ensemble_scheduling.max_inflight_requests",
        Policy.WARN,
        "the ensemble does not limit its in-flight requests",
        lambda c: c.ensemble_scheduling.max_inflight_requests > 0,
    ),
    Unimplemented(
        "sequence_batching.state.use_growable_memory",
        Policy.WARN,
        "state buffers are ordinary host/device tensors; growable memory is not used",
        _any_state(lambda s: s.use_growable_memory),
    ),
    Unimplemented(
        "parameters.EXECUTION_ENV_PATH",
        Policy.WARN,
        "Python models run in the server's own environment; the packed environment is not unpacked",
        lambda c: "EXECUTION_ENV_PATH" in c.parameters,
    ),
    Unimplemented(
        "optimization.cuda",
        Policy.WARN,
        "CUDA graphs, busy-wait events and output copy streams are not used",
        _optimization("cuda"),
    ),
    Unimplemented(
        "optimization.priority",
        Policy.WARN,
        "model priority is not applied",
        lambda c: c.optimization.priority != pb.ModelOptimizationPolicy.PRIORITY_DEFAULT,
    ),
    Unimplemented(
        "optimization.input_pinned_memory",
        Policy.WARN,
        "input copies do not use pinned memory",
        lambda c: (
            c.optimization.HasField("input_pinned_memory") and c.optimization.input_pinned_memory.enable
        ),
    ),
    Unimplemented(
        "optimization.output_pinned_memory",
        Policy.WARN,
        "output copies do not use pinned memory",
        lambda c: (
            c.optimization.HasField("output_pinned_memory") and c.optimization.output_pinned_memory.enable
        ),
    ),
    Unimplemented(
        "optimization.gather_kernel_buffer_threshold",
        Policy.WARN,
        "the gather kernel is not used",
        lambda c: c.optimization.gather_kernel_buffer_threshold > 0,
    ),
    Unimplemented(
        "optimization.eager_batching",
        Policy.WARN,
        "eager batching is not implemented",
        lambda c: c.optimization.eager_batching,
    ),
    Unimplemented(
        "optimization.graph",
        Policy.WARN,
        "graph optimization levels are applied by the ONNX Runtime backend only",
        _not_onnx(_optimization("graph")),
    ),
    Unimplemented(
        "optimization.execution_accelerators",
        Policy.WARN,
        "execution accelerators are applied by the ONNX Runtime backend only",
        _not_onnx(_optimization("execution_accelerators")),
    ),
)


def check_unimplemented(config: pb.ModelConfig, findings: Findings) -> None:
    """Warn about (or refuse) each field of ``config`` this server does not act on."""
    for item in UNIMPLEMENTED:
        if not item.present(config):
            continue
        if item.policy is Policy.FAIL:
            findings.add(item.field, f"not implemented by this server: {item.consequence}")
        else:
            findings.warn(item.field, f"not implemented by this server, ignored: {item.consequence}")


def unimplemented_fields() -> dict[str, str]:
    """Field -> policy, for documentation and tests."""
    return {item.field: item.policy.value for item in UNIMPLEMENTED}
