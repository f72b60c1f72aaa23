"""Losing a replica, then a whole node, under a steady load on the multi-node cluster.

Each test prints its account (requests sent, answered and failed, the failures' statuses, the times
to notice and to recover); with ``TRS_RECORD_DIR`` set it also writes it there as JSON, which is
how ``bench/results/cluster/`` was recorded::

    TRS_RECORD_DIR=bench/results/cluster .venv/bin/pytest -s tests/cluster/test_node_loss.py

The lost node is the GPU node: its KIND_GPU replicas cannot go anywhere else (no other node has a
GPU), so their models turn UNAVAILABLE in the index with Serve's reason until the node comes back;
its KIND_CPU replicas are placed again on the CPU node where it has room. Its model host replica
goes with it: the pooled models it held load again on the other node's host on their next request,
while the models that host held already keep being answered from where they were. The server application
is pinned to the head (``tools/netns_cluster.write_serve_config``), which a cluster cannot lose.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import tritonclient.http as httpclient

from repository_loader.plan import HOST_APP, SERVER_APP, model_app_name
from tests.cluster.conftest import POOLED
from tests.cluster.load import Load, wait_until
from tests.cluster.test_multinode import CHECKS, GPU_NODE, infer, replicas_by_app
from tools import netns_cluster
from tools.netns_cluster import HEAD, NODES, ClusterState

pytestmark = [pytest.mark.multinode, pytest.mark.slow]

CPU_NODE = next(n for n in NODES if not n.head and not n.num_gpus)


def record(name: str, account: dict[str, Any]) -> None:
    print(f"{name}: {json.dumps(account, indent=1)}")
    folder = os.environ.get("TRS_RECORD_DIR")
    if folder:
        command = (
            "TRS_RECORD_DIR="
            + folder
            + " "
            + shlex.join([os.path.relpath(sys.executable), "-m", "pytest", *sys.argv[1:]])
        )
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / f"{name}.json").write_text(
            json.dumps({"command": command, **account}, indent=2) + "\n"
        )


def index_states(cluster: ClusterState) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in netns_cluster.model_index(cluster)}


def gpu_probe_ask(client: httpclient.InferenceServerClient) -> str:
    import numpy as np

    seen = infer(client, "gpu_probe", {"IN": (np.array([1], np.int32), "INT32")}).as_numpy("SEEN")
    return bytes(seen.reshape(-1)[0]).decode()  # the node id


def pooled_where(client: httpclient.InferenceServerClient, model: str) -> tuple[str, str]:
    """The node id and the model host replica that answered a request for a pooled model."""
    import numpy as np

    tensor = httpclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], np.int32))
    node, replica = (bytes(s).decode() for s in client.infer(model, [tensor]).as_numpy("WHERE").reshape(-1))
    return node, replica


def pooled_ask(models: list[str]) -> Any:
    """Requests for ``models`` in turn (each client its own turn); answers with the node id."""
    turn = iter(range(10**9))

    def ask(client: httpclient.InferenceServerClient) -> str:
        return pooled_where(client, models[next(turn) % len(models)])[0]

    return ask


def check_ask(model: str) -> Any:
    def ask(client: httpclient.InferenceServerClient) -> str:
        CHECKS[model](client)
        return model

    return ask


def models_only_on(node_ip: str, apps: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Example models all of whose replicas run on ``node_ip``."""
    return [
        m
        for m in sorted(CHECKS)
        if apps.get(model_app_name(m)) and {r["node_ip"] for r in apps[model_app_name(m)]} == {node_ip}
    ]


