"""A saved run made up in a test: throughput per concurrency, every latency 1 µs."""

from __future__ import annotations

from bench.results import Point, Run


def run_of(label: str, rates: dict[int, float], model: str = "identity_py") -> Run:
    """A perf_analyzer run labelled ``label`` with ``rates`` (concurrency -> infer/s)."""
    run = Run(label, "perf_analyzer", model, "localhost:1")
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
