"""Calls to a model with several instance groups go to the least loaded group, over the applications the
deployer names; a sequence's call goes to the group holding its owner (no Ray running)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from deployments.inference import InferRequest, InferResponse
from deployments.runtime.router import owner_rank
from deployments.serve.peers import GroupPicker, RemoteModels, counting
from deployments.serve.server_api import GroupApps, ReplicaClient
from deployments.settings import ServerSettings
from repository_loader.errors import NotFound, Unavailable
from repository_loader.model import InstanceGroup, InstanceKind, ModelDescription, TensorSpec
from repository_loader.plan import ClusterResources

APPS: GroupApps = (("model-m", 1), ("model-m--group-1", 1))


class FakeHandle:
    """A model deployment's handle: ``infer_internal.remote`` answers once its call is released."""

    def __init__(self, app: str) -> None:
        self.app = app
        self.pending: list[asyncio.Event] = []
        self.fail = False

    @property
    def infer_internal(self) -> FakeHandle:
        return self

    def remote(self, request: InferRequest) -> Any:
        release = asyncio.Event()
        self.pending.append(release)

        async def answer() -> InferResponse:
            await release.wait()
            if self.fail:
                raise RuntimeError("replica gone")
            return InferResponse(model_name=request.model_name, outputs={}, id=self.app)

        return answer()


class Cluster:
    """The fake handles by application, and how often the executor asked for a model's applications."""

    def __init__(self, apps: GroupApps = APPS) -> None:
        self.apps = apps
        self.handles: dict[str, FakeHandle] = {}
        self.asked = 0

    def connect(self, app: str) -> ReplicaClient:
        if app not in {name for name, _ in self.apps}:
            raise KeyError(app)
        return ReplicaClient(self.handles.setdefault(app, FakeHandle(app)))

    async def group_apps(self, model: str) -> GroupApps:
        self.asked += 1
        return self.apps

    def executor(self, refresh_s: float = 30.0) -> RemoteModels:
        return RemoteModels(self.group_apps, refresh_s=refresh_s, connect=self.connect)


async def _started(executor: RemoteModels) -> asyncio.Task[InferResponse]:
    task = asyncio.get_running_loop().create_task(executor.infer(InferRequest("m", {})))
    for _ in range(3):
        await asyncio.sleep(0)
    return task


def test_picker_takes_the_fewest_calls_per_replica_and_the_first_group_on_a_tie() -> None:
    picker = GroupPicker()
    assert picker.pick(APPS) == "model-m"
    picker.in_flight = {"model-m": 1}
    assert picker.pick(APPS) == "model-m--group-1"
    picker.in_flight = {"model-m": 1, "model-m--group-1": 1}
    assert picker.pick(APPS) == "model-m"
    # a group of three replicas takes three calls for every one of a single-replica group
    weighted: GroupApps = (("a", 1), ("b", 3))
    picker.in_flight = {"a": 1, "b": 2}
    assert picker.pick(weighted) == "b"
    picker.in_flight = {"a": 1, "b": 3}
    assert picker.pick(weighted) == "a"
    with counting(picker.in_flight, "a"), counting(picker.in_flight, "a"):
        assert picker.in_flight["a"] == 3
    assert picker.in_flight == {"a": 1, "b": 3}


async def test_calls_go_to_the_least_loaded_group() -> None:
    cluster = Cluster()
    executor = cluster.executor()
    first = await _started(executor)
    second = await _started(executor)
    third = await _started(executor)
    group0, group1 = cluster.handles["model-m"], cluster.handles["model-m--group-1"]
    assert (len(group0.pending), len(group1.pending)) == (2, 1)  # tie -> the first group, then the idle one
    group1.pending[0].set()
    assert (await second).id == "model-m--group-1"
    fourth = await _started(executor)  # group 1 is idle again: fewer in flight than group 0's two
    assert len(group1.pending) == 2
    for release in group0.pending + group1.pending:
        release.set()
    assert [(await t).id for t in (first, third, fourth)] == ["model-m", "model-m", "model-m--group-1"]
    assert executor.picker.in_flight == {}
    # the model's applications were asked once for all these calls, not once per call
    assert cluster.asked == 1


async def test_applications_are_asked_again_after_refresh_and_after_a_failure() -> None:
    cluster = Cluster()
    executor = cluster.executor(refresh_s=0.0)
    call = await _started(executor)
    cluster.handles["model-m"].pending[0].set()
    await call
    assert cluster.asked == 1
    call = await _started(executor)
    assert cluster.asked == 2  # refresh_s 0: the server application reads its deployer every call
    cluster.handles["model-m"].fail = True
    cluster.handles["model-m"].pending[-1].set()
    with pytest.raises(Unavailable, match="replica gone"):
        await call
    assert executor.picker.in_flight == {}
    cluster = Cluster()
    executor = cluster.executor()
    call = await _started(executor)
    cluster.handles["model-m"].fail = True
    cluster.handles["model-m"].pending[0].set()
    with pytest.raises(Unavailable):
        await call
    call = await _started(executor)  # the failure dropped what was known: asked again
    assert cluster.asked == 2
    cluster.handles["model-m"].fail = False
    cluster.handles["model-m"].pending[-1].set()
    await call


