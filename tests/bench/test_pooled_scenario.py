"""The pooled scenario's notes: the pooled model's throughput over the dedicated one's, per level."""

from __future__ import annotations

from bench.results import Point, Run
from bench.scenarios import pooled as scenario


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


def test_the_ratio_sums_both_rounds_of_each_model() -> None:
    runs = [
        _run(f"{scenario.POOLED} (round 1)", {1: 900.0, 8: 2000.0}),
        _run(f"{scenario.OWN} (round 1)", {1: 1000.0, 8: 2000.0}),
        _run(f"{scenario.OWN} (round 2)", {1: 1000.0}),
        _run(f"{scenario.POOLED} (round 2)", {1: 1100.0}),
    ]
    assert scenario.ratios(runs) == {"pooled_over_dedicated:1": 1.0, "pooled_over_dedicated:8": 1.0}


def test_the_dedicated_copy_asks_for_its_own_deployment() -> None:
    from repository_loader.plan import PLACEMENT_PARAMETER
    from repository_loader.proto import model_config_pb2

    config = model_config_pb2.ModelConfig()
    scenario._dedicated(config)
    assert config.parameters[PLACEMENT_PARAMETER].string_value == "dedicated"
