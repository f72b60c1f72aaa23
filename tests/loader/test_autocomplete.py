"""Auto-complete: ONNX signatures through onnxruntime, Python auto_complete_config, and the switch that turns it off."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from onnx import TensorProto

from repository_loader.python_autocomplete import AutoCompleteModelConfig
from repository_loader.repository import ModelLoadError, load_model, load_repository

from .conftest import TORCH_IO, onnx_model_bytes

BATCHABLE = onnx_model_bytes(
    [("in", TensorProto.FLOAT, ["batch", 3, 4]), ("ids", TensorProto.INT64, ["batch", "seq"])],
    [("out", TensorProto.FLOAT, ["batch", 3, 4]), ("ids_out", TensorProto.INT64, ["batch", "seq"])],
)
FIXED = onnx_model_bytes([("in", TensorProto.FLOAT, [2, 3])], [("out", TensorProto.FLOAT, [2, 3])])


def test_onnx_without_config_is_completed(repo: Path, write_model) -> None:
    write_model("m", None, {"1/model.onnx": BATCHABLE})
    model = load_model(repo, "m")
    assert (model.platform, model.backend) == ("onnxruntime_onnx", "onnxruntime")
    assert model.max_batch_size == 4
    assert model.dynamic_batching is not None
    assert [(t.name, t.datatype, t.dims) for t in model.inputs] == [
        ("in", "FP32", (3, 4)),
        ("ids", "INT64", (-1,)),
    ]
    assert [t.name for t in model.outputs] == ["out", "ids_out"]
    assert model.config_json["max_batch_size"] == 4 and "dynamic_batching" in model.config_json


def test_onnx_that_cannot_batch(repo: Path, write_model) -> None:
    write_model("m", 'platform: "onnxruntime_onnx"', {"1/model.onnx": FIXED})
    model = load_model(repo, "m")
    assert model.max_batch_size == 0 and model.dynamic_batching is None
    assert model.inputs[0].dims == (2, 3)


def test_onnx_partial_config_keeps_what_it_says(repo: Path, write_model) -> None:
    write_model(
        "m",
        """
        backend: "onnxruntime"
        max_batch_size: 16
        input [ { name: "in" } , { name: "ids" data_type: TYPE_INT64 dims: [ 5 ] } ]
        sequence_batching { }
        """,
        {"1/model.onnx": BATCHABLE},
    )
    model = load_model(repo, "m")
    assert model.max_batch_size == 16
    assert model.dynamic_batching is None  # a scheduler is configured already
    assert model.input("in") is not None and model.input("in").dims == (3, 4)
    assert model.input("ids").dims == (5,)
    assert [t.name for t in model.outputs] == ["out", "ids_out"]


def test_onnx_config_that_disagrees_with_the_model(repo: Path, write_model) -> None:
    write_model("batch", 'platform: "onnxruntime_onnx"\nmax_batch_size: 8', {"1/model.onnx": FIXED})
    write_model(
        "dtype",
        'platform: "onnxruntime_onnx"\ninput [ { name: "in" data_type: TYPE_INT32 dims: [ 2, 3 ] } ]',
        {"1/model.onnx": FIXED},
    )
    write_model(
        "name",
        'platform: "onnxruntime_onnx"\ninput [ { name: "nope" data_type: TYPE_FP32 dims: [ 2, 3 ] } ]',
        {"1/model.onnx": FIXED},
    )
    state = load_repository(repo)
    assert (
        "for the model to support batching the shape should have at least 1 dimension"
        in (state.failed["batch"][0])
    )
    assert (
        "configuration expects datatype TYPE_INT32 for input 'in', model provides TYPE_FP32"
        in state.failed["dtype"][0]
    )
    assert "unexpected inference input 'nope', allowed inputs are: in" in state.failed["name"][0]


def test_file_that_is_not_onnx(repo: Path, write_model) -> None:
    write_model("m", None, {"1/model.onnx": b"this is not a protobuf"})
    state = load_repository(repo)
    (message,) = state.failed["m"]
    assert "is not a valid ONNX model" in message and "model 'm'" in message
    assert "Traceback" not in message


def test_disabled_auto_complete_leaves_the_config_alone(repo: Path, write_model) -> None:
    write_model("m", 'platform: "onnxruntime_onnx"', {"1/model.onnx": BATCHABLE})
    write_model("bare", None, {"1/model.onnx": BATCHABLE})
    state = load_repository(repo, auto_complete=False)
    assert any("lists no outputs" in e for e in state.failed["m"])
    assert any("no config file, and auto-complete is disabled" in e for e in state.failed["bare"])


def test_torchscript_needs_a_config(repo: Path, write_model) -> None:
    write_model("t", None, {"1/model.pt": b""})
    state = load_repository(repo)
    assert "TorchScript model needs a config.pbtxt" in state.failed["t"][0]
    write_model("t", TORCH_IO)
    assert load_repository(repo).models["t"].platform == "pytorch_libtorch"


PYTHON_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        seen = auto_complete_model_config.as_dict()
        assert seen["name"] == "py"
        auto_complete_model_config.set_max_batch_size(8)
        auto_complete_model_config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.add_input({"name": "B", "data_type": "TYPE_STRING", "dims": [-1], "optional": True})
        auto_complete_model_config.add_output({"name": "C", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.set_dynamic_batching()
        auto_complete_model_config.set_model_transaction_policy({"decoupled": True})
        return auto_complete_model_config

    def execute(self, requests):
        return []
"""