async def test_one_group_and_unknown_models() -> None:
    cluster = Cluster((("model-m", 2),))
    executor = cluster.executor()
    call = await _started(executor)
    assert list(cluster.handles) == ["model-m"] and executor.client("m").handle is cluster.handles["model-m"]
    cluster.handles["model-m"].pending[0].set()
    assert (await call).id == "model-m"
    with pytest.raises(NotFound, match="'other' is not found"):
        executor.client("other")


def _two_groups(cpu_count: int = 2) -> ModelDescription:
    spec = TensorSpec("x", "FP32", (4,))
    groups = (InstanceGroup("c", InstanceKind.CPU, cpu_count), InstanceGroup("g", InstanceKind.GPU, 1))
    return ModelDescription(
        name="m",
        path=Path("/repo/m"),
        platform="onnxruntime_onnx",
        backend="onnxruntime",
        max_batch_size=8,
        inputs=(spec,),
        outputs=(spec,),
        versions=(1,),
        instance_groups=groups,
    )


def test_calls_never_go_to_a_passive_group_unless_every_group_is_passive() -> None:
    from deployments.serve.app import RayDeployer

    deployer = RayDeployer(ServerSettings("/r"), ClusterResources(4, 1))
    groups = (
        InstanceGroup("idle", InstanceKind.CPU, 1, passive=True),
        InstanceGroup("cpu", InstanceKind.CPU, 2),
    )
    model = dataclasses.replace(_two_groups(), instance_groups=groups)
    deployer.prepare({"m": model})
    deployer.deployed["m"] = deployer.entries(model)
    assert deployer.group_apps("m") == (("model-m", 2),)
    idle = tuple(dataclasses.replace(g, passive=True) for g in groups)
    model = dataclasses.replace(model, instance_groups=idle)
    deployer.deployed["m"] = deployer.entries(model)
    assert deployer.group_apps("m") == (("model-m", 1),)  # its own: each request refused there


def test_a_replicas_instance_name_is_its_groups_name_and_its_index_in_the_group() -> None:
    from deployments.serve.model_app import instance_name

    class Context:
        rank = 1

    named = (InstanceGroup("busy", InstanceKind.CPU, 2), InstanceGroup("", InstanceKind.CPU, 2))
    model = dataclasses.replace(_two_groups(), instance_groups=named)
    assert instance_name(model, 0, Context()) == "busy_1"
    assert instance_name(model, 1, Context()) == "m_1_1"  # Triton's default group name: "<model>_<index>"
    assert instance_name(model, 0, None) == "busy_0"


def test_the_deployer_names_the_groups_handles_spread_over() -> None:
    from deployments.serve.app import RayDeployer, _same_shape

    deployer = RayDeployer(ServerSettings("/r"), ClusterResources(4, 1))
    model = _two_groups()
    deployer.prepare({"m": model})
    entries = deployer.entries(model)
    assert [e.app_name for e in entries] == ["model-m", "model-m--group-1"]
    assert deployer.group_apps("m") == (("model-m", 1),)  # not deployed yet: the model's own
    deployer.deployed["m"] = entries
    assert deployer.group_apps("m") == (("model-m", 2), ("model-m--group-1", 1))
    # a reload keeps the running replicas only where every group keeps its shape
    assert _same_shape(entries, deployer.entries(dataclasses.replace(model, versions=(1, 2))))
    assert not _same_shape(entries, deployer.entries(_two_groups(cpu_count=3)))
    assert not _same_shape(entries, entries[:1])


def test_a_sequence_call_goes_to_the_group_holding_its_owner() -> None:
    picker = GroupPicker()
    apps = (("g0", 2), ("g1", 1))  # ranks 0-1 in g0, rank 2 in g1
    for cid in range(1, 40):
        expected = "g0" if owner_rank(cid, 3) < 2 else "g1"
        assert picker.pick(apps, cid) == expected
    assert {picker.pick(apps, cid) for cid in range(1, 40)} == {"g0", "g1"}
    assert picker.pick(apps) == "g0"  # no sequence: least loaded, first on a tie


