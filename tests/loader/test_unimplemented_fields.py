"""Config fields the server does not act on are never silently ignored; --print-config prints /config's document."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from deployments.cli import main
from repository_loader.repository import load_model, load_repository
from repository_loader.unimplemented import UNIMPLEMENTED, Policy, unimplemented_fields

from .conftest import TORCH_IO

PT = {"1/model.pt": b""}

# field -> config text that sets it on a model that is otherwise valid (pytorch, max_batch_size 8)
WARN_CASES = {
    "instance_group.host_policy": 'instance_group [ { kind: KIND_CPU host_policy: "numa0" } ]',
    "instance_group.secondary_devices": (
        "instance_group [ { kind: KIND_GPU gpus: [ 0 ] secondary_devices [ { kind: KIND_NVDLA device_id: 0 } ] } ]"
    ),
    "model_operations": 'model_operations { op_library_filename: [ "libcustom.so" ] }',
    "model_metrics": (
        'model_metrics { metric_control [ { metric_identifier { family: "f" } histogram_options { buckets: [ 1 ] } } ] }'
    ),
    "metric_tags": 'metric_tags { key: "team" value: "a" }',
    "runtime": 'runtime: "model.py"',
    "parameters.EXECUTION_ENV_PATH": (
        'parameters { key: "EXECUTION_ENV_PATH" value { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }'
    ),
    "optimization.cuda": "optimization { cuda { graphs: true } }",
    "optimization.priority": "optimization { priority: PRIORITY_MAX }",
    "optimization.input_pinned_memory": "optimization { input_pinned_memory { enable: true } }",
    "optimization.output_pinned_memory": "optimization { output_pinned_memory { enable: true } }",
    "optimization.gather_kernel_buffer_threshold": "optimization { gather_kernel_buffer_threshold: 4 }",
    "optimization.eager_batching": "optimization { eager_batching: true }",
    "optimization.graph": "optimization { graph { level: 1 } }",
    "optimization.execution_accelerators": (
        'optimization { execution_accelerators { gpu_execution_accelerator [ { name: "tensorrt" } ] } }'
    ),
    "sequence_batching.state.use_growable_memory": (
        'sequence_batching { state [ { input_name: "si" output_name: "so" data_type: TYPE_FP32 dims: [ 1 ] '
        "use_same_buffer_for_input_output: true use_growable_memory: true } ] }"
    ),
}


def test_every_warned_field_has_a_case() -> None:
    fields = unimplemented_fields()
    warned = {name for name, policy in fields.items() if policy == Policy.WARN.value}
    # ensemble_scheduling.max_inflight_requests and instance_group.profile need an ensemble / TensorRT model.
    assert warned - set(WARN_CASES) == {"ensemble_scheduling.max_inflight_requests", "instance_group.profile"}
    assert {"batch_input", "batch_output", "model_repository_agents"} <= {
        name for name, policy in fields.items() if policy == Policy.FAIL.value
    }
    assert len({item.field for item in UNIMPLEMENTED}) == len(UNIMPLEMENTED)


@pytest.mark.parametrize("field", sorted(WARN_CASES))
def test_unimplemented_field_loads_with_a_warning(
    field: str, repo: Path, write_model, caplog: pytest.LogCaptureFixture
) -> None:
    write_model("m", TORCH_IO + WARN_CASES[field], PT)
    with caplog.at_level(logging.WARNING, logger="repository_loader"):
        state = load_repository(repo)
    assert "m" in state.models, state.failed.get("m")
    expected = f"model 'm' (m/config.pbtxt): {field}: not implemented by this server, ignored"
    assert any(w.startswith(expected) for w in state.warnings), state.warnings
    assert any(r.getMessage().startswith(expected) for r in caplog.records)


def test_onnx_reads_its_optimization_settings_without_a_warning(repo: Path, write_model) -> None:
    from onnx import TensorProto

    from .conftest import onnx_model_bytes

    model = onnx_model_bytes([("a", TensorProto.FLOAT, [2])], [("b", TensorProto.FLOAT, [2])])
    write_model(
        "m", 'platform: "onnxruntime_onnx"\noptimization { graph { level: 1 } }', {"1/model.onnx": model}
    )
    state = load_repository(repo)
    assert "m" in state.models and not state.warnings


def test_priority_settings_without_levels_warn(repo: Path, write_model) -> None:
    write_model("m", TORCH_IO + "dynamic_batching { default_priority_level: 1 }", PT)
    state = load_repository(repo)
    assert "m" in state.models
    assert any("priority_levels is 0, so default_priority_level" in w for w in state.warnings)


def test_validate_names_the_ignored_field(
    repo: Path, write_model, capsys: pytest.CaptureFixture[str]
) -> None:
    write_model("m", TORCH_IO + 'metric_tags { key: "team" value: "a" }', PT)
    assert main(["validate", str(repo), "--cpus", "2", "--gpus", "0"]) == 0
    out = capsys.readouterr().out
    assert "warning: model 'm' (m/config.pbtxt): metric_tags: not implemented by this server" in out
    assert "OK    m  version 1" in out
    assert main(["validate", str(repo), "--cpus", "2", "--gpus", "0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert any("metric_tags" in w for w in report["warnings"])


def test_print_config_prints_what_config_endpoint_returns(
    repo: Path, write_model, capsys: pytest.CaptureFixture[str]
) -> None:
    write_model("m", TORCH_IO + 'metric_tags { key: "team" value: "a" }', PT)
    write_model("bad", TORCH_IO.replace("max_batch_size: 8", "max_batch_size: -1"), PT)
    assert main(["validate", str(repo), "--print-config", "--cpus", "2", "--gpus", "0"]) == 1
    captured = capsys.readouterr()
    printed = json.loads(captured.out)
    assert list(printed) == ["m"]
    # the data plane's /config answer is the description's config_json
    assert printed["m"] == json.loads(json.dumps(dict(load_model(repo, "m").config_json)))
    assert printed["m"]["name"] == "m" and printed["m"]["max_batch_size"] == 8
    assert printed["m"]["input"][0]["dims"] == [4]  # 64-bit integers as numbers, as Triton prints them
    assert "warning: model 'm'" in captured.err and "metric_tags" in captured.err
    assert "error: model 'bad'" in captured.err


def test_print_config_shows_what_auto_complete_filled(
    repo: Path, write_model, capsys: pytest.CaptureFixture[str]
) -> None:
    from onnx import TensorProto

    from .conftest import onnx_model_bytes

    model = onnx_model_bytes([("a", TensorProto.FLOAT, ["n", 3])], [("b", TensorProto.FLOAT, ["n", 3])])
    write_model("auto", None, {"1/model.onnx": model})
    assert main(["validate", str(repo), "--print-config", "--cpus", "2", "--gpus", "0"]) == 0
    config = json.loads(capsys.readouterr().out)["auto"]
    assert config["platform"] == "onnxruntime_onnx" and config["max_batch_size"] == 4
    assert [t["name"] for t in config["input"]] == ["a"] and config["input"][0]["dims"] == [3]
    assert "dynamic_batching" in config
