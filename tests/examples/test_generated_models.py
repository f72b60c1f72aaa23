"""The generated models: reproducible from the script, and runnable with the documented shapes."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from tests.examples.conftest import REPOSITORY, ROOT, load_module

generate = load_module(ROOT / "examples" / "generate.py", "examples_generate")

CRNN_PATH = REPOSITORY / "crnn" / "1" / "model.onnx"
TORCHSCRIPT_PATH = REPOSITORY / "simple_torchscript" / "1" / "model.pt"


@pytest.fixture(scope="module")
def crnn_session() -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(CRNN_PATH), options, providers=["CPUExecutionProvider"])


def _images(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (rows, 1, 32, 100)).astype(np.float32)


def test_generator_reproduces_the_committed_files_byte_for_byte(tmp_path: Path) -> None:
    # Run as the documented command: TorchScript records the defining module's name.
    script = ROOT / "examples" / "generate.py"
    subprocess.run([sys.executable, str(script), "--out", str(tmp_path)], check=True, capture_output=True)
    written = sorted(path for path in tmp_path.rglob("*") if path.is_file())
    assert [path.relative_to(tmp_path).as_posix() for path in written] == [
        "crnn/1/model.onnx",
        "simple_torchscript/1/model.pt",
    ]
    for path in written:
        committed = REPOSITORY / path.relative_to(tmp_path)
        assert path.read_bytes() == committed.read_bytes(), f"{committed} differs from the generator's output"


def test_model_files_stay_small() -> None:
    for path in (CRNN_PATH, TORCHSCRIPT_PATH):
        assert path.stat().st_size < 5 * 1024 * 1024, path


def test_crnn_signature_matches_the_well_known_example(crnn_session: ort.InferenceSession) -> None:
    (image,) = crnn_session.get_inputs()
    (scores,) = crnn_session.get_outputs()
    assert (image.name, image.type, image.shape[1:]) == ("input.1", "tensor(float)", [1, 32, 100])
    assert (scores.name, scores.type, scores.shape[1:]) == ("308", "tensor(float)", [26, 37])
    assert isinstance(image.shape[0], str) and isinstance(scores.shape[0], str)  # dynamic batch axis


def test_crnn_runs_batches_and_returns_log_probabilities(crnn_session: ort.InferenceSession) -> None:
    images = _images(8)
    (scores,) = crnn_session.run(["308"], {"input.1": images})
    assert scores.shape == (8, 26, 37) and scores.dtype == np.float32
    np.testing.assert_allclose(np.exp(scores).sum(axis=-1), 1.0, rtol=1e-5)
    (single,) = crnn_session.run(["308"], {"input.1": images[3:4]})
    np.testing.assert_allclose(single[0], scores[3], rtol=1e-4, atol=1e-5)
    assert not np.allclose(scores[0], scores[1])  # each row depends on its image


def test_crnn_onnx_agrees_with_the_torch_model(crnn_session: ort.InferenceSession) -> None:
    images = _images(2, seed=1)
    with torch.no_grad():
        expected = generate.build_crnn()(torch.from_numpy(images)).numpy()
    (scores,) = crnn_session.run(["308"], {"input.1": images})
    np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-4)


def test_torchscript_model_loads_and_agrees_with_the_torch_model() -> None:
    scripted = torch.jit.load(io.BytesIO(TORCHSCRIPT_PATH.read_bytes()))
    batch = torch.from_numpy(np.random.default_rng(2).normal(size=(3, 16)).astype(np.float32))
    with torch.no_grad():
        result = scripted(batch)
        expected = generate.build_mlp()(batch)
    assert result.shape == (3, 4)
    torch.testing.assert_close(result, expected)
