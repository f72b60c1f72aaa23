"""End to end: Python-backend API models (written as Triton's documentation shows) on Ray Serve,
through the real tritonclient, and Triton's metrics endpoint.

The request API (ids, flags, timeout, parameters, requested outputs, initialize's args, response
parameters), request rescheduling, DLPack, pb_utils.Logger, auto_complete_config and BLS arguments
use the models of tests/backends/python_models that tests/serve/conftest.py adds to the repository.
"""

from __future__ import annotations

import json
import os
import queue
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from repository_loader.errors import STATUS_TABLE, ErrorCode
from tests.backends.helpers import TRITON_INITIALIZE_ARGS
from tests.serve.counts import metric

pytestmark = pytest.mark.serve


@pytest.fixture(scope="module")
def client(server_url: str) -> httpclient.InferenceServerClient:
    c = httpclient.InferenceServerClient(server_url, network_timeout=120)
    yield c
    c.close()


def _input(name: str, value: np.ndarray, datatype: str) -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, list(value.shape), datatype)
    tensor.set_data_from_numpy(value)
    return tensor


def _scrape(metrics_url: str) -> str:
    with urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=30) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return reply.read().decode()


def _scrape_until(metrics_url: str, ready: Callable[[str], bool], timeout: float = 10.0) -> str:
    """The first scrape for which ``ready`` holds: replicas of a model with several push their counters
    every ``stats_push_interval_s`` (1 s), so a scrape right after a request may not count it yet."""
    deadline = time.monotonic() + timeout
    text = _scrape(metrics_url)
    while not ready(text) and time.monotonic() < deadline:
        time.sleep(0.25)
        text = _scrape(metrics_url)
    return text


def _value(text: str, family: str, model: str, extra: str = "") -> float:
    found = metric(text, family, model, extra)
    assert found is not None, f"no {family} of {model} ({extra}) in /metrics"
    return found


