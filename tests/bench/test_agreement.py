"""The agreement scenario's rounds: median points per tool, every round kept, the server's own count."""

from bench.results import Point, Run
from bench.scenarios.agreement import median_run, round_throughputs, server_confirmation


def _run(label: str, tool: str, rates: dict[int, float], served: dict[int, int] | None = None) -> Run:
    points = []
    for c, r in rates.items():
        point = Point(c, None, r, r, 1000.0, 900.0, 1100.0, 1200.0, 1500.0, requests=1000)
        if served is not None:
            point.server = {"identity_py": {"success_count": served[c]}}
        points.append(point)
    return Run(label, tool, "identity_py", "localhost:1", points=points)


def test_the_median_round_gives_each_levels_point():
    rounds = [
        _run("s (bench)", "bench", {1: 100.0, 4: 900.0}),
        _run("s (perf_analyzer)", "perf_analyzer", {1: 1.0, 4: 1.0}),
        _run("s (bench)", "bench", {1: 300.0, 4: 500.0}),
        _run("s (bench)", "bench", {1: 200.0, 4: 700.0}),
    ]
    merged = median_run(rounds, "s (bench)")
    assert merged.throughput_by_level() == {1.0: 200.0, 4.0: 700.0}
    assert merged.tool == "bench" and merged.options["rounds"] == 3


def test_an_even_number_of_rounds_takes_the_lower_middle():
    rounds = [_run("s (bench)", "bench", {1: v}) for v in (400.0, 100.0, 300.0, 200.0)]
    assert median_run(rounds, "s (bench)").throughput_by_level() == {1.0: 200.0}


def test_every_round_is_kept_by_label_and_level():
    rounds = [_run("s (bench)", "bench", {1: 1.0, 16: 2.0}), _run("s (bench)", "bench", {1: 3.0, 16: 4.0})]
    assert round_throughputs(rounds) == {"s (bench)": {"1": [1.0, 3.0], "16": [2.0, 4.0]}}


def test_the_servers_count_is_compared_with_the_clients():
    runs = [
        _run("s (bench)", "bench", {1: 1.0, 4: 1.0}, served={1: 1000, 4: 1010}),
        _run("s (bench)", "bench", {1: 1.0, 4: 1.0}, served={1: 1002, 4: 990}),
        _run("s (bench)", "bench", {1: 1.0, 4: 1.0}, served={1: 998, 4: 1000}),
    ]
    assert server_confirmation(runs) == {"1": 1.0, "4": 1.0}
    assert server_confirmation([_run("s (bench)", "bench", {1: 1.0})]) == {}