def test_a_registered_owner_missing_from_serves_targets_is_waited_for_then_given_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replica registers its rank before Serve lists it among the application's targets (just after
    a start): the owner is found once it is listed; a rank nobody holds fails at once, and one whose
    holder never shows fails after ``OWNER_WAIT_S``."""
    from deployments.serve import peers

    listed: dict[str, tuple[str, int]] = {}

    class Server:
        async def sequence_members(self, model: str) -> dict[int, tuple[str, str]]:
            return {0: ("model-s", "a0"), 1: ("model-s", "a1")}

    async def targets(app: str) -> dict[str, tuple[str, int]]:
        return dict(listed)

    monkeypatch.setattr(peers.hooks, "replica_http_targets", targets)
    monkeypatch.setattr(peers, "OWNER_WAIT_S", 60.0)  # longer than the test waits, until the last part
    directory = peers.ReplicaDirectory(Server())  # type: ignore[arg-type]

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        loop.call_later(0.5, listed.update, {"a1": ("127.0.0.1", 9001)})
        owner = await asyncio.wait_for(directory.owner("s", 1), 10)
        assert owner == ("127.0.0.1", 9001)  # waited until it was listed
        with pytest.raises(Unavailable, match="no replica holds rank 2"):
            await asyncio.wait_for(directory.owner("s", 2), 10)  # nobody holds it: at once
        monkeypatch.setattr(peers, "OWNER_WAIT_S", 1.0)
        started = loop.time()
        with pytest.raises(Unavailable, match="no replica holds rank 0"):
            await directory.owner("s", 0)  # registered, never listed
        assert loop.time() - started >= 1.0

    asyncio.run(scenario())


def test_each_replicas_own_counts_are_asked_at_once_and_a_silent_one_is_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``RemoteModels.replica_snapshots``: every replica of every instance group but the caller is asked
    at the model's statistics path with the internal header; one that fails, refuses or does not answer
    within the timeout is left out, so what it pushed last stands for it."""
    from aiohttp import web

    from deployments.runtime.router import REPLICA_SNAPSHOT
    from deployments.serve import peers

    asked: list[tuple[str, str | None]] = []

    def replica(name: str, status: int = 200, delay_s: float = 0.0) -> web.Application:
        async def answer(request: web.Request) -> web.Response:
            asked.append((request.path, request.headers.get(REPLICA_SNAPSHOT.decode())))
            await asyncio.sleep(delay_s)
            return web.json_response({"replica": name, "stats": [{"n": name}]}, status=status)

        app = web.Application()
        app.router.add_get("/v2/models/m/stats", answer)
        return app

    async def scenario() -> dict[str, dict[str, Any]]:
        runners, ports = [], {}
        for actor, app in {
            "a0": replica("r0"),
            "a1": replica("r1"),
            "a2": replica("r2", status=500),
            "a3": replica("r3", delay_s=1.5),
            "self": replica("me"),
        }.items():
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            runners.append(runner)
            ports[actor] = runner.addresses[0][1]
        listed = {
            "model-m": {a: ("127.0.0.1", ports[a]) for a in ("a0", "a2", "self")},
            "model-m--group-1": {"a1": ("127.0.0.1", ports["a1"]), "a3": ("127.0.0.1", ports["a3"])},
        }
        listed["model-m--group-1"]["a4"] = ("127.0.0.1", 1)  # takes no connection

        async def targets(app: str) -> dict[str, tuple[str, int]]:
            return listed[app]

        async def group_apps(model: str) -> GroupApps:
            return APPS

        monkeypatch.setattr(peers.hooks, "replica_http_targets", targets)
        monkeypatch.setattr(peers, "SNAPSHOT_TIMEOUT_S", 0.5)
        calls = peers.ReplicaCalls(peers.ReplicaDirectory(object()))  # type: ignore[arg-type]
        remote = RemoteModels(group_apps, calls=calls)
        try:
            return await remote.replica_snapshots("m", skip="self")
        finally:
            await calls.close()
            for runner in runners:
                await runner.cleanup()

    found = asyncio.run(scenario())
    assert {replica: snapshot["stats"] for replica, snapshot in found.items()} == {
        "r0": [{"n": "r0"}],
        "r1": [{"n": "r1"}],
    }
    assert sorted(asked) == [("/v2/models/m/stats", "1")] * 4  # r0, r1, r2 (500), r3 (too slow); not self


def test_without_the_direct_lane_no_replica_is_asked() -> None:
    async def group_apps(model: str) -> GroupApps:
        raise AssertionError("not asked")

    assert asyncio.run(RemoteModels(group_apps).replica_snapshots("m")) == {}


def test_the_model_hosts_hint_reaches_the_servers_console(caplog: pytest.LogCaptureFixture) -> None:
    """Many poolable models without hosts: the hint is a warning of the server's own log (stderr,
    Triton's format, shown where the server was started), not of Serve's replica file."""
    import logging

    from deployments.serve.app import RayDeployer
    from repository_loader.plan import HOSTS_HINT_MODELS

    deployer = RayDeployer(ServerSettings("/r"), ClusterResources(4, 0))
    python = dataclasses.replace(_two_groups(), backend="python", platform="", instance_groups=())
    models = {f"m{i}": dataclasses.replace(python, name=f"m{i}") for i in range(HOSTS_HINT_MODELS)}
    with caplog.at_level(logging.WARNING, logger="deployments"):
        deployer.prepare(models)
    hints = [r for r in caplog.records if "--model-hosts 1" in r.getMessage()]
    assert hints and all(r.name.startswith("deployments.") for r in hints), caplog.records
