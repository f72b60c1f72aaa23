"""Triton's counters are summed in the replica and handed to the exporter once per interval."""

from __future__ import annotations

import asyncio

import pytest

from deployments.runtime import metrics as metrics_module
from deployments.runtime.metrics import COUNTERS, TritonMetrics, tags_for


class Recorder:
    def __init__(self, name: str, description: str, tag_keys: tuple[str, ...]) -> None:
        self.name = name
        self.tag_keys = tag_keys
        self.calls: list[tuple[float, dict[str, str]]] = []

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        assert value > 0, f"{self.name}: Ray counters reject increments <= 0"
        self.calls.append((value, dict(tags or {})))


def _metrics(interval: float = 0.05) -> tuple[TritonMetrics, dict[str, Recorder]]:
    made: dict[str, Recorder] = {}

    def factory(name: str, description: str, tag_keys: tuple[str, ...]) -> Recorder:
        made[name] = Recorder(name, description, tag_keys)
        return made[name]

    return TritonMetrics(factory, flush_interval_s=interval), made


async def test_many_requests_become_one_increment_per_counter_and_label_set() -> None:
    metrics, made = _metrics()
    assert set(made) == set(COUNTERS) and all(r.tag_keys == ("model", "version") for r in made.values())
    v1, v2 = tags_for("m", 1), tags_for("m", 2)
    for _ in range(100):
        metrics.request(v1, True, 2_000)
    metrics.request(v1, False, 1_000)
    metrics.request(v2, True, 5_000)
    metrics.batch(v1, rows=8, queue_ns=3_000, input_ns=0, infer_ns=10_000, output_ns=0, n=4)
    assert all(not r.calls for r in made.values())  # nothing exported per request
    await asyncio.sleep(0.15)
    assert made["nv_inference_request_success"].calls == [
        (100, {"model": "m", "version": "1"}),
        (1, {"model": "m", "version": "2"}),
    ]
    assert made["nv_inference_request_failure"].calls == [(1, {"model": "m", "version": "1"})]
    durations = {c[1]["version"]: c[0] for c in made["nv_inference_request_duration_us"].calls}
    assert durations == {"1": 201.0, "2": 5.0}
    assert made["nv_inference_count"].calls == [(8, {"model": "m", "version": "1"})]
    assert made["nv_inference_exec_count"].calls == [(1, {"model": "m", "version": "1"})]
    assert made["nv_inference_compute_infer_duration_us"].calls == [(40.0, {"model": "m", "version": "1"})]
    assert not made["nv_inference_compute_input_duration_us"].calls  # zero sums are not sent


async def test_a_later_burst_is_flushed_again() -> None:
    metrics, made = _metrics()
    metrics.request(tags_for("m", 1), True, 1_000)
    await asyncio.sleep(0.1)
    metrics.request(tags_for("m", 1), True, 1_000)
    metrics.request(tags_for("m", 1), True, 1_000)
    await asyncio.sleep(0.1)
    assert [c[0] for c in made["nv_inference_request_success"].calls] == [1, 2]


def test_without_a_loop_each_update_is_exported_at_once() -> None:
    metrics, made = _metrics()
    metrics.request(tags_for("m", 3), True, 1_000)
    assert made["nv_inference_request_success"].calls == [(1, {"model": "m", "version": "3"})]


def test_without_ray_metrics_are_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_module, "default_counters", lambda: None)  # as where Ray is not running
    metrics = TritonMetrics()
    assert not metrics.enabled
    metrics.request(tags_for("m", 1), True, 1)  # a no-op, no error
