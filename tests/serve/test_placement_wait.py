"""How the deployer tells a replica no node can take from one whose worker process starts late.

Serve writes the same "taken more than 10s to be scheduled" message for both; only a replica whose
resources Ray lists among the demands no node can grant fails its load after ``placement_timeout_s``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from deployments.serve import app, hooks
from deployments.settings import ServerSettings
from repository_loader.errors import Unavailable
from repository_loader.plan import ClusterResources

WAITING = (
    "Deployment 'model' in application 'm' has 1 replicas that have taken more than 10s to be scheduled."
)
ASK = {"num_cpus": 0.19, "num_gpus": 0}


def test_ray_resources_names_what_ray_reports() -> None:
    assert app.ray_resources({"num_cpus": 0.19, "num_gpus": 0}) == {"CPU": 0.19}
    assert app.ray_resources({"num_cpus": 1, "num_gpus": 0.5, "resources": {"head_node": 0.01}}) == {
        "CPU": 1.0,
        "GPU": 0.5,
        "head_node": 0.01,
    }
    assert app.same_resources(ASK, {"CPU": 0.19})
    assert app.same_resources(ASK, {"CPU": 0.19, "GPU": 0.0})
    assert not app.same_resources(ASK, {"CPU": 0.2})
    assert not app.same_resources(ASK, {"CPU": 0.19, "GPU": 1.0})


def _deployer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, states: list[str], demands: list[dict]
) -> app.RayDeployer:
    """A deployer whose Serve reports ``states`` (one per poll; the last one stays) for application
    ``m`` with the unscheduled message, and whose Ray lists ``demands`` as ungrantable."""
    polls = iter(states)
    last = {"state": states[0]}

    def serve_status() -> SimpleNamespace:
        last["state"] = next(polls, last["state"])
        deployment = SimpleNamespace(message=WAITING if last["state"] == "DEPLOYING" else "")
        application = SimpleNamespace(
            status=f"ApplicationStatus.{last['state']}", deployments={"model": deployment}
        )
        return SimpleNamespace(applications={"m": application})

    monkeypatch.setattr(hooks, "serve_status", serve_status)
    monkeypatch.setattr(hooks, "pending_resource_demands", lambda: demands)
    settings = ServerSettings(model_repository=str(tmp_path), placement_timeout_s=0.3, deploy_timeout_s=30)
    return app.RayDeployer(settings, ClusterResources(2))


def test_a_replica_whose_worker_starts_late_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # unscheduled for 4 polls (about 2 s, past the 0.3 s placement timeout), then running: nothing
    # in Ray's ungrantable demands has its shape (another model's larger ask does not count)
    deployer = _deployer(tmp_path, monkeypatch, ["DEPLOYING"] * 4 + ["RUNNING"], [{"CPU": 4.0}])
    asyncio.run(deployer._wait_running({"m": ASK}))


def test_a_replica_no_node_can_take_fails_after_the_placement_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployer = _deployer(
        tmp_path, monkeypatch, ["DEPLOYING"] * 20 + ["RUNNING"], [{"CPU": 4.0}, {"CPU": 0.19}]
    )
    with pytest.raises(Unavailable, match="no node has the resources its replicas need: .*to be scheduled"):
        asyncio.run(deployer._wait_running({"m": ASK}))


def test_demands_that_cannot_be_read_decide_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GCS not answering neither fails the load nor loses the wait: the replica starts later."""
    deployer = _deployer(tmp_path, monkeypatch, ["DEPLOYING"] * 4 + ["RUNNING"], [])

    def unreadable() -> list[dict[str, float]]:
        raise TimeoutError("GCS did not answer")

    monkeypatch.setattr(hooks, "pending_resource_demands", unreadable)
    asyncio.run(deployer._wait_running({"m": ASK}))
