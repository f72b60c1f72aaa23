"""The same custom-metrics model file on tritonserver 2.51 and on this server: the same answers and the
same ``/metrics`` lines (where ``python -m bench.peers`` installed the peer; skipped otherwise)."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from bench import peers
from tests.peer import require_tritonserver
from tests.serve.python_api_models import PEER_METRICS_MODEL, add_model_copy

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
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """``(http url, metrics url)`` of a tritonserver serving the custom-metrics model alone."""
    require_tritonserver()
    root = tmp_path_factory.mktemp("triton_peer")
    repository = root / "models"
    repository.mkdir()
    add_model_copy(repository, "custom_metrics", PEER_METRICS_MODEL)
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
            yield handle.url, f"127.0.0.1:{metrics}"
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


def _counts(lines: list[str]) -> dict[str, str]:
    names = ("nv_inference_request_success", "nv_inference_count", "nv_inference_exec_count")
    return {
        line.rsplit(" ", 1)[0]: line.rsplit(" ", 1)[1]
        for line in lines
        if line.startswith(names) and f'model="{PEER_METRICS_MODEL}"' in line
    }


def test_custom_metrics_model_matches_tritonserver(
    triton: tuple[str, str], server_url: str, metrics_url: str
) -> None:
    triton_http, triton_metrics = triton
    assert _answers(server_url) == _answers(triton_http) == [[1.0], [2.0], [3.0]]
    theirs = _scrape(triton_metrics)
    # a model with several replicas: their counters reach the server with the next push (1 s)
    done = f'custom_requests_total{{model="{PEER_METRICS_MODEL}",version="1"}} {len(REQUESTS)}'
    deadline = time.monotonic() + 10
    ours = _scrape(metrics_url)
    while done not in ours and time.monotonic() < deadline:
        time.sleep(0.25)
        ours = _scrape(metrics_url)
    assert _model_lines(ours) == _model_lines(theirs)
    assert any(line.startswith("custom_input_value_bucket") for line in _model_lines(ours))
    assert any(line.startswith("custom_execute_latency_ns{") for line in _model_lines(ours))
    # the failure counter's reasons print in hash order on tritonserver: compare them as a set
    assert sorted(_nv_shape(ours)) == sorted(_nv_shape(theirs))
    assert _counts(ours) == _counts(theirs)