def test_a_crashed_replica_is_replaced_and_other_models_are_untouched(cluster: ClusterState) -> None:
    apps = replicas_by_app(cluster)
    target = "identity_fp32"
    bystanders = [m for m in ("add_sub", "string_upper") if m != target]
    (victim, *_) = apps[model_app_name(target)]
    replicas_before = len(apps[model_app_name(target)])
    loads = {target: Load(cluster, check_ask(target), NODES, clients=3)}
    loads.update({m: Load(cluster, check_ask(m), NODES, clients=1) for m in bystanders})
    for load in loads.values():
        load.start()
    try:
        time.sleep(3)
        killed_at = time.monotonic()
        os.kill(int(victim["pid"]), signal.SIGKILL)
        answered_s = wait_until(
            f"{target} answers after its replica was killed",
            lambda: loads[target].answered_since(killed_at + 0.5),
            60,
        )
        wait_until(
            "a new replica runs",
            lambda: (
                sum(
                    r["state"] == "RUNNING" and r["replica_id"] != victim["replica_id"]
                    for r in replicas_by_app(cluster)[model_app_name(target)]
                )
                == replicas_before
            ),
            120,
        )
        replaced_s = time.monotonic() - killed_at
        time.sleep(2)
    finally:
        for load in loads.values():
            load.stop()
    account = {
        "model": target,
        "replicas": replicas_before,
        "killed_replica_node": victim["node_ip"],
        "answers_again_after_kill_s": round(answered_s, 2),
        "replica_replaced_after_kill_s": round(replaced_s, 2),
        "load": loads[target].account(killed_at),
        "bystanders": {m: loads[m].account(killed_at) for m in bystanders},
    }
    record("replica_crash", account)
    for model in bystanders:
        assert loads[model].failed == 0, (model, loads[model].failures[:3])
    # what failed was in flight on the killed replica: a 5xx from HAProxy or a reset connection
    for failure in loads[target].failures:
        assert failure.status in ("", "500", "502", "503", "504"), failure


