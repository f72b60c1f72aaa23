"""The revisions scenario's arithmetic: head / base per round and tool, and the median over rounds."""

from __future__ import annotations

from bench.results import Point, Run
from bench.scenarios.revisions import summarize


def _run(label: str, sweep: str, rates: dict[int, float]) -> Run:
    """A sweep labelled as the scenario labels it: ``<server> (<sweep>)``; gRPC is perf_analyzer's."""
    points = [Point(c, None, r, r, 1.0, 1.0, 1.0, 1.0, 1.0) for c, r in rates.items()]
    tool = "bench" if sweep == "bench" else "perf_analyzer"
    return Run(label=f"{label} ({sweep})", tool=tool, model="m", url="u", points=points)


def test_ratios_per_round_and_their_median() -> None:
    runs = [
        _run("base abc #1", "bench", {1: 100.0, 32: 200.0}),
        _run("head #1", "bench", {1: 110.0, 32: 180.0}),
        _run("base abc #2", "bench", {1: 100.0, 32: 200.0}),
        _run("head #2", "bench", {1: 90.0, 32: 220.0}),
        _run("base abc #3", "bench", {1: 100.0}),
        _run("head #3", "bench", {1: 100.0, 32: 200.0}),
    ]
    notes = summarize(runs, "base abc", 3)
    assert notes["head_over_base_bench"][0] == {"1": 1.1, "32": 0.9}
    assert notes["head_over_base_bench"][2] == {"1": 1.0}  # the base missed level 32 in round 3
    assert notes["head_over_base_bench_median"] == {"1": 1.0, "32": 1.0}
    assert notes["head_over_base_perf_analyzer"] == [{}, {}, {}]
    assert notes["head_over_base_grpc"] == [{}, {}, {}]


def test_http_and_grpc_sweeps_of_one_server_are_told_apart() -> None:
    runs = [
        _run("base abc #1", "perf_analyzer", {1: 100.0}),
        _run("base abc #1", "grpc", {1: 50.0}),
        _run("head #1", "perf_analyzer", {1: 120.0}),
        _run("head #1", "grpc", {1: 40.0}),
    ]
    notes = summarize(runs, "base abc", 1)
    assert notes["head_over_base_perf_analyzer_median"] == {"1": 1.2}
    assert notes["head_over_base_grpc_median"] == {"1": 0.8}
