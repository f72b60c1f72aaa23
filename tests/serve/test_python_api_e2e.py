"""End to end: Python-backend API models (written as Triton's documentation shows) on Ray Serve,
through the real tritonclient, and Triton's metrics endpoint."""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from repository_loader.errors import STATUS_TABLE, ErrorCode

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
    labels = f'model="{model}",{extra}version="1"'
    match = re.search(rf"^{family}\{{{re.escape(labels)}\}} (\S+)$", text, re.MULTILINE)
    assert match, f"no {family}{{{labels}}} in /metrics"
    return float(match.group(1))


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
    after = _scrape_until(
        metrics_url, lambda text: _value(text, "nv_inference_request_success", "add_sub_flat") >= done
    )
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
    assert failed >= 1
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
