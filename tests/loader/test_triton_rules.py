"""One case per Triton config rule: the model fails with Triton's wording, prefixed by model, file and field.

Complements the tests/loader/broken corpus (one folder per rule) with rules written inline.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from onnx import TensorProto

from repository_loader.repository import load_repository

from .conftest import onnx_model_bytes

PT = {"1/model.pt": b""}
IO = """
    input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
HEAD = 'backend: "pytorch"\nmax_batch_size: 8\n'


def _pt(extra: str, io: str = IO, head: str = HEAD) -> tuple[str, dict[str, bytes | str]]:
    return head + io + extra, PT


def _io(tensor: str) -> str:
    return f'input [ {{ name: "x" data_type: TYPE_FP32 {tensor} }} ]\noutput [ {{ name: "y" data_type: TYPE_FP32 dims: [ 4 ] }} ]\n'


def _seq(controls: str, strategy: str = "") -> str:
    return f"sequence_batching {{ {strategy} control_input [ {controls} ] }}\n"


START = '{ name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }'

# case id -> (config, files, field, Triton's words)
CASES: dict[str, tuple[str, dict[str, bytes | str], str, str]] = {
    # inputs, outputs, reshape
    "dims_zero": (
        *_pt("", _io("dims: [ 0 ]")),
        "input[0] 'x'.dims",
        "model input 'x' dimension must be integer >= 1",
    ),
    "reshape_dims_zero": (
        *_pt("", _io("dims: [ 4 ] reshape { shape: [ 0 ] }")),
        "'x'.reshape.shape",
        "model input 'x' reshape dimension must be integer >= 1, or -1 to indicate a variable-size dimension",
    ),
    "reshape_size": (
        *_pt("", _io("dims: [ 2, 4 ] reshape { shape: [ 6 ] }")),
        "'x'.reshape",
        "model input 'x' has different size for dims and reshape for m",
    ),
    "reshape_variable_chunks": (
        *_pt("", _io("dims: [ 2, 4, -1, 6 ] reshape { shape: [ 8, -1, 2, 6 ] }")),
        "'x'.reshape",
        "model input 'x' has different size for dims and reshape",
    ),
    "reshape_variable_count": (
        *_pt("", _io("dims: [ 2, -1, 4 ] reshape { shape: [ 2, -1, 4, -1 ] }")),
        "'x'.reshape",
        "model input 'x' has different number of variable-size dimensions for dims and reshape",
    ),
    "empty_reshape_not_batching": (
        *_pt("", _io("dims: [ 1 ] reshape { shape: [ ] }"), 'backend: "pytorch"\n'),
        "'x'.reshape",
        "model input 'x' cannot have empty reshape for non-batching model as scalar tensors are not supported",
    ),
    "output_data_type": (
        HEAD
        + 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]\noutput [ { name: "y" dims: [ 4 ] } ]',
        PT,
        "output[0] 'y'.data_type",
        "model output 'y' must specify 'data_type'",
    ),
    "non_linear_not_trt": (
        *_pt("", _io("dims: [ 3, 4, 4 ] is_non_linear_format_io: true")),
        "'x'.is_non_linear_format_io",
        "Non-linear IO format is only supported for the TensorRT platform",
    ),
    # batch inputs and outputs
    "batch_input_two_sources": (
        *_pt(
            'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: [ "c" ] data_type: TYPE_INT32 '
            'source_input: [ "x", "x" ] } ]'
        ),
        "batch_input[0].source_input",
        "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 2",
    ),
    "batch_output_unknown_target": (
        *_pt(
            'batch_output [ { target_name: [ "nope" ] kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: [ "x" ] } ]'
        ),
        "batch_output[0].target_name",
        "unknown target output name 'nope'",
    ),
    "batch_output_target_twice": (
        *_pt(
            'batch_output [ { target_name: [ "y", "y" ] kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: [ "x" ] } ]'
        ),
        "batch_output[0].target_name",
        "target output name 'y' can only be specified once",
    ),
    # identity
    "platform_backend_pair": (
        'platform: "tensorrt_plan"\nbackend: "pytorch"\nmax_batch_size: 8\n' + IO,
        PT,
        "backend",
        "unexpected 'platform' and 'backend' pair, got:tensorrt_plan, pytorch",
    ),
    # dynamic batching
    "preferred_not_positive": (
        *_pt("dynamic_batching { preferred_batch_size: [ 0 ] }"),
        "dynamic_batching.preferred_batch_size",
        "dynamic batching preferred size must be positive for m",
    ),
    "preferred_without_batching": (
        *_pt("dynamic_batching { preferred_batch_size: [ 2 ] }", head='backend: "pytorch"\n'),
        "dynamic_batching.preferred_batch_size",
        "dynamic batching preferred size must be <= max batch size for m",
    ),
    "preserve_ordering_priorities": (
        *_pt("dynamic_batching { preserve_ordering: true priority_levels: 2 default_priority_level: 1 }"),
        "dynamic_batching.preserve_ordering",
        "Only one priority level is allowed when 'preserve_ordering' is true for m",
    ),
    "preserve_ordering_delay": (
        *_pt(
            "dynamic_batching { preserve_ordering: true default_queue_policy "
            "{ timeout_action: DELAY default_timeout_microseconds: 100 } }"
        ),
        "dynamic_batching.default_queue_policy.timeout_action",
        "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for m",
    ),
    "preserve_ordering_delay_in_level": (
        *_pt(
            "dynamic_batching { preserve_ordering: true priority_levels: 1 default_priority_level: 1 "
            "priority_queue_policy { key: 1 value { timeout_action: DELAY default_timeout_microseconds: 5 } } }"
        ),
        "dynamic_batching.priority_queue_policy[1].timeout_action",
        "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for m",
    ),
    # sequence batching
    "control_tensor_twice": (
        *_pt(
            _seq(
                START
                + ', { name: "START" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] }'
            )
        ),
        "sequence_batching.control_input",
        "sequence batching control tensor 'START' is specified for multiple control kinds for m",
    ),
    "control_without_name": (
        *_pt(_seq("{ control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }")),
        "sequence_batching.control_input[0].name",
        "sequence batching control tensor must have a name for m",
    ),
    "control_two_value_kinds": (
        *_pt(
            _seq(
                '{ name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] '
                "fp32_false_true: [ 0, 1 ] } ] }"
            )
        ),
        "sequence_batching.control_input[0] 'S'.control",
        "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and "
        "'bool_false_true' for CONTROL_SEQUENCE_START for m",
    ),
    "corrid_with_values": (
        *_pt(
            _seq(
                '{ name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 '
                "int32_false_true: [ 0, 1 ] } ] }"
            )
        ),
        "sequence_batching.control_input[0] 'C'.control",
        "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' "
        "for CONTROL_SEQUENCE_CORRID for m",
    ),
    "oldest_preferred_above_max": (
        *_pt(_seq(START, "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 16 ] }")),
        "sequence_batching.oldest.preferred_batch_size",
        "sequence batching preferred batch size must be <= max batch size for m",
    ),
    "direct_slot_utilization": (
        *_pt(_seq(START, "direct { minimum_slot_utilization: 1.5 }")),
        "sequence_batching.direct.minimum_slot_utilization",
        "sequence batching minimum slot utilization must be in range (0.0, 1.0] for m",
    ),
    "sequence_with_cache": (
        *_pt(_seq(START) + "response_cache { enable: true }"),
        "response_cache.enable",
        "Response Cache does not currently support model m with sequence batching scheduler. "
        "Please disable the response cache.",
    ),
    # instance groups
    "kind_model_with_gpus": (
        *_pt('instance_group [ { name: "g" kind: KIND_MODEL gpus: [ 0 ] } ]'),
        "instance_group[0] 'g'.gpus",
        "instance group g of model m has kind KIND_MODEL but specifies one or more GPUs",
    ),
    "invalid_profile": (
        'backend: "tensorrt"\nmax_batch_size: 8\n'
        + IO
        + 'instance_group [ { kind: KIND_GPU profile: [ "one" ] } ]',
        {"1/model.plan": b""},
        "instance_group[0].profile",
        "instance group m_0 of model m and platform tensorrt_plan specifies invalid profile one. The field "
        "should contain the string representation of a non-negative integer.",
    ),
    "rate_limiter_unnamed_resource": (
        *_pt("instance_group [ { kind: KIND_CPU rate_limiter { resources [ { count: 1 } ] } } ]"),
        "instance_group[0].rate_limiter.resources[0].name",
        "rate limiter resource must specify 'name'",
    ),
    # warmup
    "warmup_variable_dims": (
        HEAD
        + _io("dims: [ -1 ]")
        + 'model_warmup [ { name: "w" batch_size: 1 inputs { key: "x" value { data_type: TYPE_FP32 '
        "dims: [ -1 ] zero_data: true } } } ]",
        PT,
        "model_warmup[0] 'w'.inputs['x'].dims",
        "warmup setting expects all variable-size dimensions are specified for input 'x'",
    ),
    "warmup_data_type": (
        *_pt(
            'model_warmup [ { name: "w" batch_size: 1 inputs { key: "x" value { data_type: TYPE_INT32 '
            "dims: [ 4 ] zero_data: true } } } ]"
        ),
        "model_warmup[0] 'w'.inputs['x'].data_type",
        "inference input 'x' data-type is 'INT32', but model 'm' expects 'FP32'",
    ),
    # versions
    "latest_zero_versions": (
        *_pt("version_policy { latest { num_versions: 0 } }"),
        "version_policy.latest.num_versions",
        "at least one version must be available under the version policy of model 'm'",
    ),
    # model metrics
    "metric_control_without_family": (
        *_pt(
            "model_metrics { metric_control [ { metric_identifier { } histogram_options { buckets: [ 1 ] } } ] }"
        ),
        "model_metrics.metric_control[0].metric_identifier",
        "metric identifier must specify non-empty 'family'",
    ),
    "metric_control_without_buckets": (
        *_pt(
            'model_metrics { metric_control [ { metric_identifier { family: "f" } histogram_options { } } ] }'
        ),
        "model_metrics.metric_control[0].histogram_options",
        "histogram options must specify non-empty 'buckets'",
    ),
    # fields whose absence would change results
    "batch_input_not_produced": (
        *_pt(
            'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: [ "c" ] data_type: TYPE_INT32 '
            'source_input: [ "x" ] } ]'
        ),
        "batch_input",
        "not implemented by this server: batch inputs are not produced",
    ),
    "repository_agent": (
        *_pt('model_repository_agents { agents [ { name: "checksum" } ] }'),
        "model_repository_agents",
        "not implemented by this server: repository agents are not run",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rule_fails_with_tritons_words(case: str, repo: Path, write_model) -> None:
    config, files, field, words = CASES[case]
    write_model("m", config, files)
    state = load_repository(repo)
    assert "m" not in state.models, f"{case} loaded"
    errors = state.failed["m"]
    assert any(
        words in e and f"{field}: " in e and e.startswith("model 'm' (m/config.pbtxt): ") for e in errors
    ), errors


VALID = {
    "iterative_sequence": _pt("sequence_batching { iterative_sequence: true }"),
    "reshape_variable_chunks_agree": _pt("", _io("dims: [ 2, 4, -1, 6 ] reshape { shape: [ 8, -1, 1, 6 ] }")),
    "empty_reshape_batching": _pt("", _io("dims: [ 1 ] reshape { shape: [ ] }")),
    "preserve_ordering_one_level": _pt(
        "dynamic_batching { preserve_ordering: true priority_levels: 1 default_priority_level: 1 "
        "default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 100 } }"
    ),
    "trt_profile_index": (
        'backend: "tensorrt"\nmax_batch_size: 8\n'
        + IO
        + 'instance_group [ { kind: KIND_GPU profile: [ "0" ] } ]',
        {"1/model.plan": b""},
    ),
}


@pytest.mark.parametrize("case", sorted(VALID))
def test_what_triton_accepts_loads(case: str, repo: Path, write_model) -> None:
    config, files = VALID[case]
    write_model("m", config, files)
    state = load_repository(repo)
    assert "m" in state.models, state.failed.get("m")


@pytest.mark.parametrize(
    ("group", "count"),
    [
        ("kind: KIND_CPU count: -2", 1),  # Triton's NormalizeInstanceGroup: a count below 1 is the default
        ("kind: KIND_CPU count: 0", 1),
        ("kind: KIND_CPU", 1),
        ("kind: KIND_GPU count: -1 gpus: [ 0 ]", 1),
    ],
)
def test_instance_count_below_one_is_the_default(group: str, count: int, repo: Path, write_model) -> None:
    write_model("m", *_pt(f"instance_group [ {{ {group} }} ]"))
    model = load_repository(repo).models["m"]
    assert model.instance_groups[0].count == count
    assert (
        model.config_json["instance_group"][0]["count"] == count
    )  # the completed config, as Triton shows it


# --- ensembles: Triton's data-flow check ------------------------------------------------

MEMBERS = {
    "m": HEAD + IO,
    "m2": HEAD
    + 'input [ { name: "a" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "b" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    + 'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n',
}


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    def pairs(mapping: dict[str, str]) -> str:
        return ", ".join(f'{{ key: "{k}" value: "{v}" }}' for k, v in mapping.items())

    return f'{{ model_name: "{model}" model_version: -1 input_map [ {pairs(inputs)} ] output_map [ {pairs(outputs)} ] }}'


def _ensemble(*steps: str, inputs: tuple[str, ...] = ("IN",)) -> str:
    tensors = ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: [ 4 ] }}' for n in inputs)
    return (
        'platform: "ensemble"\nmax_batch_size: 8\n'
        f"input [ {tensors} ]\n"
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        f"ensemble_scheduling {{ step [ {', '.join(steps)} ] }}\n"
    )


