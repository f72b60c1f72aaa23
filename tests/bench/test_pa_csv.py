"""perf_analyzer CSV parsing on a CSV in the layout it writes with --verbose-csv."""

import math

import pytest

from bench.pa_csv import PerfAnalyzerCsvError, parse_perf_analyzer_csv, read_perf_analyzer_csv

CSV = """Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency,Avg latency,request/response,response wait
1,2565.77,58,134,21,13,113,45,0,318,469,598,1788,387,58,323
4,4092.14,78,263,187,14,152,31,0,627,1042,1333,2974,729,78,644
"""


def test_rows_become_points_with_server_phases():
    points = parse_perf_analyzer_csv(CSV, "crnn", batch_size=2)
    assert [p.concurrency for p in points] == [1, 4]
    first = points[0]
    assert first.infer_per_s == pytest.approx(2565.77)
    assert first.requests_per_s == pytest.approx(2565.77 / 2)
    assert (first.p50_us, first.p90_us, first.p95_us, first.p99_us) == (318, 469, 598, 1788)
    assert first.latency_avg_us == 387
    assert first.server["crnn"] == {
        "queue_us": 21,
        "compute_input_us": 13,
        "compute_infer_us": 113,
        "compute_output_us": 45,
    }


def test_request_rate_csv_without_avg_latency():
    text = "Request Rate,Inferences/Second,p50 latency,p90 latency,p95 latency,p99 latency\n500,499.5,400,500,600,900\n"
    (point,) = parse_perf_analyzer_csv(text, "m")
    assert point.concurrency is None
    assert point.request_rate == 500
    assert math.isnan(point.latency_avg_us)
    assert point.server == {}


def test_not_a_perf_analyzer_csv(tmp_path):
    with pytest.raises(PerfAnalyzerCsvError, match="Inferences/Second"):
        parse_perf_analyzer_csv("a,b\n1,2\n", "m")
    assert parse_perf_analyzer_csv("", "m") == []
    assert read_perf_analyzer_csv(tmp_path / "absent.csv", "m") == []


def test_a_run_past_its_time_is_killed_and_reported_not_raised():
    from bench.pa_runner import _run_once

    done = _run_once(["sleep", "5"], timeout=0.2)
    assert done.returncode == -9 and "killed after 0s" in done.stdout
