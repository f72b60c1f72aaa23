"""The same model files on tritonserver 2.51 and on this server: the same answers, the same ``/metrics``
lines and the same shape of statistics (where ``python -m bench.peers`` installed the peer; skipped
otherwise)."""

from __future__ import annotations

import queue
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from bench import peers
from tests.peer import require_tritonserver
from tests.serve.python_api_models import PEER_METRICS_MODEL, add_model_copy
from tests.serve.streaming_models import WORD_STREAM_CONFIG, WORD_STREAM_PY

pytestmark = [pytest.mark.serve, pytest.mark.slow]

REQUESTS = ([0.5, 2.0, 7.0], [20.0], [3.0, 11.0])


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
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """``(http url, metrics url, grpc url)`` of a tritonserver serving the custom-metrics model and
    the decoupled ``word_stream``."""
    require_tritonserver()
    root = tmp_path_factory.mktemp("triton_peer")
    repository = root / "models"
    repository.mkdir()
    add_model_copy(repository, "custom_metrics", PEER_METRICS_MODEL)
    (repository / "word_stream" / "1").mkdir(parents=True)
    (repository / "word_stream" / "1" / "model.py").write_text(WORD_STREAM_PY)
    (repository / "word_stream" / "config.pbtxt").write_text(WORD_STREAM_CONFIG)
    http, grpc, metrics = _free_ports(3)
    log_path = root / "tritonserver.log"
    command = [
        str(peers.tritonserver_path()),
        f"--model-repository={repository}",
        f"--http-port={http}",
        f"--grpc-port={grpc}",
        f"--metrics-port={metrics}",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
    ]
    with open(log_path, "wb") as log:
        # outside the checkout, so that the stub imports Triton's own triton_python_backend_utils
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, cwd=root, start_new_session=True
        )
        handle = peers.ServerHandle(process, http, grpc, log_path, "tritonserver")
        try:
            peers.wait_ready(handle, timeout=120)
            yield handle.url, f"127.0.0.1:{metrics}", f"127.0.0.1:{grpc}"
        finally:
            handle.stop()
            shutil.rmtree(repository, ignore_errors=True)


def _answers(url: str) -> list[list[float]]:
    client = httpclient.InferenceServerClient(url)
    answers = []
    for values in REQUESTS:
        tensor = httpclient.InferInput("IN", [len(values)], "FP32")
        tensor.set_data_from_numpy(np.array(values, np.float32))
        answers.append(client.infer(PEER_METRICS_MODEL, [tensor]).as_numpy("COUNT").tolist())
    client.close()
    return answers


def _scrape(url: str) -> list[str]:
    with urllib.request.urlopen(f"http://{url}/metrics", timeout=30) as reply:
        return reply.read().decode().splitlines()


def _model_lines(lines: list[str]) -> list[str]:
    """The model's custom families: HELP/TYPE lines of the families it prints, and its samples."""
    ours = [i for i, line in enumerate(lines) if f'model="{PEER_METRICS_MODEL}"' in line]
    families = {re.split(r"[{ ]", lines[i], maxsplit=1)[0] for i in ours if lines[i].startswith("custom_")}
    stems = {f.removesuffix("_count").removesuffix("_sum").removesuffix("_bucket") for f in families}
    found = [
        line
        for line in lines
        if any(line.startswith((f"{s}{{", f"{s}_", f"# HELP {s} ", f"# TYPE {s} ")) for s in stems)
        and (line.startswith("#") or f'model="{PEER_METRICS_MODEL}"' in line)
    ]
    # time spent in execute differs by nature: its labels are compared, not its value
    return [
        line.rsplit(" ", 1)[0] if line.startswith("custom_execute_latency_ns{") else line for line in found
    ]


def _nv_shape(lines: list[str]) -> list[str]:
    """Triton's nv_inference_* lines of the model without their values (durations differ by nature),
    and the HELP/TYPE lines of every nv_inference_* family, in order."""
    shape = []
    for line in lines:
        if line.startswith(("# HELP nv_inference_", "# TYPE nv_inference_")):
            shape.append(line)
        elif line.startswith("nv_inference_") and f'model="{PEER_METRICS_MODEL}"' in line:
            shape.append(line.rsplit(" ", 1)[0])
    return shape


def _success_line(count: int) -> str:
    return f'nv_inference_request_success{{model="{PEER_METRICS_MODEL}",version="1"}} {count}'