# case id -> (ensemble config, field, Triton's words: the whole message after the field)
ENSEMBLE_CASES = {
    "input_not_used": (
        _ensemble(_step("m", {"x": "IN"}, {"y": "OUT"}), inputs=("IN", "SPARE")),
        "input",
        "ensemble input 'SPARE' for ensemble 'e' is not used",
    ),
    "output_in_no_step": (
        _ensemble(_step("m", {"x": "IN"}, {"y": "OTHER"})),
        "output",
        "ensemble output 'OUT' for ensemble 'e' is not used",
    ),
    "output_read_never_written": (
        _ensemble(_step("m", {"x": "IN"}, {"y": "T"}), _step("m2", {"a": "T", "b": "OUT"}, {"y": "T2"})),
        "output",
        "output 'OUT' for ensemble 'e' is not written",
    ),
    "output_depends_on_unknown_tensor": (
        _ensemble(_step("m2", {"a": "IN", "b": "NOWHERE"}, {"y": "OUT"})),
        "output",
        "output 'OUT' for ensemble 'e' is not written: at least one of its depending tensors, 'NOWHERE', "
        "is not connected",
    ),
    "output_depends_on_cycle": (
        _ensemble(
            _step("m2", {"a": "IN", "b": "T2"}, {"y": "OUT"}),
            _step("m", {"x": "T1"}, {"y": "T2"}),
            _step("m", {"x": "T2"}, {"y": "T1"}),
        ),
        "output",
        "output 'OUT' for ensemble 'e' is not written: at least one of its depending tensors, 'T1', "
        "is not connected",
    ),
    "cycle_beside_the_output": (
        _ensemble(
            _step("m", {"x": "IN"}, {"y": "OUT"}),
            _step("m", {"x": "t2"}, {"y": "t1"}),
            _step("m", {"x": "t1"}, {"y": "t2"}),
        ),
        "ensemble_scheduling.step[1] 'm'.output_map",
        "ensemble tensor 't1' is unused in ensemble 'e'",
    ),
    "unknown_tensor_beside_the_output": (
        _ensemble(_step("m", {"x": "IN"}, {"y": "OUT"}), _step("m", {"x": "NOWHERE"}, {"y": "T"})),
        "ensemble_scheduling.step[1] 'm'.input_map",
        "ensemble tensor 'NOWHERE' is unused in ensemble 'e'",
    ),
}


