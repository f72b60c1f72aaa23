"""Result schema: JSON round trip, strict JSON, CSV columns, plots."""

import csv
import json
import math

from bench.plots import plot_report
from bench.results import CSV_COLUMNS, Point, Report, Run, read_json, write_csv, write_json


def _run(label: str, scale: float, tool: str = "bench") -> Run:
    points = [
        Point(
            c,
            None,
            100.0 * c * scale,
            50.0 * c * scale,
            900.0 + c,
            800.0,
            1200.0,
            1500.0,
            2000.0 + c,
            requests=10 * c,
            windows=3,
            server={"m": {"queue_us": 5.0, "batch_sizes": {"2": 7}, "avg_batch_size": 2.0}},
            client_cores=0.4,
        )
        for c in (1, 2, 4)
    ]
    return Run(label, tool, "m", "localhost:8000", points=points)


def test_json_round_trip_and_nan_as_null(tmp_path):
    run = _run("a", 1.0)
    run.points[0].p99_us = math.nan
    report = Report("demo", {"cpu_count": 2}, [run, _run("b", 2.0, "perf_analyzer")], {"k": 1})
    path = write_json(report, tmp_path / "r.json")
    raw = json.loads(path.read_text())
    assert raw["schema_version"] == 1
    assert raw["runs"][0]["points"][0]["p99_us"] is None
    back = read_json(path)
    assert [r.label for r in back.runs] == ["a", "b"]
    assert math.isnan(back.runs[0].points[0].p99_us)
    assert back.runs[1].points[2].infer_per_s == 800.0
    assert back.runs[0].points[1].server["m"]["batch_sizes"] == {"2": 7}
    assert back.environment == {"cpu_count": 2}


def test_csv_has_fixed_columns_and_one_row_per_point(tmp_path):
    path = write_csv([_run("a", 1.0), _run("b", 2.0)], tmp_path / "r.csv")
    rows = list(csv.DictReader(path.open()))
    assert tuple(rows[0].keys()) == CSV_COLUMNS
    assert len(rows) == 6
    assert rows[4]["label"] == "b" and rows[4]["concurrency"] == "2"
    assert float(rows[4]["infer_per_s"]) == 400.0
    assert rows[0]["batch_sizes"] == "2:7"
    assert rows[0]["server_queue_us"] == "5.00"


def test_plots_are_written(tmp_path):
    paths = plot_report([_run("a", 1.0), _run("b", 2.0, "perf_analyzer")], tmp_path, "demo")
    assert {p.name for p in paths} == {"throughput.png", "latency.png"}
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert p.stat().st_size > 1000
