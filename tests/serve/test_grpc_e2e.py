"""End to end over gRPC and the generate extension: the real tritonclient.grpc (sync, aio, streaming)
and a Server-Sent Events client (sseclient-py), against the shared Ray Serve instance."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2 as triton_pb
from tritonclient.grpc import service_pb2_grpc as triton_grpc
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.serve

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def client(grpc_url: str) -> grpcclient.InferenceServerClient:
    c = grpcclient.InferenceServerClient(grpc_url)
    yield c
    c.close()


def _add_sub_inputs(a: np.ndarray, b: np.ndarray, grpc_module: Any = grpcclient) -> list[Any]:
    inputs = []
    for name, value in (("INPUT0", a), ("INPUT1", b)):
        tensor = grpc_module.InferInput(name, list(value.shape), "FP32")
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def _words_inputs(text: str, max_tokens: int | None = None, grpc_module: Any = grpcclient) -> list[Any]:
    text_input = grpc_module.InferInput("text_input", [1], "BYTES")
    text_input.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
    inputs = [text_input]
    if max_tokens is not None:
        limit = grpc_module.InferInput("max_tokens", [1], "INT32")
        limit.set_data_from_numpy(np.array([max_tokens], dtype=np.int32))
        inputs.append(limit)
    return inputs


# --- every RPC, sync client ---------------------------------------------------------------


def test_health_and_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert not client.is_server_ready()  # strict readiness: failing_init cannot load
    assert client.is_model_ready("add_sub")
    assert not client.is_model_ready("failing_init")
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "triton" and "statistics" in meta["extensions"]
    model = client.get_model_metadata("add_sub", as_json=True)
    assert [i["name"] for i in model["inputs"]] == ["INPUT0", "INPUT1"]
    assert model["versions"] == ["1"]


def test_config_statistics_index(client: grpcclient.InferenceServerClient) -> None:
    config = client.get_model_config("word_stream", as_json=True)["config"]
    assert config["name"] == "word_stream"
    assert config["model_transaction_policy"]["decoupled"] is True
    client.infer("add_sub", _add_sub_inputs(np.ones((1, 4), np.float32), np.ones((1, 4), np.float32)))
    deadline = time.monotonic() + 10  # replicas push their statistics every second
    while True:
        stats = client.get_inference_statistics("add_sub", as_json=True)["model_stats"]
        if int(stats[0].get("inference_count", 0)) >= 1 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert stats[0]["name"] == "add_sub" and int(stats[0]["inference_count"]) >= 1
    index = {m["name"]: m for m in client.get_model_repository_index(as_json=True)["models"]}
    assert index["add_sub"]["state"] == "READY"
    assert index["failing_init"]["state"] == "UNAVAILABLE"


def test_repository_load_and_unload(client: grpcclient.InferenceServerClient) -> None:
    client.unload_model("multi_version")
    deadline = time.monotonic() + 60
    while client.is_model_ready("multi_version") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not client.is_model_ready("multi_version")
    client.load_model("multi_version")
    assert client.is_model_ready("multi_version")
    x = np.ones((1, 4), np.float32)
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("multi_version", [tensor], model_version="2")
    assert np.array_equal(result.as_numpy("OUTPUT0"), x * 2)


def test_infer_unary(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.full((2, 4), 3, np.float32)
    result = client.infer(
        "add_sub",
        _add_sub_inputs(a, b),
        request_id="r1",
        outputs=[grpcclient.InferRequestedOutput("OUTPUT1")],
    )
    assert result.get_response().id == "r1"
    assert np.array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0") is None


def test_strings_and_typed_contents(grpc_url: str) -> None:
    words = np.array([b"hello", b"gRPC"], dtype=np.object_)
    with grpcclient.InferenceServerClient(grpc_url) as c:
        config = c.get_model_config("string_upper", as_json=True)["config"]
        tensor = grpcclient.InferInput(config["input"][0]["name"], [2], "BYTES")
        tensor.set_data_from_numpy(words)
        result = c.infer("string_upper", [tensor])
        assert result.as_numpy(config["output"][0]["name"]).tolist() == [b"HELLO", b"GRPC"]
    # typed contents (no raw_input_contents), through the generated stub
    with grpc.insecure_channel(grpc_url) as channel:
        stub = triton_grpc.GRPCInferenceServiceStub(channel)
        request = triton_pb.ModelInferRequest(model_name="add_sub")
        for name in ("INPUT0", "INPUT1"):
            entry = request.inputs.add(name=name, datatype="FP32", shape=[1, 4])
            entry.contents.fp32_contents.extend([1.0, 2.0, 3.0, 4.0])
        reply = stub.ModelInfer(request)
        out0 = np.frombuffer(reply.raw_output_contents[0], dtype=np.float32)
        assert out0.tolist() == [2.0, 4.0, 6.0, 8.0]


def test_a_large_message_round_trips_with_its_bytes_outside_protobuf(grpc_url: str) -> None:
    # about 660 KB each way: read in place and answered in parts (deployments/protocol/raw_tail.py)
    words = np.array([b"w%06d" % i for i in range(60_000)], dtype=np.object_)
    with grpcclient.InferenceServerClient(grpc_url) as c:
        config = c.get_model_config("string_upper", as_json=True)["config"]
        tensor = grpcclient.InferInput(config["input"][0]["name"], [len(words)], "BYTES")
        tensor.set_data_from_numpy(words)
        result = c.infer("string_upper", [tensor])
        assert result.as_numpy(config["output"][0]["name"]).tolist() == [w.upper() for w in words]


def test_error_status_codes(client: grpcclient.InferenceServerClient) -> None:
    x = np.ones((1, 4), np.float32)
    cases = [
        (lambda: client.infer("no_such_model", _add_sub_inputs(x, x)), "StatusCode.NOT_FOUND"),
        (lambda: client.get_model_metadata("no_such_model"), "StatusCode.NOT_FOUND"),
        (lambda: client.infer("add_sub", _add_sub_inputs(x, x), model_version="7"), "StatusCode.NOT_FOUND"),
        (lambda: client.infer("add_sub", _add_sub_inputs(x, x)[:1]), "StatusCode.INVALID_ARGUMENT"),
        # a model the server knows with no version ready: Triton's NOT_FOUND, "has no available versions"
        (lambda: client.infer("failing_init", _add_sub_inputs(x, x)[:1]), "StatusCode.NOT_FOUND"),
        (lambda: client.infer("word_stream", _words_inputs("a b")), "StatusCode.UNIMPLEMENTED"),
        (lambda: client.register_cuda_shared_memory("r", b"\x00", 0, 1), "StatusCode.INVALID_ARGUMENT"),
        (lambda: client.update_trace_settings(settings={"trace_file": "t.json"}), "StatusCode.UNIMPLEMENTED"),
        (lambda: client.update_log_settings({"log_file": "elsewhere.log"}), "StatusCode.UNIMPLEMENTED"),
    ]
    for call, status in cases:
        with pytest.raises(InferenceServerException) as caught:
            call()
        assert caught.value.status() == status, caught.value


def test_message_over_the_limit_is_refused(client: grpcclient.InferenceServerClient) -> None:
    big = np.zeros((1, 4), np.float32)
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(big)
    too_big = grpcclient.InferInput("INPUT1", [1, 17 * 1024 * 1024], "FP32")
    too_big.set_data_from_numpy(np.zeros((1, 17 * 1024 * 1024), np.float32))  # 68 MiB > 64 MiB
    with pytest.raises(InferenceServerException) as caught:
        client.infer("add_sub", [tensor, too_big])
    assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"


def test_gzip_compressed_call(client: grpcclient.InferenceServerClient) -> None:
    a = np.ones((1, 4), np.float32)
    result = client.infer("add_sub", _add_sub_inputs(a, a), compression_algorithm="gzip")
    assert np.array_equal(result.as_numpy("OUTPUT0"), a + a)


# --- aio: many concurrent unary calls -----------------------------------------------------


def test_a_thousand_concurrent_unary_calls(grpc_url: str) -> None:
    async def run() -> None:
        async with aioclient.InferenceServerClient(grpc_url) as c:

            async def one(i: int) -> None:
                a = np.full((1, 4), i, np.float32)
                b = np.arange(4, dtype=np.float32).reshape(1, 4)
                result = await c.infer("add_sub", _add_sub_inputs(a, b, aioclient), request_id=str(i))
                assert result.get_response().id == str(i)
                assert np.array_equal(result.as_numpy("OUTPUT0"), a + b)
                assert np.array_equal(result.as_numpy("OUTPUT1"), a - b)

            await asyncio.gather(*(one(i) for i in range(1000)))

    asyncio.run(run())


# --- streaming: decoupled and not ----------------------------------------------------------


def test_sync_stream_several_requests_interleaved(grpc_url: str) -> None:
    answers: queue.Queue[Any] = queue.Queue()
    texts = {f"q{r}": " ".join(f"r{r}w{i}" for i in range(5 + r)) for r in range(6)}
    with grpcclient.InferenceServerClient(grpc_url) as c:
        c.start_stream(callback=lambda result, error: answers.put((result, error)))
        for request_id, text in texts.items():
            c.async_stream_infer("word_stream", _words_inputs(text), request_id=request_id)
        c.async_stream_infer(
            "add_sub",
            _add_sub_inputs(np.ones((1, 4), np.float32), np.ones((1, 4), np.float32)),
            request_id="u",
        )
        expected = sum(len(t.split()) for t in texts.values()) + 1
        got: dict[str, list[tuple[int, str]]] = {}
        for _ in range(expected):
            result, error = answers.get(timeout=30)
            assert error is None, error
            response = result.get_response()
            if response.id == "u":
                assert result.as_numpy("OUTPUT0").tolist() == [[2.0] * 4]
                continue
            assert response.parameters["triton_final_response"].bool_param is False
            word = result.as_numpy("text_output")[0].decode()
            got.setdefault(response.id, []).append((int(result.as_numpy("index")[0]), word))
        c.stop_stream()
    for request_id, text in texts.items():
        assert got[request_id] == list(enumerate(text.split())), request_id


def test_a_stream_whose_first_request_comes_late_is_answered(grpc_url: str) -> None:
    """A client may open a stream and send its first request seconds later (Triton's lifecycle test
    waits a second first): HAProxy, which reads the first request to route the stream, waits for it
    rather than answering 408."""
    answers: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(grpc_url) as c:
        c.start_stream(callback=lambda result, error: answers.put((result, error)))
        time.sleep(1.5)
        c.async_stream_infer("word_stream", _words_inputs("late words"), request_id="late")
        words = []
        for _ in range(2):
            result, error = answers.get(timeout=30)
            assert error is None, error
            words.append(result.as_numpy("text_output")[0].decode())
        c.stop_stream()
    assert words == ["late", "words"]


def test_empty_final_response_when_asked(grpc_url: str) -> None:
    answers: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(grpc_url) as c:
        c.start_stream(callback=lambda result, error: answers.put((result, error)))
        c.async_stream_infer(
            "word_stream", _words_inputs("one two"), request_id="e", enable_empty_final_response=True
        )
        finals = []
        for _ in range(3):
            result, error = answers.get(timeout=30)
            assert error is None
            finals.append(result.get_response().parameters["triton_final_response"].bool_param)
        c.stop_stream()
    assert finals == [False, False, True]


def test_stream_errors_end_only_their_request(grpc_url: str) -> None:
    answers: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(grpc_url) as c:
        c.start_stream(callback=lambda result, error: answers.put((result, error)))
        c.async_stream_infer("word_stream", _words_inputs("fine !error never"), request_id="bad")
        c.async_stream_infer("no_such_model", _words_inputs("x"), request_id="missing")
        c.async_stream_infer("word_stream", _words_inputs("still here"), request_id="good")
        results: list[tuple[str, str]] = []
        errors: list[str] = []
        for _ in range(5):
            result, error = answers.get(timeout=30)
            if error is not None:
                errors.append(str(error))
            else:
                results.append((result.get_response().id, result.as_numpy("text_output")[0].decode()))
        c.stop_stream()
    assert sorted(results) == [("bad", "fine"), ("good", "here"), ("good", "still")]
    assert any("refused the word" in e for e in errors)
    assert any("no_such_model" in e for e in errors)


def test_concurrent_aio_streams_nothing_crossed_or_lost(grpc_url: str) -> None:
    streams, per_stream, words = 6, 4, 12

    async def run() -> None:
        async with aioclient.InferenceServerClient(grpc_url) as c:

            async def one_stream(s: int) -> None:
                async def requests() -> AsyncIterator[dict[str, Any]]:
                    for r in range(per_stream):
                        text = " ".join(f"s{s}r{r}w{i}" for i in range(words))
                        yield {
                            "model_name": "word_stream",
                            "inputs": _words_inputs(text, grpc_module=aioclient),
                            "request_id": f"s{s}r{r}",
                        }

                got: dict[str, list[str]] = {}
                async for result, error in c.stream_infer(requests()):
                    assert error is None, error
                    rid = result.get_response().id
                    got.setdefault(rid, []).append(result.as_numpy("text_output")[0].decode())
                    if sum(map(len, got.values())) == per_stream * words:
                        break
                for r in range(per_stream):
                    assert got[f"s{s}r{r}"] == [f"s{s}r{r}w{i}" for i in range(words)]

            await asyncio.wait_for(asyncio.gather(*(one_stream(s) for s in range(streams))), 120)

    asyncio.run(run())


def test_a_cancelled_stream_cancels_the_model(grpc_url: str, cancel_markers: Path) -> None:
    marker = cancel_markers / "41.cancelled"

    async def run() -> None:
        async with aioclient.InferenceServerClient(grpc_url) as c:
            x = aioclient.InferInput("X", [1], "INT32")
            x.set_data_from_numpy(np.array([41], dtype=np.int32))

            async def requests() -> AsyncIterator[dict[str, Any]]:
                yield {"model_name": "until_cancelled", "inputs": [x], "request_id": "c"}
                await asyncio.sleep(3600)  # keep the stream open

            stream = c.stream_infer(requests())
            seen = 0
            async for _result, error in stream:
                assert error is None
                seen += 1
                if seen == 3:
                    break
            stream.cancel()

    asyncio.run(run())
    deadline = time.monotonic() + 20
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists(), "the model never saw its request cancelled"
    assert int(marker.read_text()) < 1000


def test_a_cancelled_model_infer_cancels_the_model(grpc_url: str, cancel_markers: Path) -> None:
    """A unary call the client cancels reaches the model as ``request.is_cancelled()``, as in Triton
    (the call goes through HAProxy to the replica's HTTP/1.1 lane)."""
    marker = cancel_markers / "42.cancelled"
    with grpcclient.InferenceServerClient(grpc_url) as c:
        x = grpcclient.InferInput("X", [1], "INT32")
        x.set_data_from_numpy(np.array([42], dtype=np.int32))
        answers: list[Any] = []
        call = c.async_infer("until_cancelled_unary", [x], lambda result, error: answers.append(error))
        time.sleep(1.0)  # the request is running in the model
        assert answers == [] and not marker.exists()
        call.cancel()
        deadline = time.monotonic() + 20
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    assert marker.exists(), "the model never saw its request cancelled"
    assert int(marker.read_text()) < 1000  # seen within seconds, not at the model's 30 s end
    assert len(answers) == 1 and answers[0].status() == "StatusCode.CANCELLED"


def test_streamed_requests_count_in_statistics(client: grpcclient.InferenceServerClient) -> None:
    deadline = time.monotonic() + 10  # replicas push their statistics every second
    while True:
        stats = client.get_inference_statistics("word_stream", as_json=True)["model_stats"][0]
        if "count" in stats["inference_stats"]["success"] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert int(stats["inference_stats"]["success"]["count"]) >= 1
    assert int(stats["execution_count"]) >= 1


# --- the generate extension over HTTP ------------------------------------------------------


def _post(server_url: str, path: str, body: dict[str, Any], stream: bool) -> tuple[int, str, Any]:
    """Status, content type and body of a POST; an event stream read by a Server-Sent Events client
    (``sseclient``), as the list of its events' JSON data."""
    import requests
    import sseclient

    with requests.post(
        f"http://{server_url}{path}",
        json=body,
        stream=True,
        headers={"Accept": "text/event-stream"} if stream else {},
        timeout=60,
    ) as response:
        kind = response.headers.get("content-type", "")
        if stream and kind.startswith("text/event-stream"):
            events = [json.loads(event.data) for event in sseclient.SSEClient(response).events()]
            return response.status_code, kind, events
        return response.status_code, kind, response.json()


def test_generate_one_response(server_url: str) -> None:
    status, kind, body = _post(
        server_url, "/v2/models/add_sub/generate", {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1]}, False
    )
    assert status == 200 and kind.startswith("application/json")
    assert body == {
        "model_name": "add_sub",
        "model_version": "1",
        "OUTPUT0": [2.0, 3.0, 4.0, 5.0],
        "OUTPUT1": [0.0, 1.0, 2.0, 3.0],
    }
    status, _, body = _post(
        server_url, "/v2/models/word_stream/versions/1/generate", {"text_input": "one"}, False
    )
    assert (status, body["text_output"], body["index"]) == (200, "one", 0)