@pytest.mark.parametrize("case", sorted(ENSEMBLE_CASES))
def test_ensemble_data_flow_fails_with_tritons_words(case: str, repo: Path, write_model) -> None:
    config, field, words = ENSEMBLE_CASES[case]
    for name, member in MEMBERS.items():
        write_model(name, member, PT)
    write_model("e", config, {"1/": b""})
    state = load_repository(repo)
    assert "e" not in state.models, f"{case} loaded"
    assert f"model 'e' (e/config.pbtxt): {field}: {words}" in state.failed["e"], state.failed["e"]


def test_ensemble_reports_only_the_outputs_when_they_are_not_written(repo: Path, write_model) -> None:
    """Like Triton, which stops at the first problem: the tensors feeding an unwritten output are not listed again."""
    config, _, _ = ENSEMBLE_CASES["output_depends_on_cycle"]
    for name, member in MEMBERS.items():
        write_model(name, member, PT)
    write_model("e", config, {"1/": b""})
    (error,) = load_repository(repo).failed["e"]
    assert "is unused" not in error


# --- ONNX model metadata against the config ------------------------------------------

ONNX = onnx_model_bytes(
    [("a", TensorProto.FLOAT, ["batch", 3]), ("b", TensorProto.FLOAT, ["batch", 3])],
    [("s", TensorProto.FLOAT, ["batch", 3]), ("t", TensorProto.FLOAT, ["batch", 3])],
)
ONNX_CASES = {
    "input_count": (
        'input [ { name: "a" data_type: TYPE_FP32 dims: [ 3 ] } ]',
        "input: unable to load model 'm', configuration expects 1 inputs, model provides 2",
    ),
    "rank": (
        'input [ { name: "a" dims: [ 3, 1 ] }, { name: "b" dims: [ 3 ] } ]',
        "input[0] 'a'.dims: model 'm', tensor 'a': the model expects 2 dimensions (shape [-1, 3]) but the model "
        "configuration specifies 3 dimensions (an initial batch dimension because max_batch_size > 0 followed "
        "by the explicit tensor shape, making complete shape [-1, 3, 1])",
    ),
    "dims": (
        'input [ { name: "a" dims: [ 5 ] }, { name: "b" dims: [ 3 ] } ]',
        "input[0] 'a'.dims: model 'm', tensor 'a': the model expects dims [3] but the model configuration "
        "specifies dims [5]",
    ),
    "unknown_output": (
        'output [ { name: "nope" } ]',
        "output[0] 'nope': unexpected inference output 'nope', allowed outputs are: s, t",
    ),
}


