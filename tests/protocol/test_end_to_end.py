"""The HTTP front end under uvicorn, called by the real tritonclient (sync and asyncio) and raw HTTP."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
import uvicorn
from tritonclient.utils import InferenceServerException

from deployments.protocol.http import ModelHTTPApp, ServerHTTPApp
from tests.protocol.fakes import LABELS, FakeDataPlane, all_models, softmax


class BackgroundServer:
    """uvicorn serving one ASGI app on a free local port, in a thread of this process."""

    def __init__(self, app, root_path: str = "") -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(("127.0.0.1", 0))
        self.url = f"127.0.0.1:{self.socket.getsockname()[1]}"
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, root_path=root_path, lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)

    def __enter__(self) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)
        self.socket.close()
        assert not self.thread.is_alive(), "uvicorn did not stop"


@pytest.fixture(scope="module")
def dataplane(tmp_path_factory) -> FakeDataPlane:
    return FakeDataPlane(all_models(tmp_path_factory.mktemp("models")))


@pytest.fixture(scope="module")
def server(dataplane) -> Iterator[BackgroundServer]:
    with BackgroundServer(ServerHTTPApp(dataplane)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(server.url, concurrency=4)
    yield c
    c.close()


def add_sub_inputs(a, b, binary=True):
    inputs = [
        httpclient.InferInput("INPUT0", list(a.shape), "FP32"),
        httpclient.InferInput("INPUT1", list(b.shape), "FP32"),
    ]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    return inputs


def raw(server, method, path, body=b"", headers=None):
    """One plain HTTP request; returns (status, headers, body)."""
    host, port = server.url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def test_health_and_metadata(client):
    assert client.is_server_live()
    assert not client.is_server_ready()  # strict readiness: the 'broken' model is not ready
    assert client.get_server_metadata()["name"] == "triton"
    assert client.is_model_ready("add_sub") and client.is_model_ready("add_sub", "1")
    assert not client.is_model_ready("broken")
    meta = client.get_model_metadata("classifier")
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "INPUT", "datatype": "FP32", "shape": [-1, 4]}]
    assert client.get_model_metadata("add_sub", "2")["versions"] == ["1", "2"]
    config = client.get_model_config("add_sub")
    assert config["max_batch_size"] == 8 and [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]


@pytest.mark.parametrize("binary", [True, False])
def test_infer_json_and_binary(client, binary):
    rng = np.random.default_rng(3)
    a, b = rng.random((3, 16), dtype=np.float32), rng.random((3, 16), dtype=np.float32)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
    result = client.infer(
        "add_sub", add_sub_inputs(a, b, binary), outputs=outputs, request_id="abc", model_version="1"
    )
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
    response = result.get_response()
    assert (response["id"], response["model_name"], response["model_version"]) == ("abc", "add_sub", "1")


def test_versions_answer_differently(client):
    a = np.full((1, 16), 2, np.float32)
    v1 = client.infer("add_sub", add_sub_inputs(a, a), model_version="1").as_numpy("OUTPUT0")
    v2 = client.infer("add_sub", add_sub_inputs(a, a), model_version="2").as_numpy("OUTPUT0")
    latest = client.infer("add_sub", add_sub_inputs(a, a))
    np.testing.assert_array_equal(v2, v1 + 1)
    np.testing.assert_array_equal(latest.as_numpy("OUTPUT0"), v2)
    assert latest.get_response()["model_version"] == "2"


@pytest.mark.parametrize("binary", [True, False])
def test_bytes_tensors(client, binary):
    text = np.array([b"ray", b"serve", "\u00fcber".encode()], dtype=object)
    tensor = httpclient.InferInput("TEXT", [3], "BYTES")
    tensor.set_data_from_numpy(text, binary_data=binary)
    outputs = [
        httpclient.InferRequestedOutput("UPPER", binary_data=True),
        httpclient.InferRequestedOutput("LENGTH", binary_data=binary),
    ]
    result = client.infer("strings", [tensor], outputs=outputs)
    assert result.as_numpy("UPPER").tolist() == [b"RAY", b"SERVE", "\u00fcBER".encode()]
    assert result.as_numpy("LENGTH").tolist() == [3, 5, 5]


def test_classification_on_a_real_onnx_model(client, dataplane):
    x = np.array([[0.0, 0.0, 1.0, 0.0], [2.0, 0.0, 0.0, 0.0]], np.float32)
    tensor = httpclient.InferInput("INPUT", [2, 4], "FP32")
    tensor.set_data_from_numpy(x)
    outputs = [httpclient.InferRequestedOutput("PROB", binary_data=False, class_count=2)]
    result = client.infer("classifier", [tensor], outputs=outputs).as_numpy("PROB")
    prob = softmax(x @ dataplane.models["classifier"].compute.weights)
    assert result.shape == (2, 2)
    for row, got in zip(prob, result, strict=True):
        top = np.argsort(-row)[:2]
        expected = [f"{row[i]:f}:{i}:{LABELS[i]}" for i in top]
        assert [g if isinstance(g, str) else g.decode() for g in got] == expected
    plain = client.infer("classifier", [tensor]).as_numpy("PROB")
    np.testing.assert_allclose(plain, prob, rtol=1e-5)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compression_both_ways(client, algorithm):
    a = np.arange(64, dtype=np.float32).reshape(4, 16)
    result = client.infer(
        "add_sub",
        add_sub_inputs(a, a),
        model_version="1",
        request_compression_algorithm=algorithm,
        response_compression_algorithm=algorithm,
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)


def test_statistics_count_inferences(client):
    before = client.get_inference_statistics("add_sub", "1")["model_stats"][0]
    a = np.ones((5, 16), np.float32)
    for _ in range(3):
        client.infer("add_sub", add_sub_inputs(a, a), model_version="1")
    after = client.get_inference_statistics("add_sub", "1")["model_stats"][0]
    assert after["inference_count"] - before["inference_count"] == 15
    assert after["execution_count"] - before["execution_count"] == 3
    assert after["inference_stats"]["success"]["ns"] > before["inference_stats"]["success"]["ns"]
    every = client.get_inference_statistics()["model_stats"]
    assert {"add_sub", "strings", "classifier"} <= {s["name"] for s in every}


def test_repository_api(client, dataplane):
    index = client.get_model_repository_index()
    states = {m["name"]: m["state"] for m in index}
    assert states["broken"] == "UNAVAILABLE" and states["add_sub"] == "READY"
    client.load_model("add_sub")
    client.unload_model("strings", unload_dependents=True)
    assert dataplane.unloaded[-1] == ("strings", {"unload_dependents": True})


def test_client_sees_errors_with_their_status(client):
    a = np.zeros((1, 8), np.float32)
    with pytest.raises(InferenceServerException) as info:
        client.infer("add_sub", add_sub_inputs(a, a))
    assert info.value.status() == "400" and "unexpected shape for input 'INPUT0'" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("no_such_model")
    assert info.value.status() == "404"


def binary_body(a, b):
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": n,
                    "datatype": "FP32",
                    "shape": list(x.shape),
                    "parameters": {"binary_data_size": x.nbytes},
                }
                for n, x in (("INPUT0", a), ("INPUT1", b))
            ]
        }
    ).encode()
    return header + a.tobytes() + b.tobytes(), len(header)


def json_body(shape, datatype="FP32", model_rows=None):
    count = int(np.prod(shape))
    inputs = [
        {"name": n, "datatype": datatype, "shape": shape, "data": [1] * count} for n in ("INPUT0", "INPUT1")
    ]
    return json.dumps({"inputs": inputs}).encode()


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "message"),
    [
        ("/v2/models/nope/infer", json_body([1, 16]), {}, 404, "unknown model: 'nope'"),
        ("/v2/models/add_sub/versions/9/infer", json_body([1, 16]), {}, 404, "version 9"),
        ("/v2/models/add_sub/infer", json_body([1, 15]), {}, 400, "unexpected shape for input 'INPUT0'"),
        ("/v2/models/add_sub/infer", json_body([1, 16], "INT32"), {}, 400, "data-type is 'INT32'"),
        ("/v2/models/add_sub/infer", json_body([9, 16]), {}, 400, "batch-size must be <= 8"),
        ("/v2/models/add_sub/infer", b'{"inputs": [{"name": ', {}, 400, "failed to parse the request JSON"),
        (
            "/v2/models/broken/infer",
            b'{"inputs":[{"name":"X","datatype":"INT64","shape":[1],"data":[1]}]}',
            {},
            503,
            "not ready",
        ),
        ("/v2/nothing/here", b"", {}, 404, "Not Found"),
    ],
)
def test_raw_http_errors(server, path, body, headers, status, message):
    code, reply_headers, reply = raw(server, "POST", path, body, headers)
    assert code == status, reply
    assert message in json.loads(reply)["error"]


def test_lying_header_length(server):
    a = np.ones((1, 16), np.float32)
    body, length = binary_body(a, a)
    for lie, message in [
        (length + 1000, "inference header size should be in range"),
        (length - 2, "failed to parse the request JSON"),
        (length + 8, "failed to parse the request JSON"),
        ("many", "must be an integer"),
    ]:
        code, _, reply = raw(
            server, "POST", "/v2/models/add_sub/infer", body, {"Inference-Header-Content-Length": str(lie)}
        )
        assert code == 400 and message in json.loads(reply)["error"], (lie, reply)
    code, headers, reply = raw(
        server,
        "POST",
        "/v2/models/add_sub/versions/1/infer",
        body,
        {"Inference-Header-Content-Length": str(length), "Content-Type": "application/octet-stream"},
    )
    assert code == 200 and json.loads(reply)["outputs"][0]["data"] == [2.0] * 16


def test_binary_response_headers_over_the_wire(server):
    a = np.ones((1, 16), np.float32)
    body, length = binary_body(a, a)
    doc = json.loads(body[:length])
    doc["parameters"] = {"binary_data_output": True}
    header = json.dumps(doc).encode()
    code, headers, reply = raw(
        server,
        "POST",
        "/v2/models/add_sub/versions/1/infer",
        header + body[length:],
        {"Inference-Header-Content-Length": str(len(header))},
    )
    assert code == 200
    json_length = int(headers["inference-header-content-length"])
    assert headers["content-type"] == "application/octet-stream"
    assert len(reply) == json_length + 2 * a.nbytes
    np.testing.assert_array_equal(np.frombuffer(reply, np.float32, 16, json_length), 2 * a.ravel())


async def test_aio_client_many_concurrent_distinct_requests(server):
    async with aioclient.InferenceServerClient(server.url) as client:
        assert await client.is_server_live()
        assert (await client.get_model_metadata("add_sub"))["name"] == "add_sub"
        assert (await client.get_model_config("strings"))["name"] == "strings"

        async def one(i: int):
            a = np.full((1 + i % 4, 16), i, np.float32)
            b = np.arange(16, dtype=np.float32) * np.ones_like(a)
            inputs = [
                aioclient.InferInput("INPUT0", list(a.shape), "FP32"),
                aioclient.InferInput("INPUT1", list(b.shape), "FP32"),
            ]
            inputs[0].set_data_from_numpy(a, binary_data=i % 2 == 0)
            inputs[1].set_data_from_numpy(b, binary_data=True)
            result = await client.infer("add_sub", inputs, model_version="1", request_id=str(i))
            return i, a, b, result

        for i, a, b, result in await asyncio.gather(*(one(i) for i in range(64))):
            assert result.get_response()["id"] == str(i)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_model_app_behind_a_mount_point(dataplane):
    """A model's own replica: only its routes, under the mount point Ray Serve gives it."""
    app = ModelHTTPApp(dataplane, "add_sub")
    with BackgroundServer(app, root_path="/v2/models/add_sub") as running:
        client = httpclient.InferenceServerClient(running.url)
        try:
            assert client.is_model_ready("add_sub")
            assert client.get_model_metadata("add_sub")["versions"] == ["1", "2"]
            a = np.ones((2, 16), np.float32)
            np.testing.assert_array_equal(
                client.infer("add_sub", add_sub_inputs(a, a)).as_numpy("OUTPUT0"), 2 * a + 1
            )
            assert client.get_inference_statistics("add_sub")["model_stats"]
            with pytest.raises(InferenceServerException) as info:
                client.get_model_metadata("strings")
            assert info.value.status() == "404"
        finally:
            client.close()
