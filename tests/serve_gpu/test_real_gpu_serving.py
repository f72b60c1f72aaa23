"""Models served on a real GPU through Ray Serve (``real_gpu_server.py``): ``KIND_GPU`` replicas over
HTTP and gRPC, and model hosts keeping pooled GPU models within a GPU memory budget. Marked ``gpu``:
skipped without CUDA."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.serve,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30


def _phase(phase: str) -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix="trs_rgpu_")  # short: Ray's socket paths must fit in 107 bytes
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tests.serve_gpu.real_gpu_server", work, phase],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},
            capture_output=True,
            text=True,
            timeout=400,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-4000:] + done.stderr[-4000:]
    return dict(json.loads(lines[0][7:]))


_SERVED: dict[str, dict[str, Any]] = {}


def _dedicated() -> dict[str, Any]:
    """The ``dedicated`` phase's answers, served once for the tests that read them."""
    if "dedicated" not in _SERVED:
        _SERVED["dedicated"] = _phase("dedicated")
    return _SERVED["dedicated"]


@pytest.mark.timeout(420)
def test_kind_gpu_replicas_compute_on_the_gpu_over_http_and_grpc() -> None:
    seen = _dedicated()
    name = torch.cuda.get_device_name(0)
    for protocol in ("http", "grpc"):
        answer = seen[f"gpu_py_{protocol}"]
        assert answer["Y"] == [2.0, 4.0, 6.0, 8.0]
        kind, device, device_name, visible, _pid = answer["WHERE"][0].split("|")
        assert (kind, device, device_name) == ("GPU", "cuda:0", name)
        assert visible != ""  # Ray gave the replica a GPU
        assert seen[f"gpu_ts_{protocol}"]["OUTPUT__0"] == [3.0, 5.0, 7.0, 9.0]


@pytest.mark.timeout(420)
def test_an_ensemble_of_gpu_steps_hands_the_device_buffer_on_in_its_replica() -> None:
    seen = _dedicated()
    for protocol in ("http", "grpc"):
        chain = seen[f"gpu_chain_{protocol}"]
        assert chain["Z"] == [3.0, 5.0, 7.0, 9.0]
        first_ptr, first_pid = chain["FIRST"][0].split("|")
        is_cpu, device, second_ptr, second_pid = chain["SECOND"][0].split("|")
        assert (is_cpu, device) == ("False", "cuda:0")  # the second step got a device tensor
        assert (second_ptr, second_pid) == (first_ptr, first_pid)  # the same buffer, in one process


@pytest.mark.timeout(420)
def test_a_gpu_model_host_keeps_pooled_models_within_its_gpu_budget() -> None:
    seen = _phase("hosted")
    where = [seen[k]["WHERE"][0].split("|") for k in ("pooled_a", "pooled_b", "pooled_b_grpc")]
    assert {w[0] for w in where} == {"GPU"} and {w[1] for w in where} == {"cuda:0"}
    assert len({w[4] for w in where}) == 1  # one host process served both models
    metrics = {line.split(" ")[0]: float(line.split(" ")[1]) for line in seen["metrics"]}
    assert metrics['nv_model_host_eviction_total{model="pooled_a"}'] == 1  # b did not fit beside a
    assert metrics['nv_model_host_resident{model="pooled_a"}'] == 0
    assert GIB <= metrics['nv_model_host_resident_gpu_bytes{model="pooled_b"}'] <= 1.2 * GIB
