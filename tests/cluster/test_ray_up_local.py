"""``ray up`` / ``ray exec`` / ``ray down`` on Ray's local provider, for real (``tools/ray_up_local.py``).

A head and one worker, each a network namespace with its own sshd, on their own bridge and
addresses (``tru*``, 10.214.0.0/24), so this runs beside the folder's shared cluster (``trs*``,
10.213.0.0/24). Needs root, ``ip``, ``/usr/sbin/sshd`` and ``rsync``; skips, saying which is
missing, without them.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
import yaml

from tools import netns_cluster, ray_up_local
from tools.ray_up_local import ClusterError, LocalState


def test_the_example_config_is_what_up_runs_ray_up_on() -> None:
    """``examples/cluster_local.yaml`` names the nodes and key of the default ``up``, and starts Ray
    without ``ray stop`` (which ends every Ray process of a machine)."""
    shipped = yaml.safe_load(ray_up_local.EXAMPLE.read_text())
    assert ray_up_local.cluster_config(LocalState(dir=str(ray_up_local.DEFAULT_DIR))) == shipped
    assert shipped["provider"]["type"] == "local" and "docker" not in shipped
    for command in shipped["head_start_ray_commands"] + shipped["worker_start_ray_commands"]:
        assert "deployments.serve.launch ray-start" in command and "ray stop" not in command
        for flag, port in netns_cluster.AGENT_PORTS.items():  # a raylet waits on no agent's port file
            assert f"{flag}={port}" in command


def test_ray_status_counts_active_and_idle_nodes() -> None:
    status = (
        "Node status\n---\nActive:\r\n 2 local.cluster.node\r\nIdle:\n 1 x\nPending:\n (no pending nodes)\n"
    )
    assert ray_up_local.reported_nodes(status) == 3


def _add_sub(url: str) -> None:
    in0 = np.arange(8, dtype=np.float32).reshape(2, 4)
    in1 = np.full((2, 4), 3.0, dtype=np.float32)
    inputs = [
        httpclient.InferInput("INPUT0", [2, 4], "FP32"),
        httpclient.InferInput("INPUT1", [2, 4], "FP32"),
    ]
    inputs[0].set_data_from_numpy(in0)
    inputs[1].set_data_from_numpy(in1)
    result = httpclient.InferenceServerClient(url).infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), in0 + in1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), in0 - in1)


def _started(pid: int) -> str | None:
    """When a running process started (clock ticks after boot); None once it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def _processes(names: list[str]) -> set[tuple[int, str | None]]:
    """(pid, start time) of every process in the namespaces ``names``."""
    return {(pid, _started(pid)) for name in names for pid in netns_cluster.netns_pids(name)}


def _still_running(processes: set[tuple[int, str | None]]) -> set[int]:
    return {pid for pid, started in processes if started is not None and _started(pid) == started}


@pytest.mark.multinode
@pytest.mark.slow
def test_ray_up_serve_deploy_and_ray_down() -> None:
    reason = ray_up_local.unavailable_reason()
    if reason:
        pytest.skip(f"no `ray up` on network namespaces here: {reason}")
    root = ray_up_local.DEFAULT_DIR
    began = time.monotonic()
    try:
        started = ray_up_local.up(root, workers=1, models=["add_sub"])
    except ClusterError as exc:
        pytest.fail(f"ray up on the local provider failed: {exc}")
    state = started.state
    head, worker = state.nodes
    try:
        config = yaml.safe_load(state.config.read_text())
        assert config["provider"] == {"type": "local", "head_ip": head.ip, "worker_ips": [worker.ip]}
        # what `ray exec <config> 'ray status'` printed, and the head's own list
        assert ray_up_local.reported_nodes(started.ray_status) == 2, started.ray_status
        assert sorted(n["node_ip"] for n in ray_up_local.ray_nodes()) == [head.ip, worker.ip]
        assert started.models == ["add_sub"]
        for node in (worker, head):
            _add_sub(state.ingress(node))
        print(f"up and answering in {time.monotonic() - began:.0f}s")
    finally:
        processes = _processes(state.netns)
        stopping = time.monotonic()
        ray_up_local.down(root)
        print(f"down in {time.monotonic() - stopping:.0f}s")
    assert processes and not _still_running(processes)
    assert not set(state.netns) & netns_cluster.existing_netns()
    assert not netns_cluster.link_exists(ray_up_local.NETWORK.bridge)
    assert not root.exists()
    assert not ray_up_local.control_dir(config["cluster_name"]).exists()
