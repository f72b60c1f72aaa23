"""bench.ray_background: which processes it stops, and how it reads its windows."""

import pytest

from bench.cpu_split import CpuSnapshot
from bench.ray_background import (
    ALL,
    OTHERS,
    RUNNING,
    group_cpu_ms_per_s,
    group_of,
    latency_figures,
    summarize,
)

PY = "/work/.venv/bin/python"


@pytest.mark.parametrize(
    ("cmdline", "group"),
    [
        ("ray::ServeReplica:model-identity_py:model", None),
        ("ray::ServeReplica:triton:server", None),
        ("/tmp/trs-h1/haproxy -f /tmp/trs-h1/haproxy.cfg", None),
        ("ray::ServeController", "Serve controller"),
        (
            ".venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server --log_dir=/tmp",
            "GCS and raylet",
        ),
        (
            ".venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --raylet_socket_name=x",
            "GCS and raylet",
        ),
        ("ray::DashboardAgent", "dashboard, agents and monitors"),
        (
            f"{PY} -u .venv/lib/python3.11/site-packages/ray/_private/log_monitor.py",
            "dashboard, agents and monitors",
        ),
        (
            "ray-dashboard-NodeHead-0 (python -B -c from multiprocessing.forkserver)",
            "dashboard, agents and monitors",
        ),
        ("ray::ProxyActor", OTHERS),
        ("ray::HAProxyManager", OTHERS),
        ("ray::IDLE", OTHERS),
        (f"{PY} -m deployments serve /repo --http-port 1", OTHERS),
    ],
)
def test_what_serves_requests_keeps_running_and_the_rest_falls_in_a_group(cmdline, group):
    assert group_of(cmdline) == group


def test_a_window_reads_its_rate_and_quantiles_in_microseconds():
    latencies = [i / 1e6 for i in range(1, 101)]  # 1 .. 100 us
    found = latency_figures(latencies[::-1], seconds=0.5)
    assert found["requests_per_s"] == 200
    assert (found["p50_us"], found["p90_us"], found["p99_us"]) == pytest.approx((51, 91, 100))
    with pytest.raises(ValueError):
        latency_figures([], 1.0)


def test_the_summary_takes_each_modes_median_round_against_the_running_one():
    windows = [
        {"mode": RUNNING, "requests_per_s": 100.0, "p99_us": 1000.0},
        {"mode": RUNNING, "requests_per_s": 120.0, "p99_us": 900.0},
        {"mode": RUNNING, "requests_per_s": 80.0, "p99_us": 2000.0},
        {"mode": ALL, "requests_per_s": 125.0, "p99_us": 450.0},
        {"mode": ALL, "requests_per_s": 115.0, "p99_us": 500.0},
    ]
    medians = summarize(windows)
    assert medians[RUNNING] == {
        "requests_per_s": 100.0,
        "p99_us": 1000.0,
        "throughput_ratio": 1.0,
        "p99_ratio": 1.0,
    }
    assert medians[ALL]["requests_per_s"] == 120.0
    assert medians[ALL]["throughput_ratio"] == pytest.approx(1.2)
    assert medians[ALL]["p99_ratio"] == pytest.approx(0.475)


def test_a_compared_window_counts_each_groups_cpu_a_second_and_what_serves_requests():
    before = CpuSnapshot(
        10.0,
        {1: 5.0, 2: 1.0, 3: 2.0},
        {1: "ray::ServeReplica:model-m:m", 2: "ray::ServeController", 3: "ray::ServeController"},
    )
    after = CpuSnapshot(
        12.0,
        {1: 6.5, 2: 1.1, 3: 2.02, 4: 0.5},
        {
            1: "ray::ServeReplica:model-m:m",
            2: "ray::ServeController",
            3: "ray::ServeController",
            4: "ray::DashboardAgent",
        },
    )
    found = group_cpu_ms_per_s(before, after, [1, 2, 3, 4, 5])
    # process 4 started inside the window: its CPU before the window's end is not known to be the window's, so 0
    assert found == pytest.approx(
        {"serving": 750.0, "Serve controller": 60.0, "dashboard, agents and monitors": 0.0}
    )