def test_python_auto_complete_config(repo: Path, write_model, pb_utils_importable) -> None:
    write_model("py", 'backend: "python"', {"1/model.py": PYTHON_MODEL})
    model = load_model(repo, "py")
    assert model.max_batch_size == 8 and model.dynamic_batching is not None and model.decoupled
    assert [(t.name, t.datatype, t.dims, t.optional) for t in model.inputs] == [
        ("A", "FP32", (4,), False),
        ("B", "BYTES", (-1,), True),
    ]
    assert model.outputs[0].name == "C"


def test_python_model_without_config_file(repo: Path, write_model, pb_utils_importable) -> None:
    write_model("py", None, {"1/model.py": PYTHON_MODEL})
    model = load_model(repo, "py")
    assert model.backend == "python" and model.platform == ""


def test_python_auto_complete_errors_are_reported(repo: Path, write_model, pb_utils_importable) -> None:
    write_model(
        "py", 'backend: "python"\nmax_batch_size: 16', {"1/model.py": PYTHON_MODEL}
    )  # 8 < configured 16
    write_model("broken", 'backend: "python"', {"1/model.py": "import numpy\nraise RuntimeError('boom')\n"})
    write_model("noclass", 'backend: "python"', {"1/model.py": "X = 1\n"})
    state = load_repository(repo)
    assert "auto_complete_config failed: ValueError" in state.failed["py"][0]
    assert "importing" in state.failed["broken"][0] and "RuntimeError: boom" in state.failed["broken"][0]
    assert "defines no class TritonPythonModel" in state.failed["noclass"][0]
    with pytest.raises(ModelLoadError):
        load_model(repo, "broken")


def test_python_module_is_not_left_behind(repo: Path, write_model, pb_utils_importable) -> None:
    import sys

    write_model("py", 'backend: "python"', {"1/model.py": PYTHON_MODEL})
    before = set(sys.modules)
    path_before = list(sys.path)
    load_model(repo, "py")
    assert not [m for m in set(sys.modules) - before if m.startswith("_triton_serve_autocomplete")]
    assert sys.path == path_before


# model.py that waits, then imports a module beside it (``helper_<name>``), within its auto-complete
SLOW_SIBLING_IMPORT = """
import time

import triton_python_backend_utils as pb_utils

time.sleep({delay})
import helper_{name}


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({{"name": "IN", "data_type": "TYPE_FP32", "dims": [helper_{name}.DIMS]}})
        auto_complete_model_config.add_output({{"name": "OUT", "data_type": "TYPE_FP32", "dims": [helper_{name}.DIMS]}})
        return auto_complete_model_config
"""


