"""Triton's per-model counters reach Ray's own Prometheus export (what the Ray dashboard and a
Prometheus that scrapes the Ray cluster read), named with Ray's ``ray_`` prefix and labelled by model
and version as ``/metrics`` labels them (deploy/grafana's Ray dashboard queries these names)."""

from __future__ import annotations

import re
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient

pytestmark = [pytest.mark.serve, pytest.mark.slow]

MODEL = "add_sub_flat"
EXPORT_WAIT_S = 90.0  # Ray's agents report every few seconds; a loaded machine takes longer


def _scrape() -> str:
    """Ray's export now; empty where its agent does not answer in time (a loaded machine)."""
    try:
        return str(urllib.request.urlopen(_export_url(), timeout=10).read().decode())
    except OSError:
        return ""


def _export_url() -> str:
    import ray

    port = ray._private.worker.global_worker.node.metrics_export_port
    return f"http://127.0.0.1:{port}/metrics"


def _exported_count(text: str) -> float:
    """The exported ``nv_inference_count`` of the model's version 1, summed over its series (each
    replica's process reports its own)."""
    pattern = re.compile(r"^ray_nv_inference_count(?:_total)?\{([^}]*)\} (\S+)$", re.MULTILINE)
    total = 0.0
    for labels, value in pattern.findall(text):
        if f'model="{MODEL}"' in labels and 'version="1"' in labels:
            total += float(value)
    return total


def test_per_model_counters_reach_rays_prometheus_export(server_url: str) -> None:
    client = httpclient.InferenceServerClient(server_url)
    try:
        text = ""
        deadline = time.monotonic() + EXPORT_WAIT_S
        while not text and time.monotonic() < deadline:
            text = _scrape()
        assert text, "Ray's metrics export did not answer"
        before = _exported_count(text)
        a = np.array([1, 2, 3, 4], np.float32)
        for _ in range(5):
            inputs = []
            for name in ("INPUT0", "INPUT1"):
                tensor = httpclient.InferInput(name, [4], "FP32")
                tensor.set_data_from_numpy(a)
                inputs.append(tensor)
            client.infer(MODEL, inputs)
    finally:
        client.close()
    deadline = time.monotonic() + EXPORT_WAIT_S
    seen = before
    while time.monotonic() < deadline:
        text = _scrape() or text
        seen = _exported_count(text)
        if seen >= before + 5:
            break
        time.sleep(2.0)
    # at least: other tests' earlier calls of the model may reach the export in the same report
    assert seen >= before + 5, f"Ray's export counted {seen - before} of the 5 inferences"
    assert "# TYPE ray_nv_inference_request_success" in text


def _series(text: str, name: str) -> list[tuple[str, float]]:
    """``(labels, value)`` of every exported sample of Ray's ``ray_<name>`` (``_total`` added or not)."""
    pattern = re.compile(rf"^ray_{name}(?:_total)?\{{([^}}]*)\}} (\S+)$", re.MULTILINE)
    return [(labels, float(value)) for labels, value in pattern.findall(text)]


def test_gauges_and_custom_metrics_reach_rays_prometheus_export(server_url: str) -> None:
    """The pending-request gauge of every model replica, and a Python model's custom gauge and
    counter (``pb_utils.MetricFamily``), as Ray exports them."""
    client = httpclient.InferenceServerClient(server_url)
    try:
        for size in (3, 7):
            tensor = httpclient.InferInput("IN", [size], "FP32")
            tensor.set_data_from_numpy(np.ones(size, np.float32))
            client.infer("custom_metrics", [tensor])
    finally:
        client.close()

    def exported(text: str) -> tuple[list[float], list[float], list[float]]:
        mine = 'model="custom_metrics"'
        return (
            [v for labels, v in _series(text, "nv_inference_pending_request_count") if mine in labels],
            [v for labels, v in _series(text, "custom_last_input_size") if mine in labels],
            [v for labels, v in _series(text, "custom_requests") if mine in labels],
        )

    deadline = time.monotonic() + EXPORT_WAIT_S
    pending: list[float] = []
    sizes: list[float] = []
    counts: list[float] = []
    while time.monotonic() < deadline:
        pending, sizes, counts = exported(_scrape())
        if pending and 7.0 in sizes and counts and max(counts) >= 2:
            break
        time.sleep(2.0)
    assert pending == [0.0] * len(pending) and pending, "no pending-request gauge exported for the model"
    assert 7.0 in sizes, f"the custom gauge was exported as {sizes}"
    assert counts and max(counts) >= 2, f"the custom counter was exported as {counts}"
