"""The example Python models run unchanged on the real tritonserver (where it is installed).

The peer is installed by ``python -m bench.peers``; without it these tests skip. It has the
Python backend only, so the ONNX, TorchScript and ensemble models stay out of its repository.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator

import numpy as np
import pytest

from bench import peers
from tests.examples.conftest import REPOSITORY
from tests.peer import require_tritonserver

pytestmark = pytest.mark.slow
PYTHON_MODELS = (
    "add_sub",
    "auto_complete_scale",
    "crnn_postprocess",
    "identity_fp32",
    "image_preprocess",
    "string_upper",
)


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@pytest.fixture(scope="module")
def triton_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_tritonserver()
    repository = tmp_path_factory.mktemp("python_models")
    for name in PYTHON_MODELS:
        shutil.copytree(REPOSITORY / name, repository / name, ignore=shutil.ignore_patterns("__pycache__"))
    http, grpc, metrics = _free_ports(3)
    log_path = repository.parent / "tritonserver.log"
    command = [
        str(peers.tritonserver_path()),
        f"--model-repository={repository}",
        f"--http-port={http}",
        f"--grpc-port={grpc}",
        f"--metrics-port={metrics}",
        "--exit-on-error=false",
    ]
    # Started outside the checkout, so that the stubs import Triton's own triton_python_backend_utils.
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=repository.parent)
        handle = peers.ServerHandle(process, http, grpc, log_path, "tritonserver")
        try:
            peers.wait_ready(handle, timeout=120)
            yield handle.url
        finally:
            handle.stop()


def test_every_python_model_is_ready(triton_url: str) -> None:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url=triton_url)
    for name in PYTHON_MODELS:
        assert client.is_model_ready(name), name


def test_auto_complete_config_is_applied_by_triton(triton_url: str) -> None:
    import tritonclient.http as httpclient

    config = httpclient.InferenceServerClient(url=triton_url).get_model_config("auto_complete_scale")
    assert config["max_batch_size"] == 8
    assert [tensor["name"] for tensor in config["input"]] == ["INPUT0"]
    assert "dynamic_batching" in config


def test_models_answer_through_triton(triton_url: str) -> None:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url=triton_url)
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.full((2, 4), 0.5, dtype=np.float32)
    inputs = [
        httpclient.InferInput("INPUT0", [2, 4], "FP32"),
        httpclient.InferInput("INPUT1", [2, 4], "FP32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)

    words = np.array([b"ray", b"serve"], dtype=np.object_)
    text = httpclient.InferInput("INPUT0", [2], "BYTES")
    text.set_data_from_numpy(words)
    assert client.infer("string_upper", [text]).as_numpy("OUTPUT0").tolist() == [b"RAY", b"SERVE"]

    image = httpclient.InferInput("IMAGE", [1, 64, 200], "UINT8")
    image.set_data_from_numpy(np.full((1, 64, 200), 255, dtype=np.uint8))
    preprocessed = client.infer("image_preprocess", [image]).as_numpy("PREPROCESSED")
    assert preprocessed.shape == (1, 1, 32, 100) and np.all(preprocessed == 1.0)

    scores = np.full((1, 26, 37), -5.0, dtype=np.float32)
    scores[0, np.arange(26), [11, 11, 0, 12] + [0] * 22] = 0.0
    logits = httpclient.InferInput("LOGITS", [1, 26, 37], "FP32")
    logits.set_data_from_numpy(scores)
    assert client.infer("crnn_postprocess", [logits]).as_numpy("TEXT").tolist() == [[b"ab"]]