def test_generate_stream_events(server_url: str) -> None:
    text = "the quick brown fox jumps"
    status, kind, events = _post(
        server_url,
        "/v2/models/word_stream/generate_stream",
        {"text_input": text, "max_tokens": 4, "parameters": {"temperature": 0}},
        True,
    )
    assert status == 200 and kind.startswith("text/event-stream")
    assert [(e["index"], e["text_output"]) for e in events] == list(enumerate(text.split()[:4]))
    assert all(e["model_name"] == "word_stream" and e["model_version"] == "1" for e in events)


def test_generate_errors(server_url: str) -> None:
    status, kind, body = _post(
        server_url, "/v2/models/no_such_model/generate_stream", {"text_input": "x"}, True
    )
    assert status == 404 and kind.startswith("application/json") and "no_such_model" in body["error"]
    status, _, body = _post(server_url, "/v2/models/word_stream/generate", {"text_input": "a b"}, False)
    # Triton's text; this server answers it with 500 (docs/compatibility.md)
    assert status == 500 and "generate expects model to produce exactly 1 response" in body["error"]
    status, _, body = _post(server_url, "/v2/models/word_stream/generate_stream", {"max_tokens": 2}, True)
    assert status == 400 and "text_input" in body["error"]
    # an error after the first response: an error event in the stream
    status, _, events = _post(
        server_url, "/v2/models/word_stream/generate_stream", {"text_input": "ok !error"}, True
    )
    assert status == 200
    assert events[0]["text_output"] == "ok"
    assert "refused the word" in events[1]["error"]


