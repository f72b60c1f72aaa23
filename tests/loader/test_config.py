"""Parsing config.pbtxt, its JSON form, and the schema's agreement with Triton's."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

from repository_loader.config import (
    config_from_json,
    config_to_json,
    config_to_text,
    parse_config,
    parse_labels,
)
from repository_loader.errors import ConfigError
from repository_loader.proto import model_config_pb2 as pb
from repository_loader.proto import regenerate

EVERY_FIELD = """
name: "full"
platform: "onnxruntime_onnx"
backend: "onnxruntime"
runtime: "libtriton_onnxruntime.so"
version_policy { specific { versions: [ 1, 3 ] } }
max_batch_size: 16
input [
  { name: "in0" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, 8, 8 ] reshape { shape: [ 192 ] }
    allow_ragged_batch: false optional: true is_non_linear_format_io: false },
  { name: "shape" data_type: TYPE_INT32 dims: [ 2 ] is_shape_tensor: true }
]
output [ { name: "out0" data_type: TYPE_STRING dims: [ -1 ] label_filename: "labels.txt" reshape { shape: [ -1 ] } } ]
batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "acc" data_type: TYPE_FP32 source_input: "in0" } ]
batch_output [ { target_name: "out0" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "in0" } ]
optimization {
  graph { level: 1 }
  priority: PRIORITY_MAX
  cuda { graphs: true busy_wait_events: true output_copy_stream: true
         graph_spec [ { batch_size: 4 input { key: "in0" value { dim: [ 3, 8, 8 ] } }
                        graph_lower_bound { batch_size: 1 input { key: "in0" value { dim: [ 3, 8, 8 ] } } } } ] }
  execution_accelerators {
    gpu_execution_accelerator [ { name: "tensorrt" parameters { key: "precision_mode" value: "FP16" } } ]
    cpu_execution_accelerator [ { name: "openvino" } ]
  }
  input_pinned_memory { enable: false }
  output_pinned_memory { enable: true }
  gather_kernel_buffer_threshold: 2
  eager_batching: true
}
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  preserve_ordering: true
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5000000000 allow_timeout_override: true max_queue_size: 10 }
  priority_queue_policy { key: 1 value { timeout_action: REJECT max_queue_size: 2 } }
}
instance_group [
  { name: "g" kind: KIND_GPU count: 2 gpus: [ 0, 1 ] profile: [ "0" ] passive: false host_policy: "gpu_0"
    rate_limiter { resources [ { name: "R1" global: true count: 2 } ] priority: 2 }
    secondary_devices [ { kind: KIND_NVDLA device_id: 1 } ] }
]
default_model_filename: "net.onnx"
cc_model_filenames { key: "8.0" value: "net_a100.onnx" }
metric_tags { key: "team" value: "vision" }
parameters { key: "threads" value { string_value: "2" } }
model_warmup [ { name: "w" batch_size: 2 count: 3
                 inputs { key: "in0" value { data_type: TYPE_FP32 dims: [ 3, 8, 8 ] random_data: true } }
                 inputs { key: "shape" value { data_type: TYPE_INT32 dims: [ 2 ] input_data_file: "shape.bin" } } } ]
model_operations { op_library_filename: [ "libcustom.so" ] }
model_transaction_policy { decoupled: false }
model_repository_agents { agents [ { name: "checksum" parameters { key: "MD5:1/model.onnx" value: "abc" } } ] }
response_cache { enable: true }
model_metrics { metric_control [ { metric_identifier { family: "nv_inference_first_response_histogram_ms" }
                                   histogram_options { buckets: [ 1.0, 5.5, 10 ] } } ] }