@pytest.mark.parametrize("target", ["add_sub_flat", "add_sub_ensemble"])
def test_bls_target_named_by_a_bytes_input(client: httpclient.InferenceServerClient, target: str) -> None:
    a = np.array([1, 2, 3, 4], np.float32)
    b = np.array([10, 20, 30, 40], np.float32)
    inputs = [
        _input("MODEL_NAME", np.array([target.encode()], dtype=np.object_), "BYTES"),
        _input("INPUT0", a, "FP32"),
        _input("INPUT1", b, "FP32"),
    ]
    result = client.infer("bls_by_name", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_bls_to_an_unknown_model_is_not_found(client: httpclient.InferenceServerClient) -> None:
    a = np.zeros(4, np.float32)
    inputs = [
        _input("MODEL_NAME", np.array([b"no_such_model"], dtype=np.object_), "BYTES"),
        _input("INPUT0", a, "FP32"),
        _input("INPUT1", a, "FP32"),
    ]
    with pytest.raises(InferenceServerException) as err:
        client.infer("bls_by_name", inputs)
    assert err.value.status() == "404"
    assert "'no_such_model'" in err.value.message() and "b'" not in err.value.message()


@pytest.mark.parametrize("model", ["bls_decoupled_sync", "bls_decoupled_async"])
def test_decoupled_model_streams_to_a_bls_caller(
    client: httpclient.InferenceServerClient, model: str
) -> None:
    values = np.array([3, 1, 4, 1, 5], np.int32)
    result = client.infer(model, [_input("IN", values, "INT32")])
    # the async model streams two calls at once (asyncio.gather) and joins them in order
    calls = 2 if model == "bls_decoupled_async" else 1
    np.testing.assert_array_equal(result.as_numpy("VALUES"), np.tile(values, calls))
    assert result.as_numpy("COUNT").tolist() == [5 * calls]


ERROR_NAMES = ("INVALID_ARG", "NOT_FOUND", "UNAVAILABLE", "UNSUPPORTED", "INTERNAL", "ALREADY_EXISTS")


@pytest.mark.parametrize("name", ERROR_NAMES)
def test_triton_error_codes_reach_the_http_client(
    client: httpclient.InferenceServerClient, name: str
) -> None:
    code = _input("CODE", np.array([name.encode()], dtype=np.object_), "BYTES")
    with pytest.raises(InferenceServerException) as err:
        client.infer("error_codes", [code])
    assert err.value.status() == str(STATUS_TABLE[ErrorCode(name)][0])
    assert f"failed with {name}" in err.value.message()


@pytest.mark.parametrize("name", ERROR_NAMES)
def test_triton_error_codes_reach_the_grpc_client(grpc_url: str, name: str) -> None:
    with grpcclient.InferenceServerClient(grpc_url) as grpc_client:
        code = grpcclient.InferInput("CODE", [1], "BYTES")
        code.set_data_from_numpy(np.array([name.encode()], dtype=np.object_))
        with pytest.raises(InferenceServerException) as err:
            grpc_client.infer("error_codes", [code])
    assert err.value.status() == f"StatusCode.{STATUS_TABLE[ErrorCode(name)][1]}"
    assert f"failed with {name}" in err.value.message()


def test_model_exception_fails_the_request_with_500(client: httpclient.InferenceServerClient) -> None:
    code = _input("CODE", np.array([b"EXCEPTION"], dtype=np.object_), "BYTES")
    with pytest.raises(InferenceServerException) as err:
        client.infer("error_codes", [code])
    assert err.value.status() == "500" and "the whole batch failed" in err.value.message()
    ok = client.infer("error_codes", [_input("CODE", np.array([b"OK"], dtype=np.object_), "BYTES")])
    assert ok.as_numpy("OUT").tolist() == [1]


def test_bls_model_control(client: httpclient.InferenceServerClient) -> None:
    def control(action: str) -> bool:
        inputs = [
            _input("ACTION", np.array([action.encode()], dtype=np.object_), "BYTES"),
            _input("TARGET", np.array([b"control_target"], dtype=np.object_), "BYTES"),
        ]
        return bool(client.infer("model_control", inputs).as_numpy("READY")[0])

    assert control("ready") is True
    assert control("unload") is False
    assert not client.is_model_ready("control_target")
    assert control("load") is True
    assert client.is_model_ready("control_target")


# tritonserver 2.51's text for the custom_metrics model (captured from the peer), values after the requests
CUSTOM_LINES = [
    "# HELP custom_requests_total Requests this model executed",
    "# TYPE custom_requests_total counter",
    'custom_requests_total{model="custom_metrics",version="1"} 2',
    "# HELP custom_last_input_size Elements of the last input",
    "# TYPE custom_last_input_size gauge",
    'custom_last_input_size{model="custom_metrics",version="1"} 1',
    "# HELP custom_input_value Input values",
    "# TYPE custom_input_value histogram",
    'custom_input_value_count{model="custom_metrics",version="1"} 4',
    'custom_input_value_sum{model="custom_metrics",version="1"} 29.5',
    'custom_input_value_bucket{model="custom_metrics",version="1",le="1"} 1',
    'custom_input_value_bucket{model="custom_metrics",version="1",le="5"} 2',
    'custom_input_value_bucket{model="custom_metrics",version="1",le="10"} 3',
    'custom_input_value_bucket{model="custom_metrics",version="1",le="+Inf"} 4',
]


def test_custom_metrics_on_the_metrics_port(
    client: httpclient.InferenceServerClient, metrics_url: str
) -> None:
    for values in ([0.5, 2.0, 7.0], [20.0]):
        result = client.infer("custom_metrics", [_input("IN", np.array(values, np.float32), "FP32")])
    assert result.as_numpy("COUNT").tolist() == [2.0]
    text = _scrape_until(metrics_url, lambda text: CUSTOM_LINES[2] in text.splitlines())
    lines = text.splitlines()
    for line in CUSTOM_LINES:
        assert line in lines, line
    for help_line in (line for line in CUSTOM_LINES if line.startswith("# HELP")):
        type_line = lines[lines.index(help_line) + 1]
        assert type_line.startswith("# TYPE " + help_line.split()[2] + " "), type_line
    latency = 'custom_execute_latency_ns{model="custom_metrics",version="1"} '
    assert "# TYPE custom_execute_latency_ns counter" in lines
    assert any(line.startswith(latency) and float(line.split()[-1]) > 0 for line in lines)
    # tritonserver's order: counters (Triton's, then custom), gauges, histograms last
    types = [line.split()[2] for line in lines if line.startswith("# TYPE")]
    assert types.index("nv_inference_compute_output_duration_us") < types.index("custom_requests_total")
    assert types.index("custom_requests_total") < types.index("nv_inference_pending_request_count")
    assert types.index("nv_inference_pending_request_count") < types.index("custom_last_input_size")
    assert types[-1] == "custom_input_value"


def test_triton_metrics_after_requests(
    client: httpclient.InferenceServerClient, server_url: str, metrics_url: str
) -> None:
    before = _scrape(metrics_url)
    a = np.ones(4, np.float32)
    for _ in range(3):
        client.infer("add_sub_flat", [_input("INPUT0", a, "FP32"), _input("INPUT1", a, "FP32")])
    code = _input("CODE", np.array([b"NOT_FOUND"], dtype=np.object_), "BYTES")
    with pytest.raises(InferenceServerException):
        client.infer("error_codes", [code])
    done = _value(before, "nv_inference_request_success", "add_sub_flat") + 3
    failures = metric(before, "nv_inference_request_failure", "error_codes", 'reason="BACKEND",') or 0

    def counted(text: str) -> bool:  # error_codes is pooled: its host pushes its counts every second
        failed = metric(text, "nv_inference_request_failure", "error_codes", 'reason="BACKEND",') or 0
        return _value(text, "nv_inference_request_success", "add_sub_flat") >= done and failed > failures

    after = _scrape_until(metrics_url, counted)
    for family in ("nv_inference_request_success", "nv_inference_count", "nv_inference_exec_count"):
        assert _value(after, family, "add_sub_flat") - _value(before, family, "add_sub_flat") == 3, family
    for family in (
        "nv_inference_request_duration_us",
        "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us",
    ):
        assert _value(after, family, "add_sub_flat") > _value(before, family, "add_sub_flat"), family
    failed = _value(after, "nv_inference_request_failure", "error_codes", 'reason="BACKEND",')
    assert failed > failures
    assert _value(after, "nv_inference_pending_request_count", "add_sub_flat") == 0
    for line in (
        "# HELP nv_inference_request_success Number of successful inference requests, all batch sizes",
        "# TYPE nv_inference_request_success counter",
        "# HELP nv_inference_queue_duration_us Cumulative inference queuing duration in microseconds "
        "(includes cached requests)",
        "# TYPE nv_inference_pending_request_count gauge",
        "# TYPE nv_cpu_memory_total_bytes gauge",
    ):
        assert line in after.splitlines(), line
    assert "ray_" not in after
    # the statistics extension splits compute time the same way
    stats = client.get_inference_statistics("add_sub_flat")["model_stats"][0]["inference_stats"]
    assert all(stats[k]["ns"] > 0 for k in ("compute_input", "compute_infer", "compute_output"))


def test_metrics_port_answers_only_metrics(metrics_url: str) -> None:
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://{metrics_url}/v2/health/ready", timeout=10)
    assert err.value.code == 404


# --- the InferenceRequest API, initialize's args and response parameters ------------------------

REQUEST_PARAMETERS = {"p": 1, "s": "x", "b": True}


def _info(result: httpclient.InferResult | grpcclient.InferResult) -> dict:
    return json.loads(result.as_numpy("INFO")[0])


def _check_initialize_args(info: dict, test_repository: Path) -> None:
    assert info["args"] == sorted(TRITON_INITIALIZE_ARGS)
    values = info["arg_values"]
    assert values["model_name"] == "request_api" and values["model_version"] == "1"
    assert values["model_instance_kind"] == "CPU" and values["model_instance_device_id"] == "0"
    assert values["model_repository"] == str(test_repository / "request_api")
    assert isinstance(values["model_instance_name"], str) and values["model_instance_name"]
    config = info["model_config"]
    assert config["name"] == "request_api" and config["backend"] == "python"
    assert config["max_batch_size"] == 0
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [("IN", "TYPE_INT32", [-1])]
    assert [(o["name"], o["data_type"]) for o in config["output"]] == [
        ("INFO", "TYPE_STRING"),
        ("OUT", "TYPE_INT32"),
    ]


def test_request_api_over_http(client: httpclient.InferenceServerClient, test_repository: Path) -> None:
    values = np.array([5, -1, 7], np.int32)
    outputs = [httpclient.InferRequestedOutput(n) for n in ("INFO", "OUT")]
    result = client.infer(
        "request_api",
        [_input("IN", values, "INT32")],
        outputs=outputs,
        request_id="req-7",
        sequence_id=42,
        sequence_start=True,
        timeout=5_000_000,
        parameters=REQUEST_PARAMETERS,
    )
    info = _info(result)
    assert info["request_id"] == "req-7" and info["correlation_id"] == 42
    assert info["flags"] == 1  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
    assert info["timeout"] == 5_000_000 and info["parameters"] == REQUEST_PARAMETERS
    assert info["requested_output_names"] == ["INFO", "OUT"]
    assert info["inputs"] == ["IN"] and info["is_cancelled"] is False
    _check_initialize_args(info, test_repository)
    np.testing.assert_array_equal(result.as_numpy("OUT"), values)
    response = result.get_response()
    assert response["id"] == "req-7" and response["parameters"] == {"echoed": True}


def test_request_api_defaults_and_requested_outputs_over_http(
    client: httpclient.InferenceServerClient,
) -> None:
    values = np.array([3], np.int32)
    # no outputs named: every output of the config is requested
    info = _info(client.infer("request_api", [_input("IN", values, "INT32")]))
    assert info["request_id"] == "" and info["correlation_id"] == 0
    assert (info["flags"], info["timeout"], info["parameters"]) == (0, 0, {})
    assert info["requested_output_names"] == ["INFO", "OUT"]
    # one output named: the model is told so, and only that output comes back
    result = client.infer(
        "request_api",
        [_input("IN", values, "INT32")],
        outputs=[httpclient.InferRequestedOutput("INFO")],
        sequence_id="seq-a",
        sequence_end=True,
    )
    info = _info(result)
    assert info["requested_output_names"] == ["INFO"] and result.as_numpy("OUT") is None
    assert info["correlation_id"] == "seq-a" and info["flags"] == 2  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_END


def test_request_api_over_grpc(grpc_url: str, test_repository: Path) -> None:
    values = np.array([9, 8], np.int32)
    with grpcclient.InferenceServerClient(grpc_url) as c:
        tensor = grpcclient.InferInput("IN", [2], "INT32")
        tensor.set_data_from_numpy(values)
        result = c.infer(
            "request_api",
            [tensor],
            outputs=[grpcclient.InferRequestedOutput("OUT"), grpcclient.InferRequestedOutput("INFO")],
            request_id="g-1",
            sequence_id="seq-g",
            sequence_start=True,
            sequence_end=True,
            timeout=2_500_000,
            parameters=REQUEST_PARAMETERS,
        )
    info = _info(result)
    assert info["request_id"] == "g-1" and info["correlation_id"] == "seq-g"
    assert info["flags"] == 3  # SEQUENCE_START | SEQUENCE_END
    assert info["timeout"] == 2_500_000 and info["parameters"] == REQUEST_PARAMETERS
    assert sorted(info["requested_output_names"]) == ["INFO", "OUT"]
    _check_initialize_args(info, test_repository)
    np.testing.assert_array_equal(result.as_numpy("OUT"), values)
    response = result.get_response()
    assert response.id == "g-1"
    assert list(response.parameters) == ["echoed"] and response.parameters["echoed"].bool_param is True


# --- request rescheduling -----------------------------------------------------------------------


def test_rescheduled_requests_over_a_grpc_stream(grpc_url: str) -> None:
    """``reschedule`` answers IN=n with n responses counting down to 0, one per ``execute``: each
    request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE until its last response."""
    answers: queue.Queue[Any] = queue.Queue()
    counts = {"three": 3, "two": 2, "one": 1}
    with grpcclient.InferenceServerClient(grpc_url) as c:
        c.start_stream(callback=lambda result, error: answers.put((result, error)))
        for request_id, n in counts.items():
            tensor = grpcclient.InferInput("IN", [1], "INT32")
            tensor.set_data_from_numpy(np.array([n], np.int32))
            c.async_stream_infer("reschedule", [tensor], request_id=request_id)
        got: dict[str, list[tuple[int, bool]]] = {}
        for _ in range(sum(counts.values())):
            result, error = answers.get(timeout=30)
            assert error is None, error
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            got.setdefault(response.id, []).append((int(result.as_numpy("OUT")[0]), final))
        c.stop_stream()
    assert got == {
        request_id: [(left, left == 0) for left in range(n - 1, -1, -1)] for request_id, n in counts.items()
    }


# --- DLPack and is_cpu ----------------------------------------------------------------------------


def test_dlpack_identity_over_http_and_grpc(client: httpclient.InferenceServerClient, grpc_url: str) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    result = client.infer("dlpack_identity", [_input("X", x, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("Y"), x)
    with grpcclient.InferenceServerClient(grpc_url) as c:
        tensor = grpcclient.InferInput("X", [2, 3], "FP32")
        tensor.set_data_from_numpy(x)
        np.testing.assert_array_equal(c.infer("dlpack_identity", [tensor]).as_numpy("Y"), x)


def test_dlpack_with_numpy_and_torch_on_the_cpu(client: httpclient.InferenceServerClient) -> None:
    x = np.array([1.5, -2.0, 0.25, 8.0, 3.0], np.float32)
    result = client.infer("dlpack_report", [_input("X", x, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("Y"), x)
    np.testing.assert_array_equal(result.as_numpy("DOUBLED"), 2 * x)
    # X is_cpu, Y is_cpu, Y shares X's buffer (no copy through DLPack), torch's result is_cpu
    assert result.as_numpy("FACTS").tolist() == [True, True, True, True]


# --- pb_utils.Logger ------------------------------------------------------------------------------


def _replica_log_lines(pid: int, marker: str) -> list[str]:
    """Lines with ``marker`` in the log files of the replica process ``pid``: Ray's worker files
    (its stdout and stderr, ``worker-*-<pid>.out/.err``) and Serve's replica logs of ``logger_api``."""
    logs = Path(os.readlink(f"/proc/{pid}/fd/2")).parent
    files = [*logs.glob(f"worker-*-{pid}.*"), *logs.glob("serve/replica_*logger_api*.log")]
    return [line for f in files for line in f.read_text(errors="replace").splitlines() if marker in line]


def test_logger_lines_reach_the_replica_log(client: httpclient.InferenceServerClient) -> None:
    token = f"logged-{uuid.uuid4().hex}"
    result = client.infer("logger_api", [_input("TEXT", np.array([token.encode()], np.object_), "BYTES")])
    pid = int(result.as_numpy("PID")[0])
    wanted = [f"model 'logger_api': {token} {level}" for level in ("info", "warn", "error", "leveled")]
    deadline = time.monotonic() + 10
    lines = _replica_log_lines(pid, token)
    while not all(any(w in line for line in lines) for w in wanted) and time.monotonic() < deadline:
        time.sleep(0.25)
        lines = _replica_log_lines(pid, token)
    for w in wanted:
        assert any(w in line for line in lines), (w, lines)
    assert any("initialized logger_api version 1" in line for line in _replica_log_lines(pid, "initialized"))


# --- auto_complete_config -------------------------------------------------------------------------


def test_auto_completed_config_and_inference(client: httpclient.InferenceServerClient, grpc_url: str) -> None:
    """config.pbtxt names only the backend; the model's auto_complete_config adds the rest."""
    config = client.get_model_config("auto_complete")
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [("INPUT", "TYPE_FP32", [2])]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [
        ("OUTPUT", "TYPE_FP32", [2])
    ]
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config
    metadata = client.get_model_metadata("auto_complete")
    assert [(i["name"], i["datatype"], i["shape"]) for i in metadata["inputs"]] == [
        ("INPUT", "FP32", [-1, 2])
    ]
    x = np.array([[1.0, -2.0], [0.5, 4.0], [3.0, 0.0]], np.float32)
    result = client.infer("auto_complete", [_input("INPUT", x, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT"), 2 * x)
    with grpcclient.InferenceServerClient(grpc_url) as c:
        grpc_config = c.get_model_config("auto_complete", as_json=True)["config"]
        assert [i["name"] for i in grpc_config["input"]] == ["INPUT"]
        assert [o["name"] for o in grpc_config["output"]] == ["OUTPUT"]
        assert int(grpc_config["max_batch_size"]) == 4
        tensor = grpcclient.InferInput("INPUT", [3, 2], "FP32")
        tensor.set_data_from_numpy(x)
        np.testing.assert_array_equal(c.infer("auto_complete", [tensor]).as_numpy("OUTPUT"), 2 * x)
    # a wrong shape is refused against the completed config
    with pytest.raises(InferenceServerException) as err:
        client.infer("auto_complete", [_input("INPUT", np.zeros((1, 3), np.float32), "FP32")])
    assert err.value.status() == "400"


# --- BLS arguments: timeout, preferred_memory, parameters, model_version ---------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bls_arguments_reach_the_target(
    client: httpclient.InferenceServerClient, grpc_url: str, cancel_markers: Path, protocol: str
) -> None:
    marker = 301 if protocol == "http" else 302
    values = np.array([marker, 7], np.int32)
    vector = np.array([1.0, 2.0, -3.0, 0.5], np.float32)
    if protocol == "http":
        inputs = [_input("IN", values, "INT32"), _input("V", vector, "FP32")]
        result = client.infer("bls_args", inputs, request_id="outer")
    else:
        with grpcclient.InferenceServerClient(grpc_url) as c:
            inputs = [grpcclient.InferInput("IN", [2], "INT32"), grpcclient.InferInput("V", [4], "FP32")]
            inputs[0].set_data_from_numpy(values)
            inputs[1].set_data_from_numpy(vector)
            result = c.infer("bls_args", inputs, request_id="outer")
    report = json.loads(result.as_numpy("REPORT")[0])
    # request_api, called with request_id, correlation_id, flags, timeout, parameters, preferred_memory
    target = report["request_api"]
    assert "error" not in target, target
    info = target["info"]
    assert info["request_id"] == "bls-outer" and info["correlation_id"] == 12345 and info["flags"] == 1
    assert info["timeout"] == 7_000_000
    assert info["parameters"] == {"caller": "bls_args", "depth": 2, "flag": True}
    assert info["requested_output_names"] == ["INFO", "OUT"] and info["inputs"] == ["IN"]
    assert target["out"] == values.tolist() and target["out_is_cpu"] is True  # TRITONSERVER_MEMORY_CPU
    assert target["response_parameters"] == {"echoed": True}  # the target's response parameters
    # multi_version answers input * version: model_version picks the version, -1 the latest
    assert report["versions"] == {
        "1": vector.tolist(),
        "2": (2 * vector).tolist(),
        "-1": (2 * vector).tolist(),
    }
    # a 2 s timeout on a stream that never ends by itself (3,000 responses 10 ms apart): some
    # responses, then the timeout error
    expired = report["expired"]
    assert expired["error"] == {"code": 4, "message": "Request timeout expired"}  # TritonError.UNAVAILABLE
    # the responses that came before the timeout, in order and none lost (how many is timing)
    assert len(expired["steps"]) < 3000 and expired["steps"] == list(range(len(expired["steps"])))
    if not expired["steps"]:
        # the call ran out before the target answered at all (a loaded machine): it may have ended
        # before the target started the request, which then never runs; nothing to see there
        return
    # a target that streamed sees its request cancelled
    path = cancel_markers / f"{marker}.cancelled"
    deadline = time.monotonic() + 20
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert path.exists(), "the timed-out BLS stream was not cancelled in the target"


def test_python_based_backend_models_over_http_and_grpc(
    client: httpclient.InferenceServerClient, grpc_url: str
) -> None:
    # based_add and based_sub have no model.py: both run the backend directory's add_sub/model.py,
    # each with its own version folder's model.json (read through pb_utils.get_model_dir())
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.full((2, 4), 3, dtype=np.float32)
    for name, expected in (("based_add", a + b), ("based_sub", a - b)):
        result = client.infer(name, [_input("INPUT0", a, "FP32"), _input("INPUT1", b, "FP32")])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT"), expected)
        with grpcclient.InferenceServerClient(grpc_url) as grpc:
            inputs = [
                grpcclient.InferInput("INPUT0", [2, 4], "FP32"),
                grpcclient.InferInput("INPUT1", [2, 4], "FP32"),
            ]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            np.testing.assert_array_equal(grpc.infer(name, inputs).as_numpy("OUTPUT"), expected)
        config = client.get_model_config(name)
        # as Triton reports a Python-based backend's model: its backend's name, runtime model.py, and
        # the inputs and outputs the backend's auto_complete_config added
        assert config["backend"] == "add_sub" and config["runtime"] == "model.py"
        assert [t["name"] for t in config["input"]] == ["INPUT0", "INPUT1"]
        assert [t["name"] for t in config["output"]] == ["OUTPUT"]
