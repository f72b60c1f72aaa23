"""Several instance groups of one model, and Serve's autoscaling, on the multi-node cluster.

``two_groups`` and ``autoscaled`` (``tests/cluster/conftest.py``) answer with the Serve application and
the replica that ran the request, so a client sees which group or replica served it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import tritonclient.http as httpclient

from repository_loader.plan import group_app_name, model_app_name
from tests.cluster.load import Load, wait_until, where_ask
from tools import netns_cluster
from tools.netns_cluster import HEAD, NODES, ClusterState

pytestmark = [pytest.mark.multinode, pytest.mark.slow]


def replicas(app: str) -> list[dict[str, Any]]:
    """Every replica of ``app`` Serve lists (starting, running, stopping)."""
    details = netns_cluster.serve_details()["applications"].get(app, {})
    return [
        r for deployment in details.get("deployments", {}).values() for r in deployment.get("replicas", [])
    ]


def running_replicas(app: str) -> list[dict[str, Any]]:
    return [r for r in replicas(app) if r.get("state") == "RUNNING"]


def by_app(load: Load) -> Counter[str]:
    return Counter({who.split()[0]: n for who, n in load.answered.items()})


def test_two_instance_groups_of_one_model_serve_together_behind_its_route(cluster: ClusterState) -> None:
    first, second = model_app_name("two_groups"), group_app_name("two_groups", 1)
    assert len(running_replicas(first)) == 1 and len(running_replicas(second)) == 1
    with Load(cluster, where_ask("two_groups", 50), NODES, clients=4) as load:
        wait_until("both groups answer", lambda: min(by_app(load)[first], by_app(load)[second]) >= 5, 60)
    print(f"two groups: sent {load.sent}, failed {load.failed}, answered by {dict(by_app(load))}")
    assert load.failed == 0, load.failures[:5]
    assert set(by_app(load)) == {first, second}


def test_a_model_autoscales_up_under_load_and_down_after(cluster: ClusterState) -> None:
    app = model_app_name("autoscaled")
    ask = where_ask("autoscaled", 0)
    client = httpclient.InferenceServerClient(cluster.ingress(HEAD), network_timeout=60.0)
    assert ask(client).split()[0] == app
    assert len(running_replicas(app)) == 1
    with Load(cluster, where_ask("autoscaled", 100), NODES, clients=6) as load:
        up_s = wait_until("a second replica under load", lambda: len(running_replicas(app)) == 2, 120)
        # the added replica takes its share of the load
        wait_until(
            "both replicas answer", lambda: len(load.answered) == 2 and min(load.answered.values()) >= 5, 60
        )
    # the replica taken away has stopped, not only left the running ones
    down_s = wait_until(
        "back to one replica at rest",
        lambda: [r.get("state") for r in replicas(app)] == ["RUNNING"],
        120,
    )
    print(
        f"autoscaling: up after {up_s:.1f}s of load (6 clients), down {down_s:.1f}s after it stopped; "
        f"sent {load.sent}, failed {load.failed}, answered by replica {dict(load.answered)}"
    )
    assert load.failed == 0, load.failures[:5]
    assert ask(client).split()[0] == app
