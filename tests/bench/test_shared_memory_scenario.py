"""The shared-memory scenario's notes: each protocol's throughput with shared memory over without."""

from __future__ import annotations

from bench.results import Point, Run
from bench.scenarios import shared_memory as scenario


def _run(label: str, rates: dict[int, float]) -> Run:
    run = Run(label, "perf_analyzer", "identity_py", "localhost:1")
    run.points = [
        Point(
            concurrency=c,
            request_rate=None,
            infer_per_s=r,
            requests_per_s=r,
            latency_avg_us=1.0,
            p50_us=1.0,
            p90_us=1.0,
            p95_us=1.0,
            p99_us=1.0,
        )
        for c, r in rates.items()
    ]
    return run


def test_ratios_compare_each_protocol_with_and_without_shared_memory() -> None:
    runs = [
        _run("http", {1: 1000.0, 4: 2000.0}),
        _run("http shm", {1: 1100.0, 4: 1000.0}),
        _run("grpc", {1: 800.0}),
        _run("grpc shm", {1: 400.0, 4: 300.0}),  # no plain run at 4: no ratio
    ]
    assert scenario.ratios(runs) == {"ratio_http:1": 1.1, "ratio_http:4": 0.5, "ratio_grpc:1": 0.5}