def test_example_client_runs_as_printed(grpc_url: str) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "client_grpc.py"), "--url", grpc_url],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    assert "add_sub OUTPUT0" in done.stdout and "text_recognition TEXT" in done.stdout


# --- the path of a ModelInfer call --------------------------------------------------------------


def _backend_streams(backend: str) -> int:
    """Streams HAProxy has sent to ``backend`` so far (``show stat`` on the session's admin socket)."""
    import socket

    folder = Path(os.environ["RAY_SERVE_HAPROXY_SOCKET_PATH"]).parent
    sockets = sorted(folder.rglob("admin.sock"), key=lambda p: p.stat().st_mtime)
    assert sockets, f"no HAProxy admin socket under {folder}"
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(sockets[-1]))
        s.sendall(b"show stat\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    rows = data.decode().splitlines()
    header = rows[0].lstrip("# ").split(",")
    for row in rows[1:]:
        fields = dict(zip(header, row.split(","), strict=False))
        if fields.get("pxname") == backend and fields.get("svname") == "BACKEND":
            return int(fields["stot"])
    raise AssertionError(f"HAProxy has no backend {backend}")


def test_model_infer_reaches_the_models_replica_over_http1(client: grpcclient.InferenceServerClient) -> None:
    """One hop: HAProxy hands ModelInfer to the model's replicas' HTTP ports (HTTP/1.1, trailers), not
    to the server application; the answer is the model's, with its status."""
    backend = "trs-grpc-h1-model-add_sub"
    before = _backend_streams(backend)
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    for _ in range(5):
        result = client.infer("add_sub", _add_sub_inputs(a, np.ones((1, 4), np.float32)))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + 1)
    assert _backend_streams(backend) - before >= 5
    with pytest.raises(InferenceServerException) as caught:  # an error on that path: its gRPC status
        client.infer("add_sub", _add_sub_inputs(np.ones((1, 3), np.float32), np.ones((1, 3), np.float32)))
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert _backend_streams(backend) - before >= 6