def test_python_models_read_at_once_each_find_the_modules_beside_them(
    repo: Path, write_model, pb_utils_importable
) -> None:
    """The server reads models in threads: one model.py's import must not take another's folder off
    ``sys.path`` while that one imports from it, nor leave its own folder there."""
    import sys
    import threading

    for name, delay, dims in (("a", 0.3, 2), ("b", 0.6, 3)):
        write_model(
            name,
            'backend: "python"',
            {
                "1/model.py": SLOW_SIBLING_IMPORT.format(name=name, delay=delay),
                f"1/helper_{name}.py": f"DIMS = {dims}\n",
            },
        )
    path_before = list(sys.path)
    found: dict[str, object] = {}

    def read(name: str) -> None:
        try:
            found[name] = load_model(repo, name).inputs[0].dims
        except ModelLoadError as exc:
            found[name] = exc.errors

    threads = [threading.Thread(target=read, args=(name,)) for name in ("a", "b")]
    threads[0].start()
    time.sleep(0.1)  # "b" starts importing while "a" still does
    threads[1].start()
    for thread in threads:
        thread.join(timeout=30)
    assert found == {"a": (2,), "b": (3,)}
    assert sys.path == path_before
    for name in ("helper_a", "helper_b"):
        sys.modules.pop(name, None)


def test_auto_complete_object_rules() -> None:
    config = AutoCompleteModelConfig(
        {"name": "m", "max_batch_size": 4, "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [2]}]}
    )
    with pytest.raises(ValueError, match="max_batch_size"):
        config.set_max_batch_size(2)
    with pytest.raises(ValueError, match="configuration expects datatype TYPE_FP32 for input"):
        config.add_input({"name": "A", "data_type": "TYPE_INT32", "dims": [2]})
    with pytest.raises(ValueError, match="dims"):
        config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [3]})
    with pytest.raises(ValueError, match="missing 'dims'"):
        config.add_output({"name": "B", "data_type": "TYPE_FP32"})
    with pytest.raises(ValueError, match="contains property other than"):
        config.add_output({"name": "B", "data_type": "TYPE_FP32", "dims": [1], "optional": True})
    with pytest.raises(ValueError, match="other than 'decoupled'"):
        config.set_model_transaction_policy({"streaming": True})
    seq = AutoCompleteModelConfig({"name": "m", "sequence_batching": {}})
    with pytest.raises(ValueError, match="sequence_batching"):
        seq.set_dynamic_batching()
    config.set_max_batch_size(8)
    assert config.get_max_batch_size() == 8 and config.get_inputs()[0]["name"] == "A"


def test_onnx_sequence_control_and_state_tensors_are_not_config_inputs(repo: Path, write_model) -> None:
    """Triton's ONNX Runtime backend counts control and state tensors as the model's own."""
    stateful = onnx_model_bytes(
        [("IN", TensorProto.FLOAT, ["b", 1]), ("STATE_IN", TensorProto.FLOAT, ["b", 1])],
        [("OUT", TensorProto.FLOAT, ["b", 1]), ("STATE_OUT", TensorProto.FLOAT, ["b", 1])],
    )
    write_model(
        "m",
        """
        backend: "onnxruntime"
        max_batch_size: 8
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
        sequence_batching {
          state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
        }
        """,
        {"1/model.onnx": stateful},
    )
    model = load_model(repo, "m")
    assert [t.name for t in model.inputs] == ["IN"] and [t.name for t in model.outputs] == ["OUT"]
    # L0_implicit_state: a configuration may list a state's output among its outputs, so a client may
    # ask for it (a state's input stays the sequence batcher's)
    listed = (
        (repo / "m" / "config.pbtxt")
        .read_text()
        .replace(
            'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]',
            'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] },'
            ' { name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]',
        )
    )
    write_model("with_state_output", listed.replace('"m"', '"with_state_output"'), {"1/model.onnx": stateful})
    model = load_model(repo, "with_state_output")
    assert [t.name for t in model.outputs] == ["OUT", "STATE_OUT"]
