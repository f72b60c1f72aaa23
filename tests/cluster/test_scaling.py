"""Several instance groups of one model, and Serve's autoscaling, on the multi-node cluster.

``two_groups`` and ``autoscaled`` (``tests/cluster/conftest.py``) answer with the Serve application of
the replica that ran the request, so a client sees which group or replica served it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from repository_loader.plan import group_app_name, model_app_name
from tools import netns_cluster
from tools.netns_cluster import NODES, ClusterState

pytestmark = [pytest.mark.multinode, pytest.mark.slow]


def ask(client: httpclient.InferenceServerClient, model: str, delay_ms: int) -> tuple[str, str]:
    """(Serve application, replica id) of the replica that answered."""
    tensor = httpclient.InferInput("DELAY_MS", [1], "INT32")
    tensor.set_data_from_numpy(np.array([delay_ms], np.int32))
    app, replica = (bytes(s).decode() for s in client.infer(model, [tensor]).as_numpy("WHERE").reshape(-1))
    return app, replica


def running_replicas(app: str) -> list[dict[str, Any]]:
    details = netns_cluster.serve_details()["applications"].get(app, {})
    return [
        r
        for deployment in details.get("deployments", {}).values()
        for r in deployment.get("replicas", [])
        if r.get("state") == "RUNNING"
    ]


class Load:
    """``clients`` threads sending requests to ``model`` through the ingress of every node in turn
    until stopped; counts what was sent, answered and failed, and which application answered."""

    def __init__(self, cluster: ClusterState, model: str, clients: int, delay_ms: int) -> None:
        self.cluster, self.model, self.delay_ms = cluster, model, delay_ms
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.sent = self.failed = 0
        self.apps: Counter[str] = Counter()
        self.replicas: Counter[str] = Counter()
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def _run(self, index: int) -> None:
        node = NODES[index % len(NODES)]
        client = httpclient.InferenceServerClient(self.cluster.ingress(node), network_timeout=60.0)
        while not self.stop.is_set():
            try:
                app, replica = ask(client, self.model, self.delay_ms)
            except Exception as exc:
                with self.lock:
                    self.sent += 1
                    self.failed += 1
                    self.errors.append(repr(exc)[:200])
            else:
                with self.lock:
                    self.sent += 1
                    self.apps[app] += 1
                    self.replicas[replica] += 1

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(90)


def wait_until(what: str, check: Callable[[], bool], timeout_s: float) -> float:
    """Seconds until ``check`` holds (checked every half second); fails after ``timeout_s``."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout_s, f"not within {timeout_s:.0f}s: {what}"
        time.sleep(0.5)
    return time.monotonic() - start


def test_two_instance_groups_of_one_model_serve_together_behind_its_route(cluster: ClusterState) -> None:
    first, second = model_app_name("two_groups"), group_app_name("two_groups", 1)
    assert len(running_replicas(first)) == 1 and len(running_replicas(second)) == 1
    with Load(cluster, "two_groups", clients=4, delay_ms=50) as load:
        wait_until("both groups answer", lambda: min(load.apps[first], load.apps[second]) >= 5, 60)
    print(f"two groups: sent {load.sent}, failed {load.failed}, answered by {dict(load.apps)}")
    assert load.failed == 0, load.errors[:5]
    assert set(load.apps) == {first, second}


def test_a_model_autoscales_up_under_load_and_down_after(cluster: ClusterState) -> None:
    app = model_app_name("autoscaled")
    client = httpclient.InferenceServerClient(cluster.ingress(NODES[0]), network_timeout=60.0)
    assert ask(client, "autoscaled", 0)[0] == app
    assert len(running_replicas(app)) == 1
    with Load(cluster, "autoscaled", clients=6, delay_ms=100) as load:
        up_s = wait_until("a second replica under load", lambda: len(running_replicas(app)) == 2, 120)
        # the added replica takes its share of the load
        wait_until(
            "both replicas answer", lambda: len(load.replicas) == 2 and min(load.replicas.values()) >= 5, 60
        )
    down_s = wait_until("back to one replica at rest", lambda: len(running_replicas(app)) == 1, 120)
    print(
        f"autoscaling: up after {up_s:.1f}s of load (6 clients), down {down_s:.1f}s after it stopped; "
        f"sent {load.sent}, failed {load.failed}, answered by replica {dict(load.replicas)}"
    )
    assert load.failed == 0, load.errors[:5]
    assert ask(client, "autoscaled", 0)[0] == app