def test_a_lost_node_fails_only_its_own_and_the_plan_is_restored_when_it_returns(
    cluster: ClusterState,
) -> None:
    apps = replicas_by_app(cluster)
    counts_before = {app: len(replicas) for app, replicas in apps.items()}
    assert [r["node_ip"] for r in apps[model_app_name("gpu_probe")]] == [GPU_NODE.ip]
    # a model served from the CPU node only (the cheapest to check first)
    cheap_first = ["identity_fp32", "add_sub", "string_upper", "auto_complete_scale", "crnn_postprocess"]
    candidates = models_only_on(CPU_NODE.ip, apps)
    bystander = min(candidates, key=lambda m: cheap_first.index(m) if m in cheap_first else len(cheap_first))
    on_lost_node = sorted(a for a, rs in apps.items() if any(r["node_ip"] == GPU_NODE.ip for r in rs))
    lost_id = next(n["node_id"] for n in netns_cluster.ray_nodes() if n["node_ip"] == GPU_NODE.ip)
    cpu_id = next(n["node_id"] for n in netns_cluster.ray_nodes() if n["node_ip"] == CPU_NODE.ip)
    # one model host replica on each worker node, and pooled models loaded on both
    assert sorted(r["node_ip"] for r in apps[HOST_APP]) == sorted([CPU_NODE.ip, GPU_NODE.ip])
    head_client = httpclient.InferenceServerClient(cluster.ingress(HEAD), network_timeout=60.0)
    pooled_before = {m: pooled_where(head_client, m) for m in POOLED}
    pooled_lost = sorted(m for m, (node, _) in pooled_before.items() if node == lost_id)
    pooled_kept = sorted(m for m, (node, _) in pooled_before.items() if node == cpu_id)
    assert pooled_lost and pooled_kept, pooled_before
    survivors = [HEAD, CPU_NODE]  # clients reach the cluster through the nodes that stay
    loads = {
        bystander: Load(cluster, check_ask(bystander), survivors, clients=2),
        "gpu_probe": Load(cluster, gpu_probe_ask, survivors, clients=2),
        "pooled": Load(cluster, pooled_ask(pooled_lost + pooled_kept), survivors, clients=1),
    }
    for load in loads.values():
        load.start()
    try:
        time.sleep(3)
        killed_at = time.monotonic()
        killed = netns_cluster.kill_node(GPU_NODE)
        unavailable_s = wait_until(
            "the index says gpu_probe is unavailable, with the reason",
            lambda: index_states(cluster)["gpu_probe"].get("state") == "UNAVAILABLE",
            120,
        )
        reason = index_states(cluster)["gpu_probe"].get("reason", "")
        pooled_moved_s = wait_until(
            "the pooled models of the lost node's host answer from the other node's host",
            lambda: all(pooled_where(head_client, m)[0] == cpu_id for m in pooled_lost),
            120,
        )
        pooled_during = {m: pooled_where(head_client, m) for m in POOLED}
        time.sleep(3)  # the bystander keeps serving while the node is gone
        restarted_at = time.monotonic()
        netns_cluster.restart_node(cluster, GPU_NODE)
        back_s = wait_until(
            "gpu_probe answers again from the returned node",
            lambda: (
                loads["gpu_probe"].answered_since(restarted_at)
                and index_states(cluster)["gpu_probe"].get("state") == "READY"
            ),
            180,
        )
        restored_s = wait_until(
            "every application runs its planned replicas again",
            lambda: (
                {a: sum(r["state"] == "RUNNING" for r in rs) for a, rs in replicas_by_app(cluster).items()}
                == counts_before
            ),
            180,
        )
        # the returned node's ingress routes every model again before the next test uses it
        ready = [name for name, m in index_states(cluster).items() if m.get("state") == "READY"]
        wait_until(
            "every node's ingress routes every model", lambda: netns_cluster.routed(cluster, ready), 120
        )
    finally:
        for load in loads.values():
            load.stop()
    after = replicas_by_app(cluster)
    account = {
        "lost_node": GPU_NODE.name,
        "processes_killed": killed,
        "applications_on_lost_node": on_lost_node,
        "index_unavailable_after_kill_s": round(unavailable_s, 2),
        "index_reason": reason,
        "node_restart_to_gpu_probe_answering_s": round(back_s, 2),
        "node_restart_to_plan_restored_s": round(back_s + restored_s, 2),
        "bystander": {"model": bystander, **loads[bystander].account(killed_at)},
        "gpu_probe": loads["gpu_probe"].account(killed_at),
        "pooled_models_on_lost_node": pooled_lost,
        "pooled_models_on_other_node": pooled_kept,
        "pooled_reloaded_elsewhere_after_kill_s": round(unavailable_s + pooled_moved_s, 2),
        "pooled": loads["pooled"].account(killed_at),
        "gpu_probe_answers_by_node": {
            ("lost node" if node_id == lost_id else "returned node"): n
            for node_id, n in loads["gpu_probe"].answered.items()
        },
    }
    record("node_loss", account)
    assert loads[bystander].failed == 0, loads[bystander].failures[:3]
    assert "no running replica" in reason, reason
    # what failed was in flight on the lost node (a closed connection) or refused by a surviving
    # ingress (5xx); the rest waited at the ingress and was answered when the node returned
    assert all(f.status in ("", "500", "502", "503", "504") for f in loads["gpu_probe"].failures)
    assert sum(loads["gpu_probe"].answered.values()) > 0
    gpu_node_id = next(n["node_id"] for n in netns_cluster.ray_nodes() if n["node_ip"] == GPU_NODE.ip)
    assert gpu_probe_ask(httpclient.InferenceServerClient(cluster.ingress(HEAD))) == gpu_node_id
    assert [r["node_ip"] for r in after[model_app_name("gpu_probe")]] == [GPU_NODE.ip]
    assert [r["node_ip"] for r in after[SERVER_APP]] == [HEAD.ip]
    # the lost host's models loaded again on the other host; that host's own models never moved
    assert {pooled_during[m][0] for m in pooled_lost} == {cpu_id}
    assert all(pooled_during[m] == pooled_before[m] for m in pooled_kept), (pooled_before, pooled_during)
    assert all(f.status in ("", "500", "502", "503", "504") for f in loads["pooled"].failures)
    assert loads["pooled"].answered[cpu_id] > 0
    # both host replicas run again, one on each worker, and every pooled model answers
    assert sorted(r["node_ip"] for r in after[HOST_APP]) == sorted([CPU_NODE.ip, GPU_NODE.ip])
    assert all(pooled_where(head_client, m)[0] in (cpu_id, gpu_node_id) for m in POOLED)
