"""What Serve runs is the deployment plan: each instance group's application has its plan entry's options."""

from __future__ import annotations

from pathlib import Path

import pytest

from repository_loader import load_repository
from repository_loader.plan import ClusterResources, plan_deployments

pytestmark = pytest.mark.serve


def test_deployed_serve_options_equal_the_plan(server_url: str, test_repository: Path) -> None:
    from deployments.serve import hooks, launch

    deployed = launch.call_server("deployed_plan")
    assert {"add_sub", "batched", "multi_version"} <= set(deployed)
    # the entries the server applied are those of the plan of the whole repository on this cluster:
    # every entry of every model (one per instance group), each its own application
    plan = plan_deployments(load_repository(str(test_repository)).models, ClusterResources(num_cpus=2))
    for name, entries in deployed.items():
        assert entries == [entry.to_dict() for entry in plan.for_model(name)], name
    applied = [entry for entries in deployed.values() for entry in entries]
    assert len({entry["app_name"] for entry in applied}) == len(applied)
    for entry in applied:
        options = hooks.deployed_options(entry["app_name"], entry["deployment_name"])
        assert options == {
            "route_prefix": entry["route_prefix"],
            "num_replicas": entry["num_replicas"],
            "max_ongoing_requests": entry["max_ongoing_requests"],
            "ray_actor_options": {
                "num_cpus": entry["num_cpus_per_replica"],
                "num_gpus": entry["num_gpus_per_replica"],
            },
        }, entry["app_name"]
