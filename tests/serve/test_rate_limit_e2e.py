"""Triton's rate limiter through Ray Serve (the shared server runs ``--rate-limit=execution_count``
and ``--rate-limit-resource=R_ONE:1``): two replicas of a model that each need the same resource
never execute at once, the same model without ``rate_limiter`` does, and a model needing more than
the server gives is refused at load (docs/rate_limiter.md)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from tests.serve.test_model_control_e2e import post

pytestmark = [pytest.mark.serve, pytest.mark.slow]

SPAN_PY = """
import os
import pathlib
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        started = time.time()
        hold = float(pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()[0])
        if hold > 0:  # the fault test: say who holds the resources, then keep them
            pathlib.Path(__file__).with_name("held").write_text(str(os.getpid()))
            time.sleep(hold)
        time.sleep(0.3)
        span = np.array([started, time.time(), os.getpid()], dtype=np.float64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SPAN", span)]) for _ in requests]
"""


def _write(repo: Path, name: str, limiter: str) -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "1" / "model.py").write_text(SPAN_PY)
    (repo / name / "config.pbtxt").write_text(
        textwrap.dedent(
            f"""
            backend: "python"
            max_batch_size: 0
            input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
            output [ {{ name: "SPAN" data_type: TYPE_FP64 dims: [ 3 ] }} ]
            instance_group [ {{ count: 2 kind: KIND_CPU {limiter} }} ]
            """
        )
    )


def _span(url: str, model: str, hold: float = 0.0, timeout: float = 60) -> tuple[float, float, int]:
    body = json.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [hold]}]}).encode()
    request = urllib.request.Request(f"http://{url}/v2/models/{model}/infer", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        start, end, pid = json.loads(response.read())["outputs"][0]["data"]
    return start, end, int(pid)


def _spans(url: str, model: str, count: int = 8) -> list[tuple[float, float, int]]:
    """Rounds of ``count`` requests at once until both replicas have answered some (HAProxy may send
    a first round to one of them), every span sorted."""
    spans: list[tuple[float, float, int]] = []
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        for _ in range(10):
            spans += pool.map(lambda _: _span(url, model), range(count))
            if len({pid for *_, pid in spans}) == 2:
                break
            time.sleep(1)
    return sorted(spans)


def _overlaps(spans: list[tuple[float, float, int]]) -> int:
    return sum(1 for a, b in zip(spans, spans[1:], strict=False) if b[0] < a[1])


def test_instances_that_need_the_same_resource_take_turns(server_url: str, test_repository: Path) -> None:
    _write(test_repository, "rl_limited", 'rate_limiter { resources [ { name: "R_TWO" count: 2 } ] }')
    _write(test_repository, "rl_free", "")
    try:
        for name in ("rl_limited", "rl_free"):
            status, body = post(server_url, f"/v2/repository/models/{name}/load")
            assert status == 200, body
        free = _spans(server_url, "rl_free")
        assert len({pid for *_, pid in free}) == 2, free  # both replicas answered
        assert _overlaps(free) > 0, free  # and, unlimited, ran side by side
        limited = _spans(server_url, "rl_limited")
        assert len({pid for *_, pid in limited}) == 2, limited
        assert _overlaps(limited) == 0, limited  # the pool holds 2: one execution at a time
    finally:
        for name in ("rl_limited", "rl_free"):
            post(server_url, f"/v2/repository/models/{name}/unload")


def test_a_model_needing_more_than_the_server_gives_is_refused(
    server_url: str, test_repository: Path
) -> None:
    _write(test_repository, "rl_too_big", 'rate_limiter { resources [ { name: "R_ONE" count: 2 } ] }')
    status, body = post(server_url, "/v2/repository/models/rl_too_big/load")
    assert status == 400, body
    assert "resource count for 'R_ONE' is limited to 1" in body["error"], body
    assert "minimum required count is 2" in body["error"], body


def test_a_replica_that_dies_holding_the_resources_gives_them_back(
    server_url: str, test_repository: Path
) -> None:
    """One replica holds the pool (a long execution) and is killed: the other replica's requests,
    waiting for the resources, run within seconds instead of waiting out the dead one's execution."""
    _write(test_repository, "rl_fault", 'rate_limiter { resources [ { name: "R_TWO" count: 2 } ] }')
    held = test_repository / "rl_fault" / "1" / "held"
    status, body = post(server_url, "/v2/repository/models/rl_fault/load")
    assert status == 200, body
    # both replicas take requests (HAProxy may route to one alone for a moment after the load): the
    # requests sent behind the holder then reach the other replica too, by least connections
    assert len({pid for *_, pid in _spans(server_url, "rl_fault")}) == 2
    pool = concurrent.futures.ThreadPoolExecutor(9)
    try:
        pool.submit(_span, server_url, "rl_fault", 120.0, 150)  # holds the pool for two minutes
        deadline = time.monotonic() + 30
        while not held.exists():
            assert time.monotonic() < deadline, "the holding request never ran"
            time.sleep(0.05)
        holder = int(held.read_text())
        waiting = [pool.submit(_span, server_url, "rl_fault", 0.0, 60) for _ in range(8)]
        time.sleep(1.5)
        assert not any(f.done() and not f.exception() for f in waiting)  # all wait behind the holder
        os.kill(holder, signal.SIGKILL)
        killed_at = time.monotonic()
        answered, failed = [], []
        for future in waiting:
            try:
                answered.append(future.result(timeout=60))
            except Exception as exc:  # those sent to the killed replica may fail
                failed.append(repr(exc)[:200])
        # the live replica's requests ran, soon after the kill, not after the two minutes
        assert answered and all(pid != holder for *_, pid in answered), (answered, failed)
        assert time.monotonic() - killed_at < 45
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        post(server_url, "/v2/repository/models/rl_fault/unload")
