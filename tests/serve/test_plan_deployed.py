"""What Serve runs is the deployment plan: each instance group's application has its plan entry's options."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployments.settings import ServerSettings
from repository_loader import load_repository
from repository_loader.plan import ClusterResources, plan_deployments
from tests.serve.conftest import PYTHON_BACKENDS, SESSION_EXIT_TIMEOUT_S, SESSION_HOSTS, SESSION_POOLED

pytestmark = pytest.mark.serve


def test_deployed_serve_options_equal_the_plan(server_url: str, tmp_path: Path) -> None:
    from deployments.serve import hooks, launch, spare
    from tests.serve.conftest import build_test_repository

    deployed = launch.call_server(lambda server: server.deployed_plan())
    assert {"add_sub", "batched", "multi_version"} <= set(deployed)
    # the models deployed at start have the entries of the plan of the repository the server started
    # with, on this cluster (other tests add models to the shared repository later): every entry of
    # every model (one per instance group), each its own application
    initial = load_repository(str(build_test_repository(tmp_path)), backend_directory=PYTHON_BACKENDS).models
    hosts = ServerSettings.from_args({"model_repository": str(tmp_path), **SESSION_HOSTS}).host_policy
    plan = plan_deployments(initial, ClusterResources(num_cpus=2), hosts=hosts)
    started = [name for name in deployed if plan.entry(name) is not None]
    assert not set(SESSION_POOLED) & set(deployed)  # the models that asked are on the host
    assert {"add_sub", "batched", "multi_version"} <= set(started)
    for name in started:
        assert deployed[name] == [entry.to_dict() for entry in plan.for_model(name)], name
    applied = [entry for entries in deployed.values() for entry in entries]
    assert len({entry["app_name"] for entry in applied}) == len(applied)
    for entry in applied:  # every deployed model, whenever loaded: Serve runs its entries
        options = hooks.deployed_options(entry["app_name"], entry["deployment_name"])
        # the server's runtime environment with the models' setup hook (deployments/serve/spare.py): not
        # a plan decision, the process its replicas start in
        runtime_env = options["ray_actor_options"].pop("runtime_env")
        assert runtime_env["env_vars"][hooks.SETUP_HOOK_ENV] == spare.MODEL_PRELOAD, entry["app_name"]
        assert options == {
            "route_prefix": entry["route_prefix"],
            "num_replicas": entry["num_replicas"],
            "max_ongoing_requests": entry["max_ongoing_requests"],
            "ray_actor_options": {
                "num_cpus": entry["num_cpus_per_replica"],
                "num_gpus": entry["num_gpus_per_replica"],
            },
            "graceful_shutdown_timeout_s": SESSION_EXIT_TIMEOUT_S,  # --exit-timeout-secs
        }, entry["app_name"]
