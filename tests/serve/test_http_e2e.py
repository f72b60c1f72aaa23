"""End to end: the real tritonclient against the shared Ray Serve instance."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from tritonclient.utils import InferenceServerException

from tests.serve.counts import successes

pytestmark = pytest.mark.serve


@pytest.fixture(scope="module")
def client(server_url: str) -> httpclient.InferenceServerClient:
    c = httpclient.InferenceServerClient(server_url, concurrency=8)
    yield c
    c.close()


def _add_sub_inputs(a: np.ndarray, b: np.ndarray, binary: bool) -> list[httpclient.InferInput]:
    inputs = []
    for name, value in (("INPUT0", a), ("INPUT1", b)):
        i = httpclient.InferInput(name, list(value.shape), "FP32")
        i.set_data_from_numpy(value, binary_data=binary)
        inputs.append(i)
    return inputs


def _raw(url: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None):
    req = urllib.request.Request(f"http://{url}{path}", data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_server_health_and_metadata(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    meta = client.get_server_metadata()
    assert meta["name"] == "triton"
    assert "binary_tensor_data" in meta["extensions"]


def test_model_metadata_config_ready(client: httpclient.InferenceServerClient) -> None:
    assert client.is_model_ready("add_sub")
    meta = client.get_model_metadata("add_sub")
    assert meta["name"] == "add_sub"
    assert {i["name"]: i["shape"] for i in meta["inputs"]} == {"INPUT0": [-1, 4], "INPUT1": [-1, 4]}
    config = client.get_model_config("add_sub")
    assert config["max_batch_size"] == 8
    assert config["backend"] == "python"


@pytest.mark.parametrize("binary", [False, True])
def test_infer_add_sub(client: httpclient.InferenceServerClient, binary: bool) -> None:
    rng = np.random.default_rng(1)
    a = rng.random((2, 4), dtype=np.float32)
    b = rng.random((2, 4), dtype=np.float32)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
    result = client.infer("add_sub", _add_sub_inputs(a, b, binary), outputs=outputs, request_id="req-7")
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
    assert result.get_response()["id"] == "req-7"


def test_requested_output_only(client: httpclient.InferenceServerClient) -> None:
    a = np.ones((1, 4), np.float32)
    result = client.infer(
        "add_sub", _add_sub_inputs(a, a, True), outputs=[httpclient.InferRequestedOutput("OUTPUT1")]
    )
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros((1, 4), np.float32))


def test_bytes_tensor(client: httpclient.InferenceServerClient) -> None:
    words = np.array([b"triton", b"ray serve", "\u00e9t\u00e9".encode()], dtype=object)
    i = httpclient.InferInput("INPUT0", [3], "BYTES")
    i.set_data_from_numpy(words)
    result = client.infer("string_upper", [i])
    assert [w.decode() for w in result.as_numpy("OUTPUT0")] == ["TRITON", "RAY SERVE", "\u00c9T\u00c9"]


def test_versions(client: httpclient.InferenceServerClient) -> None:
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    for version, factor in (("1", 1), ("2", 2), ("", 2)):
        i = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        i.set_data_from_numpy(x)
        result = client.infer("multi_version", [i], model_version=version)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x * factor)
    assert client.get_model_metadata("multi_version")["versions"] == ["1", "2"]
    assert client.is_model_ready("multi_version", "1")
    with pytest.raises(InferenceServerException):
        client.get_model_metadata("multi_version", "3")


def test_statistics_count_rows_and_executions(client: httpclient.InferenceServerClient) -> None:
    before = client.get_inference_statistics("add_sub")["model_stats"][0]
    a = np.ones((3, 4), np.float32)
    client.infer("add_sub", _add_sub_inputs(a, a, True))
    after = client.get_inference_statistics("add_sub")["model_stats"][0]
    assert after["inference_count"] - before["inference_count"] == 3
    assert after["execution_count"] - before["execution_count"] == 1
    succ = after["inference_stats"]["success"]
    assert succ["count"] - before["inference_stats"]["success"]["count"] == 1
    assert succ["ns"] > 0
    every = client.get_inference_statistics()["model_stats"]
    assert {"add_sub", "crnn"} <= {s["name"] for s in every}


def test_unknown_model_is_404(server_url: str) -> None:
    status, body = _raw(server_url, "/v2/models/no_such_model")
    assert status == 404
    assert "no_such_model" in json.loads(body)["error"]
    status, _ = _raw(server_url, "/v2/models/no_such_model/infer", b"{}")
    assert status == 404


@pytest.mark.parametrize(
    "body, fragment",
    [
        (b"{not json", "json"),
        (
            json.dumps(
                {
                    "inputs": [
                        {"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]},
                        {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                    ]
                }
            ).encode(),
            "INPUT0",
        ),
        (
            json.dumps(
                {
                    "inputs": [
                        {"name": "INPUT0", "shape": [1, 4], "datatype": "INT32", "data": [1, 2, 3, 4]},
                        {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                    ]
                }
            ).encode(),
            "INPUT0",
        ),
        (
            json.dumps(
                {
                    "inputs": [
                        {"name": "INPUT0", "shape": [9, 4], "datatype": "FP32", "data": [0] * 36},
                        {"name": "INPUT1", "shape": [9, 4], "datatype": "FP32", "data": [0] * 36},
                    ]
                }
            ).encode(),
            "batch",
        ),
    ],
    ids=["malformed-json", "wrong-shape", "wrong-datatype", "batch-over-max"],
)
def test_bad_requests_are_400(server_url: str, body: bytes, fragment: str) -> None:
    status, reply = _raw(server_url, "/v2/models/add_sub/infer", body, {"Content-Type": "application/json"})
    assert status == 400
    assert fragment.lower() in json.loads(reply)["error"].lower()


def test_lying_header_length_is_400(server_url: str) -> None:
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "BYTES"}]}).encode()
    status, reply = _raw(
        server_url,
        "/v2/models/string_upper/infer",
        header + b"\x00" * 4,
        {"Inference-Header-Content-Length": str(len(header) + 100)},
    )
    assert status == 400
    assert "error" in json.loads(reply)


def test_gzip_request_and_response(server_url: str) -> None:
    doc = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "BYTES", "data": ["zip"]}]}
    status, reply = _raw(
        server_url,
        "/v2/models/string_upper/infer",
        gzip.compress(json.dumps(doc).encode()),
        {"Content-Encoding": "gzip", "Accept-Encoding": "gzip"},
    )
    assert status == 200
    assert json.loads(gzip.decompress(reply))["outputs"][0]["data"] == ["ZIP"]


def test_broken_models_listed_unavailable_while_others_serve(
    client: httpclient.InferenceServerClient,
) -> None:
    index = {row["name"]: row for row in client.get_model_repository_index()}
    assert index["add_sub"]["state"] == "READY"
    assert index["broken_config"]["state"] == "UNAVAILABLE"
    assert "max_batch_size" in index["broken_config"]["reason"]
    assert index["failing_init"]["state"] == "UNAVAILABLE"
    assert "weights file is corrupt" in index["failing_init"]["reason"]
    assert not client.is_model_ready("failing_init")
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("failing_init")
    assert "failing_init" in str(err.value)


def test_thousand_concurrent_requests_get_their_own_rows(server_url: str) -> None:
    async def run() -> tuple[int, int]:
        async with aioclient.InferenceServerClient(server_url, conn_limit=64) as c:
            before = (await c.get_inference_statistics("batched"))["model_stats"][0]

            async def one(k: int) -> None:
                x = np.full((1, 4), float(k), np.float32)
                x[0, 1] = -k
                i = aioclient.InferInput("INPUT0", [1, 4], "FP32")
                i.set_data_from_numpy(x)
                r = await c.infer("batched", [i])
                np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x)

            await asyncio.gather(*(one(k) for k in range(1000)))
            after = (await c.get_inference_statistics("batched"))["model_stats"][0]
            rows = after["inference_count"] - before["inference_count"]
            execs = after["execution_count"] - before["execution_count"]
            return rows, execs

    rows, execs = asyncio.run(run())
    assert rows == 1000
    assert execs < 1000  # batches of more than one request were formed


def test_aio_client_metadata_and_infer(server_url: str) -> None:
    async def run() -> np.ndarray:
        async with aioclient.InferenceServerClient(server_url) as c:
            # strict readiness: the test repository holds two models that failed to load
            assert not await c.is_server_ready()
            assert await c.is_model_ready("add_sub")
            a = np.full((1, 4), 2.0, np.float32)
            inputs = []
            for n in ("INPUT0", "INPUT1"):
                i = aioclient.InferInput(n, [1, 4], "FP32")
                i.set_data_from_numpy(a)
                inputs.append(i)
            r = await c.infer("add_sub", inputs)
            return r.as_numpy("OUTPUT0")

    np.testing.assert_array_equal(asyncio.run(run()), np.full((1, 4), 4.0, np.float32))


def test_ensemble_equals_its_steps_by_hand(client: httpclient.InferenceServerClient) -> None:
    rng = np.random.default_rng(3)
    image = rng.integers(0, 255, size=(1, 32, 100), dtype=np.uint8)

    def call(model: str, name: str, value: np.ndarray, datatype: str) -> httpclient.InferResult:
        i = httpclient.InferInput(name, list(value.shape), datatype)
        i.set_data_from_numpy(value)
        return client.infer(model, [i])

    pre_cfg = client.get_model_config("image_preprocess")
    post_cfg = client.get_model_config("crnn_postprocess")
    pre_out = pre_cfg["output"][0]["name"]
    crnn_in = client.get_model_config("crnn")["input"][0]["name"]
    crnn_out = client.get_model_config("crnn")["output"][0]["name"]
    x = call("image_preprocess", pre_cfg["input"][0]["name"], image, "UINT8").as_numpy(pre_out)
    logits = call("crnn", crnn_in, x, "FP32").as_numpy(crnn_out)
    text = call("crnn_postprocess", post_cfg["input"][0]["name"], logits, "FP32")
    expected = text.as_numpy(post_cfg["output"][0]["name"])

    before = successes(client, "crnn")
    result = call("text_recognition", "IMAGE", image, "UINT8").as_numpy("TEXT")
    np.testing.assert_array_equal(result, expected)
    stats = client.get_inference_statistics("text_recognition")["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] >= 1
    # the ensemble's replica hosts crnn in process; those runs count toward crnn's own statistics
    deadline = time.monotonic() + 10
    while successes(client, "crnn") < before + 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert successes(client, "crnn") >= before + 1


def test_ensemble_unknown_output_is_400(server_url: str) -> None:
    doc = {
        "inputs": [{"name": "IMAGE", "shape": [1, 2, 2], "datatype": "UINT8", "data": [1, 2, 3, 4]}],
        "outputs": [{"name": "NOPE"}],
    }
    status, reply = _raw(server_url, "/v2/models/text_recognition/infer", json.dumps(doc).encode())
    assert status == 400
    assert "NOPE" in json.loads(reply)["error"]


def test_bls_sync_calls_the_target_models_deployment(client: httpclient.InferenceServerClient) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.full((2, 4), 3, dtype=np.float32)
    before = client.get_inference_statistics("add_sub")["model_stats"][0]["inference_count"]
    result = client.infer("bls", _add_sub_inputs(a, b, binary=True))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    after = client.get_inference_statistics("add_sub")["model_stats"][0]["inference_count"]
    assert after - before == 2  # the two rows reached add_sub's own replica


def test_bls_async_exec_answers_through_the_target(client: httpclient.InferenceServerClient) -> None:
    a = np.array([[5, 1, 2, 9]], dtype=np.float32)
    b = np.array([[1, 4, 2, 3]], dtype=np.float32)
    result = client.infer("bls_async", _add_sub_inputs(a, b, binary=False))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * np.abs(a - b))


def test_bls_error_of_the_target_fails_only_that_request(client: httpclient.InferenceServerClient) -> None:
    a = np.ones((1, 4), dtype=np.float32)
    with pytest.raises(InferenceServerException, match="no_such_model"):
        client.infer("bls_missing", _add_sub_inputs(a, a, binary=True))
    result = client.infer("bls", _add_sub_inputs(a, a, binary=True))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)


def test_model_requests_skip_serves_wrapper_in_the_replica(client: httpclient.InferenceServerClient) -> None:
    """The replica's HTTP server hands the model's requests straight to its app (the direct lane)."""
    from ray import serve

    from deployments.serve.names import MODEL_DEPLOYMENT, model_app_name

    replica = serve.get_deployment_handle(MODEL_DEPLOYMENT, app_name=model_app_name("add_sub"))
    replica._init(_run_router_in_separate_loop=True)  # a blocking call from this thread (no event loop)
    before = replica.answered_directly.remote().result()
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    for _ in range(5):
        client.infer("add_sub", _add_sub_inputs(a, a, binary=True))
    assert client.is_model_ready("add_sub")
    after = replica.answered_directly.remote().result()
    assert before is not None and after - before == 6


def test_haproxy_reaches_this_nodes_replicas_through_their_local_sockets(client) -> None:
    """Serve writes each replica as ``127.0.0.1:<port>``; the HAProxy that runs has the replicas' HTTP
    servers at their abstract Unix sockets, and no per-request log line to Serve's default target."""
    from pathlib import Path

    from deployments.serve import local_sockets

    # Serve writes a folder per node beside the configured file's name
    (serve_written,) = Path(os.environ["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"]).parent.glob("*/haproxy.cfg")
    running = serve_written.with_name("haproxy.triton.cfg").read_text()
    assert "log 127.0.0.1:514" in serve_written.read_text() and "log 127.0.0.1:514" not in running

    def replicas(text: str) -> dict[tuple[str, str], str]:
        found, backend = {}, ""
        for line in text.splitlines():
            words = line.split()
            if words[:1] == ["backend"]:
                backend = words[1]
            elif (
                backend.startswith("http-")
                and words[:1] == ["server"]
                and words[1].startswith("SERVE_REPLICA_")
            ):
                found[(backend, words[1])] = words[2]
        return found

    written, runs = replicas(serve_written.read_text()), replicas(running)
    deadline = time.monotonic() + 10
    while written.keys() != runs.keys() and time.monotonic() < deadline:  # a reload under way
        time.sleep(0.2)
        running = serve_written.with_name("haproxy.triton.cfg").read_text()
        written, runs = replicas(serve_written.read_text()), replicas(running)
    assert written and written.keys() == runs.keys(), "no replica, or the two files disagree"
    for key, address in written.items():
        host, port = address.rsplit(":", 1)
        assert host == "127.0.0.1" and runs[key] == local_sockets.haproxy_address(int(port)), (key, runs[key])
    assert client.is_model_ready("add_sub")  # answered over a local socket