def test_onnx_cpu_count_below_one_is_two(repo: Path, write_model) -> None:
    config = (
        'platform: "onnxruntime_onnx"\nmax_batch_size: 4\ninstance_group [ { kind: KIND_CPU count: -3 } ]'
    )
    write_model("m", config, {"1/model.onnx": ONNX})
    model = load_repository(repo).models["m"]
    assert model.instance_groups[0].count == 2 and model.config_json["instance_group"][0]["count"] == 2


@pytest.mark.parametrize("case", sorted(ONNX_CASES))
def test_onnx_metadata_against_the_config(case: str, repo: Path, write_model) -> None:
    tensors, words = ONNX_CASES[case]
    write_model("m", f'platform: "onnxruntime_onnx"\nmax_batch_size: 4\n{tensors}', {"1/model.onnx": ONNX})
    (error,) = load_repository(repo).failed["m"]
    assert error.startswith("model 'm' (m/1/model.onnx): ") and words in error, error


# --- Python auto_complete_config misuse -----------------------------------------------

PY_IO = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
{body}

    def execute(self, requests):
        return []
"""
PY_CASES = {
    "returns_nothing": (
        '        config.add_input({"name": "x", "data_type": "TYPE_FP32", "dims": [1]})',
        "auto_complete_config function for model 'm' must return a valid pb_utils.ModelConfig object, got NoneType",
    ),
    "flips_decoupled": (
        '        config.set_model_transaction_policy({"decoupled": False})\n        return config',
        "trying to change decoupled property in auto-complete-config for model 'm', which is already set to True",
    ),
    "input_twice_differently": (
        '        config.add_input({"name": "x", "data_type": "TYPE_FP32", "dims": [1]})\n'
        '        config.add_input({"name": "x", "data_type": "TYPE_FP32", "dims": [2]})\n        return config',
        "model 'm', tensor 'x': the model expects dims [2] but the model configuration specifies dims [1]",
    ),
    "input_without_name": (
        '        config.add_input({"data_type": "TYPE_FP32", "dims": [1]})\n        return config',
        "input in auto-complete-config function for model 'm' is missing 'name' property.",
    ),
    "changes_other_fields": (
        '        config.as_dict()["instance_group"] = [{"kind": "KIND_GPU"}]\n        return config',
        "changes 'instance_group', which auto-complete may not set",
    ),
}


@pytest.mark.parametrize("case", sorted(PY_CASES))
@pytest.mark.usefixtures("pb_utils_importable")
def test_python_auto_complete_misuse(case: str, repo: Path, write_model) -> None:
    body, words = PY_CASES[case]
    config = 'backend: "python"\nmodel_transaction_policy { decoupled: true }\n'
    write_model("m", config, {"1/model.py": PY_IO.format(body=body)})
    errors = load_repository(repo).failed["m"]
    assert any(words in e and "model 'm'" in e for e in errors), errors