def _scrape_when(url: str, line: str, timeout_s: float = 10.0) -> list[str]:
    """``url``'s metrics once they hold ``line`` (or as they are after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    lines = _scrape(url)
    while line not in lines and time.monotonic() < deadline:
        time.sleep(0.25)
        lines = _scrape(url)
    return lines


def _counts(lines: list[str]) -> dict[str, str]:
    names = ("nv_inference_request_success", "nv_inference_count", "nv_inference_exec_count")
    return {
        line.rsplit(" ", 1)[0]: line.rsplit(" ", 1)[1]
        for line in lines
        if line.startswith(names) and f'model="{PEER_METRICS_MODEL}"' in line
    }


def test_custom_metrics_model_matches_tritonserver(
    triton: tuple[str, str, str], server_url: str, metrics_url: str
) -> None:
    triton_http, triton_metrics, _ = triton
    assert _answers(server_url) == _answers(triton_http) == [[1.0], [2.0], [3.0]]
    # tritonserver counts a request's success after its response left, so a scrape right after the last
    # answer may miss it; a model with several replicas here: their counters reach the server with the
    # next push (1 s). Each side is read once its counts are complete.
    theirs = _scrape_when(triton_metrics, _success_line(len(REQUESTS)))
    ours = _scrape_when(metrics_url, _success_line(len(REQUESTS)))
    assert f'custom_requests_total{{model="{PEER_METRICS_MODEL}",version="1"}} {len(REQUESTS)}' in ours
    assert _model_lines(ours) == _model_lines(theirs)
    assert any(line.startswith("custom_input_value_bucket") for line in _model_lines(ours))
    assert any(line.startswith("custom_execute_latency_ns{") for line in _model_lines(ours))
    # the failure counter's reasons print in hash order on tritonserver: compare them as a set
    assert sorted(_nv_shape(ours)) == sorted(_nv_shape(theirs))
    assert _counts(ours) == _counts(theirs)


def _stream_words(grpc_url: str, text: str) -> list[str]:
    """Send ``text`` to ``word_stream`` over one gRPC stream; the words that came back."""
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_url)
    client.start_stream(lambda result, error: answers.put((result, error)))
    tensor = grpcclient.InferInput("text_input", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
    client.async_stream_infer("word_stream", [tensor], enable_empty_final_response=True)
    words = []
    while True:
        result, error = answers.get(timeout=30)
        assert error is None, error
        reply = result.get_response()  # type: ignore[attr-defined]
        if reply.outputs:
            words.append(result.as_numpy("text_output")[0].decode())  # type: ignore[attr-defined]
        if reply.parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    client.close()
    return words


def _statistics(http_url: str, grpc_url: str, successes: int) -> tuple[dict, dict]:
    """``word_stream``'s statistics over HTTP and gRPC once they count at least ``successes``.

    Both servers count a decoupled request when it is released, which can come after the client
    has read the final response: the count is waited for, not read once."""
    http = httpclient.InferenceServerClient(http_url)
    grpc = grpcclient.InferenceServerClient(grpc_url)
    deadline = time.monotonic() + 10
    try:
        while True:
            over_http = http.get_inference_statistics("word_stream")["model_stats"][0]
            over_grpc = grpc.get_inference_statistics("word_stream", as_json=True)["model_stats"][0]
            counted = int(over_http["inference_stats"]["success"]["count"])
            if counted >= successes or time.monotonic() > deadline:
                return over_http, over_grpc
            time.sleep(0.05)
    finally:
        http.close()
        grpc.close()


def test_a_decoupled_models_statistics_have_tritonservers_shape(
    triton: tuple[str, str, str], server_url: str, grpc_url: str
) -> None:
    """tritonserver's Python backend reports no per-response statistics, decoupled or not: after a
    stream of several responses ``response_stats`` is an empty map on both servers and both
    protocols, and the statistics hold the same fields."""
    triton_http, _, triton_grpc = triton
    assert _stream_words(grpc_url, "one two three") == _stream_words(triton_grpc, "one two three")
    ours_http, ours_grpc = _statistics(server_url, grpc_url, successes=1)
    theirs_http, theirs_grpc = _statistics(triton_http, triton_grpc, successes=1)
    assert sorted(ours_http) == sorted(theirs_http)
    assert sorted(ours_http["inference_stats"]) == sorted(theirs_http["inference_stats"])
    assert ours_http["response_stats"] == theirs_http["response_stats"] == {}
    # an empty map is left out of protobuf's JSON form
    assert "response_stats" not in ours_grpc and "response_stats" not in theirs_grpc
    assert int(theirs_http["inference_stats"]["success"]["count"]) == 1
    assert int(ours_http["inference_stats"]["success"]["count"]) >= 1