"""

SEQUENCE = """
max_batch_size: 4
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 10 preserve_ordering: true }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [ { input_name: "s_in" output_name: "s_out" data_type: TYPE_FP32 dims: [ 4 ]
            initial_state [ { name: "init" data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } ]
            use_same_buffer_for_input_output: true use_growable_memory: true } ]
  iterative_sequence: true
}
"""

ENSEMBLE = """
platform: "ensemble"
ensemble_scheduling {
  step [ { model_name: "a" model_version: -1 input_map { key: "x" value: "IN" } output_map { key: "y" value: "OUT" } } ]
  max_inflight_requests: 8
}
"""


def test_every_top_level_field_parses() -> None:
    config = parse_config(EVERY_FIELD)
    top_level = {f.name for f in pb.ModelConfig.DESCRIPTOR.fields}
    others = {"sequence_batching", "ensemble_scheduling"}  # the other members of the scheduling oneof
    present = {f.name for f, _ in config.ListFields()}
    assert top_level - present == others
    assert config.dynamic_batching.default_queue_policy.default_timeout_microseconds == 5_000_000_000
    assert config.instance_group[0].rate_limiter.resources[0].name == "R1"


@pytest.mark.parametrize("text", [EVERY_FIELD, SEQUENCE, ENSEMBLE])
def test_json_round_trips(text: str) -> None:
    config = parse_config(text)
    data = config_to_json(config)
    assert config_from_json(data) == config
    assert parse_config(config_to_text(config)) == config


def test_json_uses_triton_field_names_and_numbers() -> None:
    data = config_to_json(parse_config(EVERY_FIELD))
    assert data["max_batch_size"] == 16
    assert data["input"][0]["dims"] == [3, 8, 8]  # numbers, not the strings protobuf writes for int64
    assert data["input"][0]["data_type"] == "TYPE_FP32"
    assert data["dynamic_batching"]["default_queue_policy"]["default_timeout_microseconds"] == 5_000_000_000
    assert data["optimization"]["cuda"]["graph_spec"][0]["input"]["in0"]["dim"] == [3, 8, 8]
    assert data["output"][0]["label_filename"] == "labels.txt"


def test_json_includes_defaults_triton_reports() -> None:
    data = config_to_json(parse_config('name: "m" backend: "python"'))
    assert data["max_batch_size"] == 0
    assert data["input"] == [] and data["output"] == []


def test_json_takes_a_lone_value_of_a_repeated_field_as_a_list_of_one() -> None:
    # as Triton's own parser does: lifecycle_test sends "instance_group": {...} in a load's config
    lone = config_from_json(
        {
            "instance_group": {"kind": "KIND_CPU", "count": 2},
            "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": 4}],
        }
    )
    listed = config_from_json(
        {
            "instance_group": [{"kind": "KIND_CPU", "count": 2}],
            "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
        }
    )
    assert lone == listed
    assert [g.count for g in lone.instance_group] == [2] and list(lone.input[0].dims) == [4]
    with pytest.raises(ConfigError, match="config JSON"):
        config_from_json({"instance_group": {"count": "two"}})


def test_syntax_error_names_file_line_and_column() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config('name: "m"\nmax_batch_size: 8\ninput [ { name: "x" dims: [ 1 }\n', "m/config.pbtxt")
    assert info.value.message.startswith("m/config.pbtxt:3:")
    assert "syntax error" in info.value.message


def test_unknown_data_type_is_named() -> None:
    with pytest.raises(
        ConfigError, match=r"m/config.pbtxt:1:\d+: syntax error: unknown data type 'TYPE_FLOAT'"
    ):
        parse_config('input [ { name: "x" data_type: TYPE_FLOAT } ]', "m/config.pbtxt")


def test_other_spelling_of_inflight_limit_is_accepted() -> None:
    config = parse_config('platform: "ensemble" ensemble_scheduling { max_inflight_responses: 5 }')
    assert config.ensemble_scheduling.max_inflight_requests == 5
    assert "max_inflight_responses" not in config_to_json(config)["ensemble_scheduling"]


def test_labels_drop_trailing_blank_lines() -> None:
    assert parse_labels("cat\ndog\n\n") == ["cat", "dog"]


def test_generated_code_matches_the_schema(tmp_path: Path) -> None:
    """Fails when model_config.proto changed without `python -m repository_loader.proto.regenerate`."""
    regenerate.generate(tmp_path)
    for name in regenerate.GENERATED:
        assert filecmp.cmp(tmp_path / name, regenerate.PROTO_DIR / name, shallow=False), f"{name} drifted"


def _enum_values(field) -> dict[str, int]:
    return {v.name: v.number for v in field.enum_type.values}


def _walk(ours, theirs, path: str, seen: set[str]) -> list[str]:
    problems = []
    for field in theirs.fields:
        mine = ours.fields_by_name.get(field.name)
        where = f"{path}.{field.name}"
        if mine is None:
            problems.append(f"{where} missing")
            continue
        if (mine.number, mine.type) != (field.number, field.type):
            problems.append(f"{where}: number/type differ")
        if field.enum_type is not None and _enum_values(mine) != _enum_values(field):
            problems.append(f"{where}: enum values differ")
        if field.message_type is not None and field.message_type.full_name not in seen:
            seen.add(field.message_type.full_name)
            problems.extend(_walk(mine.message_type, field.message_type, where, seen))
    return problems


def test_schema_matches_tritons_field_names_and_numbers() -> None:
    triton = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    assert _walk(pb.ModelConfig.DESCRIPTOR, triton.ModelConfig.DESCRIPTOR, "ModelConfig", set()) == []


def test_binary_form_is_interchangeable_with_tritons() -> None:
    triton = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    ours = parse_config(EVERY_FIELD)
    theirs = triton.ModelConfig.FromString(ours.SerializeToString())
    assert theirs.dynamic_batching.priority_levels == 3
    assert pb.ModelConfig.FromString(theirs.SerializeToString()) == ours
