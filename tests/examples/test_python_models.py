"""The example Python models, run the way Triton's Python backend runs them.

The models import ``triton_python_backend_utils``; the tests that drive ``execute`` need the
project's implementation of it and skip cleanly where it is not importable. The pure helpers
(pre-processing, CTC decoding) are checked either way.
"""

from __future__ import annotations

import importlib
import itertools
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from tests.examples.conftest import REPOSITORY, load_module, triton_config_json

ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


def _real_pb_utils() -> ModuleType | None:
    try:
        return importlib.import_module("triton_python_backend_utils")
    except ImportError:
        return None


@pytest.fixture
def pb_utils() -> ModuleType:
    module = _real_pb_utils()
    if module is None:
        pytest.skip("triton_python_backend_utils is not importable")
    return module


def _model_file(name: str) -> Path:
    return REPOSITORY / name / "1" / "model.py"


def _helpers(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """Imports a model file for its module-level helpers, with an empty stand-in if pb_utils is absent."""
    if _real_pb_utils() is None:
        monkeypatch.setitem(
            sys.modules, "triton_python_backend_utils", ModuleType("triton_python_backend_utils")
        )
    return load_module(_model_file(name), f"example_{name}_helpers")


def _instance(name: str) -> Any:
    """Loads and initializes a model as the Python backend does, with Triton's ``args``."""
    module = load_module(_model_file(name), f"example_{name}")
    model = module.TritonPythonModel()
    model.initialize(
        {
            "model_config": triton_config_json(name),
            "model_instance_kind": "CPU",
            "model_instance_name": f"{name}_0_0",
            "model_instance_device_id": "0",
            "model_repository": str(REPOSITORY / name),
            "model_version": "1",
            "model_name": name,
        }
    )
    return model


def _request(pb_utils: ModuleType, model: str, outputs: list[str], **inputs: np.ndarray) -> Any:
    tensors = [pb_utils.Tensor(name, value) for name, value in inputs.items()]
    return pb_utils.InferenceRequest(model_name=model, requested_output_names=outputs, inputs=tensors)


def _output(pb_utils: ModuleType, response: Any, name: str) -> np.ndarray:
    assert not response.has_error(), response.error().message()
    return pb_utils.get_output_tensor_by_name(response, name).as_numpy()


def _reference_decode(scores: np.ndarray) -> list[bytes]:
    """Greedy CTC written independently: group equal neighbours, drop the blank."""
    return [
        "".join(ALPHABET[label - 1] for label, _ in itertools.groupby(path) if label != 0).encode()
        for path in scores.argmax(axis=-1)
    ]


# Pure helpers, checked with or without pb_utils.


def test_preprocess_resizes_and_scales(monkeypatch: pytest.MonkeyPatch) -> None:
    helpers = _helpers("image_preprocess", monkeypatch)
    images = np.zeros((2, 64, 200), dtype=np.uint8)
    images[1] = 255
    images[0, :, 100:] = 255  # right half white
    result = helpers.preprocess(images)
    assert result.shape == (2, 1, 32, 100) and result.dtype == np.float32
    np.testing.assert_array_equal(result[1], 1.0)
    np.testing.assert_array_equal(result[0, 0, :, :50], -1.0)
    np.testing.assert_array_equal(result[0, 0, :, 50:], 1.0)


def test_greedy_ctc_decode_merges_repeats_and_drops_blanks(monkeypatch: pytest.MonkeyPatch) -> None:
    helpers = _helpers("crnn_postprocess", monkeypatch)
    paths = [[1, 1, 0, 1, 2, 2, 0, 0, 37 - 1] + [0] * 17, [0] * 26]
    scores = np.full((2, 26, 37), -5.0, dtype=np.float32)
    for row, path in enumerate(paths):
        scores[row, np.arange(26), path] = 0.0
    assert helpers.greedy_ctc_decode(scores, ALPHABET) == [b"001z", b""]
    random_scores = np.random.default_rng(3).normal(size=(4, 26, 37)).astype(np.float32)
    assert helpers.greedy_ctc_decode(random_scores, ALPHABET) == _reference_decode(random_scores)


# The models through execute(), as the Python backend drives them.


def test_add_sub_answers_each_request_of_a_batch(pb_utils: ModuleType) -> None:
    model = _instance("add_sub")
    rng = np.random.default_rng(4)
    pairs = [rng.normal(size=(rows, 4)).astype(np.float32) for rows in (1, 3) for _ in range(2)]
    requests = [
        _request(pb_utils, "add_sub", ["OUTPUT0", "OUTPUT1"], INPUT0=pairs[0], INPUT1=pairs[1]),
        _request(pb_utils, "add_sub", ["OUTPUT0", "OUTPUT1"], INPUT0=pairs[2], INPUT1=pairs[3]),
    ]
    responses = model.execute(requests)
    assert len(responses) == 2
    for response, (a, b) in zip(responses, [(pairs[0], pairs[1]), (pairs[2], pairs[3])], strict=True):
        np.testing.assert_array_equal(_output(pb_utils, response, "OUTPUT0"), a + b)
        np.testing.assert_array_equal(_output(pb_utils, response, "OUTPUT1"), a - b)
    model.finalize()


def test_identity_returns_its_input(pb_utils: ModuleType) -> None:
    model = _instance("identity_fp32")
    data = np.arange(16, dtype=np.float32)
    (response,) = model.execute([_request(pb_utils, "identity_fp32", ["OUTPUT0"], INPUT0=data)])
    np.testing.assert_array_equal(_output(pb_utils, response, "OUTPUT0"), data)


def test_string_upper_keeps_the_shape(pb_utils: ModuleType) -> None:
    model = _instance("string_upper")
    words = np.array([[b"hello", "wörld".encode()], [b"", b"Triton 2"]], dtype=np.object_)
    (response,) = model.execute([_request(pb_utils, "string_upper", ["OUTPUT0"], INPUT0=words)])
    result = _output(pb_utils, response, "OUTPUT0")
    assert result.shape == (2, 2)
    assert [bytes(value) for value in result.reshape(-1)] == [b"HELLO", "WÖRLD".encode(), b"", b"TRITON 2"]


def test_image_preprocess_rejects_an_empty_image(pb_utils: ModuleType) -> None:
    model = _instance("image_preprocess")
    empty = np.zeros((1, 0, 10), dtype=np.uint8)
    good = np.zeros((1, 32, 100), dtype=np.uint8)
    bad_response, good_response = model.execute(
        [
            _request(pb_utils, "image_preprocess", ["PREPROCESSED"], IMAGE=empty),
            _request(pb_utils, "image_preprocess", ["PREPROCESSED"], IMAGE=good),
        ]
    )
    assert bad_response.has_error() and "IMAGE" in bad_response.error().message()
    assert _output(pb_utils, good_response, "PREPROCESSED").shape == (1, 1, 32, 100)


def test_auto_complete_fills_in_the_tensors_and_batching(pb_utils: ModuleType) -> None:
    if not hasattr(pb_utils, "ModelConfig"):
        pytest.skip("triton_python_backend_utils has no ModelConfig")
    module = load_module(_model_file("auto_complete_scale"), "example_auto_complete_scale")
    # Triton's stub builds the object from the configuration's JSON text.
    config = pb_utils.ModelConfig(triton_config_json("auto_complete_scale"))
    completed = module.TritonPythonModel.auto_complete_config(config).as_dict()
    assert completed["max_batch_size"] == 8
    assert [(t["name"], t["data_type"]) for t in completed["input"]] == [("INPUT0", "TYPE_FP32")]
    assert [(t["name"], t["data_type"]) for t in completed["output"]] == [("OUTPUT0", "TYPE_FP32")]
    assert "dynamic_batching" in completed
    model = _instance("auto_complete_scale")
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    (response,) = model.execute([_request(pb_utils, "auto_complete_scale", ["OUTPUT0"], INPUT0=data)])
    np.testing.assert_array_equal(_output(pb_utils, response, "OUTPUT0"), data * 2)


def test_text_recognition_steps_by_hand(pb_utils: ModuleType) -> None:
    """image_preprocess -> crnn (onnxruntime) -> crnn_postprocess, as the ensemble wires them."""
    images = np.random.default_rng(5).integers(0, 256, size=(3, 48, 160), dtype=np.uint8)
    (pre,) = _instance("image_preprocess").execute(
        [_request(pb_utils, "image_preprocess", ["PREPROCESSED"], IMAGE=images)]
    )
    preprocessed = _output(pb_utils, pre, "PREPROCESSED")
    session = ort.InferenceSession(
        str(REPOSITORY / "crnn" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    (scores,) = session.run(["308"], {"input.1": preprocessed})
    (post,) = _instance("crnn_postprocess").execute(
        [_request(pb_utils, "crnn_postprocess", ["TEXT"], LOGITS=scores)]
    )
    text = _output(pb_utils, post, "TEXT")
    assert text.shape == (3, 1)
    assert [bytes(value) for value in text[:, 0]] == _reference_decode(scores)