def test_a_stream_goes_to_the_replica_of_its_first_requests_model(grpc_url: str) -> None:
    """One hop for a stream: HAProxy sends it to the replicas of the model its first request names,
    over HTTP/1.1 to their HTTP ports as ModelInfer; that replica answers the stream's later requests for other models too (a decoupled one, an
    unknown one's error) from there."""
    before = _backend_streams("trs-grpc-h1-stream-model-add_sub")
    answers: queue.Queue[Any] = queue.Queue()
    ones = np.ones((1, 4), np.float32)
    with grpcclient.InferenceServerClient(grpc_url) as c:
        c.start_stream(callback=lambda result, error: answers.put((result, error)))
        c.async_stream_infer("add_sub", _add_sub_inputs(ones, ones), request_id="first")
        result, error = answers.get(timeout=30)
        assert error is None and result.as_numpy("OUTPUT0").tolist() == [[2.0] * 4]
        c.async_stream_infer("word_stream", _words_inputs("alpha beta gamma"), request_id="words")
        words = []
        for _ in range(3):
            result, error = answers.get(timeout=30)
            assert error is None, error
            assert result.get_response().id == "words"
            words.append(result.as_numpy("text_output")[0].decode())
        assert words == ["alpha", "beta", "gamma"]
        c.async_stream_infer("no_such_model", _add_sub_inputs(ones, ones), request_id="lost")
        result, error = answers.get(timeout=30)
        assert result is None and "no_such_model" in str(error)
        c.async_stream_infer("add_sub", _add_sub_inputs(ones, 2 * ones), request_id="last")
        result, error = answers.get(timeout=30)
        assert error is None and result.as_numpy("OUTPUT1").tolist() == [[-1.0] * 4]
        c.stop_stream()
    assert _backend_streams("trs-grpc-h1-stream-model-add_sub") - before == 1
