"""A model host (``deployments.runtime.host``): models loaded on demand, evicted least recently used
under a memory budget measured from the process's resident memory, counters kept across evictions.

The models are real Python models whose ``initialize`` allocates and touches ``MIB`` mebibytes, so the
footprints are the process's real resident memory, not numbers the test made up.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deployments.runtime.host import HostedModels, ModelHost
from deployments.runtime.model import ModelRuntime
from deployments.runtime.router import Router, Where
from repository_loader.errors import NotFound, Unavailable
from repository_loader.model import ModelDescription
from tests.backends.helpers import describe, request, spec

MIB = 2**20
# holds MIB mebibytes (written, so resident) while loaded; answers Y = X + 1 after X milliseconds, or
# for X < 0 once the test has made the file GATE beside this model.py
ALLOCATING_PY = """
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        self.block = bytearray(int(parameters["MIB"]["string_value"]) * 1048576)
        for i in range(0, len(self.block), 4096):
            self.block[i] = 1

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            delay_ms = float(x.reshape(-1)[0])
            gate = os.path.join(os.path.dirname(__file__), "GATE")
            deadline = time.monotonic() + 60
            while delay_ms < 0 and not os.path.exists(gate) and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(max(delay_ms, 0.0) / 1000.0)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1)]))
        return responses

    def finalize(self):
        self.block = None
"""


def sized_models(
    tmp_path: Path, sizes: dict[str, int], source: str = ALLOCATING_PY
) -> dict[str, ModelDescription]:
    """Python models ``X -> Y`` of ``source``, each given its size in MiB as parameter ``MIB``."""
    found = {}
    for name, mib in sizes.items():
        folder = tmp_path / name
        (folder / "1").mkdir(parents=True)
        (folder / "1" / "model.py").write_text(source)
        found[name] = describe(
            name,
            folder,
            "python",
            [spec("X", "FP32", [1])],
            [spec("Y", "FP32", [1])],
            parameters={"MIB": str(mib)},
        )
    return found


def _host(models: dict[str, ModelDescription], budget_mib: int, **kw: object) -> ModelHost:
    async def describe_pooled(name: str) -> ModelDescription | None:
        return models.get(name)

    return ModelHost(describe_pooled, ModelRuntime, budget_mib * MIB, **kw)  # type: ignore[arg-type]


async def _ask(host: ModelHost, name: str, delay_ms: float = 0.0) -> float:
    answer = await host.infer(request(name, X=np.array([delay_ms], dtype=np.float32)))
    assert answer.error is None, answer.error
    return float(np.asarray(answer.outputs["Y"]).reshape(-1)[0])


async def test_a_model_loads_on_its_first_request_and_stays(tmp_path: Path) -> None:
    host = _host(sized_models(tmp_path, {"a": 8}), budget_mib=500)
    try:
        assert host.resident == {}
        assert await _ask(host, "a") == 1.0
        assert list(host.resident) == ["a"] and host.counters["a"].loads == 1
        assert await _ask(host, "a") == 1.0
        assert host.counters["a"].loads == 1  # warm: no second load
        assert 6 * MIB <= host.resident["a"].footprint <= 20 * MIB  # measured, about its 8 MiB
    finally:
        await host.close()


async def test_an_unknown_model_is_not_found_with_tritons_wording(tmp_path: Path) -> None:
    host = _host({}, budget_mib=100)
    answer = await host.infer(request("nope", X=np.array([0.0], dtype=np.float32)))
    assert isinstance(answer.error, NotFound)
    assert answer.error.message == "Request for unknown model: 'nope' is not found"


async def test_the_least_recently_used_idle_model_is_evicted_to_fit_the_budget(tmp_path: Path) -> None:
    host = _host(sized_models(tmp_path, {"a": 40, "b": 40, "c": 40}), budget_mib=100)
    try:
        await _ask(host, "a")
        await _ask(host, "b")
        await _ask(host, "a")  # b is now the least recently used
        await _ask(host, "c")
        assert set(host.resident) == {"a", "c"}
        assert host.counters["b"].evictions == 1
        assert host.accounted_bytes() <= host.budget_bytes
        assert await _ask(host, "b") == 1.0  # an evicted model loads again on its next request
        assert host.counters["b"].loads == 2 and "b" in host.resident
    finally:
        await host.close()


async def test_a_model_with_a_request_inside_is_never_evicted(tmp_path: Path) -> None:
    host = _host(sized_models(tmp_path, {"a": 40, "b": 40, "c": 40}), budget_mib=100)
    gate = tmp_path / "b" / "1" / "GATE"
    try:
        await _ask(host, "b")
        held = asyncio.ensure_future(_ask(host, "b", delay_ms=-1))  # answers once the gate is there
        await _until(lambda: "b" in host.resident and host.resident["b"].inside == 1)
        await _ask(host, "a")  # b, with its request inside, is now the least recently used
        await _ask(host, "c")
        assert "b" in host.resident and "a" not in host.resident
        gate.touch()
        assert await asyncio.wait_for(held, 30) == 0.0  # answered, not dropped
    finally:
        gate.touch()
        await host.close()


async def _until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Until ``condition()`` holds (other tasks run meanwhile); fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.001)


async def test_a_model_larger_than_the_budget_fails_its_load_naming_the_budget(tmp_path: Path) -> None:
    host = _host(sized_models(tmp_path, {"big": 120, "small": 4}), budget_mib=60)
    try:
        answer = await host.infer(request("big", X=np.array([0.0], dtype=np.float32)))
        assert isinstance(answer.error, Unavailable)
        assert "memory budget" in answer.error.message and "'big'" in answer.error.message
        assert "big" not in host.resident and host.counters["big"].load_failures == 1
        assert await _ask(host, "small") == 1.0  # the host keeps serving
    finally:
        await host.close()


async def test_concurrent_first_requests_share_one_load(tmp_path: Path) -> None:
    host = _host(sized_models(tmp_path, {"a": 4}), budget_mib=200)
    try:
        answers = await asyncio.gather(*(_ask(host, "a") for _ in range(8)))
        assert answers == [1.0] * 8 and host.counters["a"].loads == 1
    finally:
        await host.close()


async def test_ongoing_counts_every_request_inside_cold_loads_included(tmp_path: Path) -> None:
    host = _host(sized_models(tmp_path, {"a": 4, "b": 4}), budget_mib=200)
    try:
        await _ask(host, "a")
        slow = [asyncio.ensure_future(_ask(host, "a", delay_ms=800)) for _ in range(3)]
        cold = asyncio.ensure_future(_ask(host, "b"))  # waits for b's load
        await asyncio.sleep(0)  # each has entered the host, and none can have left yet
        assert host.ongoing == 4 and "b" not in host.resident
        await asyncio.gather(*slow, cold)
        assert host.ongoing == 0
        await host.infer(request("nope", X=np.array([0.0], dtype=np.float32)))  # refused: counted out too
        assert host.ongoing == 0
    finally:
        await host.close()


async def test_statistics_stay_cumulative_across_evictions(tmp_path: Path) -> None:
    host = _host(sized_models(tmp_path, {"a": 40, "b": 40, "c": 40}), budget_mib=100)
    try:
        for _ in range(3):
            await _ask(host, "a")
        await _ask(host, "b")
        await _ask(host, "c")  # evicts a
        assert "a" not in host.resident
        await _ask(host, "a")
        (stats,) = host.statistics("a")
        assert stats["inference_stats"]["success"]["count"] == 4
    finally:
        await host.close()


async def test_a_forgotten_model_is_unloaded_and_described_again(tmp_path: Path) -> None:
    models = sized_models(tmp_path, {"a": 4})
    host = _host(models, budget_mib=200)
    try:
        await _ask(host, "a")
        models.pop("a")  # unloaded from the repository
        await host.forget("a")
        assert "a" not in host.resident
        answer = await host.infer(request("a", X=np.array([0.0], dtype=np.float32)))
        assert isinstance(answer.error, NotFound)
    finally:
        await host.close()


async def test_the_router_runs_every_available_model_here(tmp_path: Path) -> None:
    host = _host(sized_models(tmp_path, {"a": 4}), budget_mib=200)
    try:
        router = Router(local=HostedModels(host))
        probe = request("a", X=np.array([0.0], dtype=np.float32))
        assert router.place(probe).where is Where.REMOTE  # not known yet: the data plane asks first
        await host.description("a")
        assert router.place(probe).where is Where.LOCAL
        answer = await router.infer(probe)
        assert answer.error is None and "a" in host.resident
    finally:
        await host.close()


@pytest.mark.parametrize("concurrency", [1, 2])
async def test_loads_run_at_most_load_concurrency_at_a_time(tmp_path: Path, concurrency: int) -> None:
    host = _host(
        sized_models(tmp_path, {f"m{i}": 2 for i in range(4)}), budget_mib=500, load_concurrency=concurrency
    )
    running = 0
    most = 0
    make = host._make_runtime

    class Counted(ModelRuntime):
        async def load(self) -> None:
            nonlocal running, most
            running += 1
            most = max(most, running)
            try:
                await asyncio.sleep(0.05)
                await super().load()
            finally:
                running -= 1

    host._make_runtime = lambda model: Counted(model)  # type: ignore[method-assign]
    try:
        await asyncio.gather(*(_ask(host, f"m{i}") for i in range(4)))
        assert most == concurrency
    finally:
        host._make_runtime = make  # type: ignore[method-assign]
        await host.close()


async def test_a_start_of_many_pooled_models_starts_the_host_application_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start loads its models together: the first pooled model starts the host application, the
    others wait for it (concurrent Serve deploys from threads broke pickling in Ray)."""
    from types import SimpleNamespace

    from deployments.serve import app, hooks
    from deployments.settings import ServerSettings
    from repository_loader.plan import ClusterResources

    started: list[str] = []

    def run_application(build: object, name: str, route: str) -> None:
        started.append(name)

    monkeypatch.setattr(hooks, "run_application", run_application)
    monkeypatch.setattr(hooks, "serve_status", lambda: SimpleNamespace(applications={}))

    async def running(self: object, asks: object) -> None:
        await asyncio.sleep(0.05)

    monkeypatch.setattr(app.RayDeployer, "_wait_running", running)
    settings = ServerSettings(model_repository=str(tmp_path), model_hosts=1)
    deployer = app.RayDeployer(settings, ClusterResources(2))
    models = sized_models(tmp_path, {f"m{i}": 1 for i in range(20)})
    await asyncio.gather(*(deployer.deploy(m) for m in models.values()))
    assert started == ["triton-hosts"]
    assert set(deployer.pooled) == set(models)
    assert deployer.group_apps("m3") == (("triton-hosts", 1),)


async def test_a_name_the_host_does_not_pool_gets_the_servers_answer(tmp_path: Path) -> None:
    """A model with a deployment of its own reaches the host through the ``/v2/models`` fallback route
    until HAProxy routes its own prefix (just after its load): the host answers as the server
    application does: ready, described and counted where it is served, not ready while it loads, and
    an unknown name is not found."""
    from deployments.replica import host_dataplane
    from repository_loader.errors import ServerError

    host = _host(sized_models(tmp_path, {"a": 1}), budget_mib=100)
    served = sized_models(tmp_path / "elsewhere", {"served": 1})["served"]

    async def server_describe(name: str, version: str) -> ModelDescription:
        if name == "served":
            return served
        if name == "loading":
            raise Unavailable("model 'loading' is not ready")
        raise NotFound(f"Request for unknown model: '{name}' is not found")

    async def server_statistics(name: str, version: str) -> dict[str, Any]:
        return {"model_stats": [{"name": name, "version": version or "1", "inference_count": 7}]}

    dataplane = host_dataplane(
        host, describe_elsewhere=server_describe, statistics_elsewhere=server_statistics
    )
    try:
        assert await dataplane.model_ready("a") is True
        assert await dataplane.model_ready("served") is True
        assert await dataplane.model_ready("served", "1") is True
        assert await dataplane.model_ready("served", "2") is False
        assert (await dataplane.model_metadata("served"))["name"] == "served"
        assert await dataplane.model_config("served") == dict(served.config_json)
        stats = await dataplane.model_statistics("served")
        assert stats["model_stats"][0]["inference_count"] == 7
        assert "served" not in host.known  # answered for, never pooled here
        assert await dataplane.model_ready("loading") is False
        with pytest.raises(Unavailable):
            await dataplane.model_metadata("loading")
        with pytest.raises(NotFound):
            await dataplane.model_metadata("nope")
        with pytest.raises(ServerError):
            await dataplane.model_description("loading")
    finally:
        await host.close()


async def test_a_name_the_server_resolves_to_a_namespaced_key_is_called_by_that_key(tmp_path: Path) -> None:
    """With model namespacing, the one known copy of a name in several repositories is keyed by its
    repository: a host asked for the plain name calls the copy by its key and answers with the name."""
    from dataclasses import replace

    from deployments.inference import InferRequest, InferResponse
    from deployments.replica import host_dataplane

    host = _host({}, budget_mib=100)
    copy = replace(sized_models(tmp_path / "elsewhere", {"dup": 1})["dup"], name="dup@repo_b")
    called: list[str] = []

    async def server_describe(name: str, version: str) -> ModelDescription:
        if name in ("dup", "dup@repo_b"):
            return copy
        raise NotFound(f"Request for unknown model: '{name}' is not found")

    class Remote:
        async def infer(self, request: InferRequest) -> InferResponse:
            called.append(request.model_name)
            return InferResponse(model_name=request.model_name, model_version="1")

    dataplane = host_dataplane(host, remote=Remote(), describe_elsewhere=server_describe)  # type: ignore[arg-type]
    try:
        assert (await dataplane.model_description("dup")).name == "dup@repo_b"
        answer = await dataplane.infer(InferRequest("dup", {}))
        assert called == ["dup@repo_b"] and isinstance(answer, InferResponse) and answer.model_name == "dup"
        await dataplane.infer(InferRequest("dup@repo_b", {}))  # its key: as it is
        assert called == ["dup@repo_b"] * 2
    finally:
        await host.close()


async def test_a_requester_that_leaves_does_not_abort_the_load_others_wait_for(tmp_path: Path) -> None:
    host = _host(sized_models(tmp_path, {"a": 20}), budget_mib=200)

    loading = asyncio.Event()

    class Slow(ModelRuntime):
        async def load(self) -> None:
            loading.set()
            await asyncio.sleep(0.3)
            await super().load()

    host._make_runtime = lambda model: Slow(model)  # type: ignore[method-assign]
    try:
        first = asyncio.ensure_future(_ask(host, "a"))
        await asyncio.wait_for(loading.wait(), 10)  # the load is under way
        second = asyncio.ensure_future(_ask(host, "a"))
        first.cancel()
        assert await second == 1.0
        assert host.counters["a"].loads == 1 and host.counters["a"].load_failures == 0
    finally:
        await host.close()


async def test_a_pooled_ensemble_runs_its_pooled_steps_here_and_calls_the_others_where_they_run(
    tmp_path: Path,
) -> None:
    """``chain`` (a then b) runs both steps as this host's own pooled models, each loaded and counted
    once; ``mixed``'s second step is not pooled, so it is described and called elsewhere. A step that
    is forgotten (unloaded or changed) takes the ensembles that reach it with it."""
    import ensembles  # noqa: F401  (registers the ensemble backend)
    from deployments.inference import InferRequest, InferResponse
    from tests.ensembles.helpers import ensemble, step

    io = [("X", "FP32", (1,))]
    models: dict[str, ModelDescription] = {
        **sized_models(tmp_path, {"a": 2, "b": 2}),
        "chain": ensemble(
            "chain",
            io,
            [("Y", "FP32", (1,))],
            [step("a", {"X": "X"}, {"Y": "mid"}), step("b", {"X": "mid"}, {"Y": "Y"})],
        ),
        "mixed": ensemble(
            "mixed",
            io,
            [("Y", "FP32", (1,))],
            [step("a", {"X": "X"}, {"Y": "mid"}), step("far", {"X": "mid"}, {"Y": "Y"})],
        ),
    }
    far = sized_models(tmp_path / "elsewhere", {"far": 1})["far"]
    far_calls: list[float] = []

    class Elsewhere:
        async def infer(self, request: InferRequest) -> InferResponse:
            x = np.asarray(request.inputs["X"], dtype=np.float32)
            far_calls.append(float(x.reshape(-1)[0]))
            return InferResponse(model_name=request.model_name, outputs={"Y": x * 10})

    async def describe_pooled(name: str) -> ModelDescription | None:
        return models.get(name)

    async def describe_elsewhere(name: str) -> ModelDescription:
        if name == "far":
            return far
        raise NotFound(f"Request for unknown model: '{name}' is not found")

    router: Router | None = None

    def make_runtime(model: ModelDescription, **ensemble_keywords: object) -> ModelRuntime:
        return ModelRuntime(model, executor=router, **ensemble_keywords)  # type: ignore[arg-type]

    host = ModelHost(describe_pooled, make_runtime, 200 * MIB, describe_elsewhere=describe_elsewhere)
    router = Router(local=HostedModels(host), remote=Elsewhere())
    try:
        for name in ("chain", "mixed"):  # the data plane asks first, as for any pooled model
            await host.description(name)
        assert {"a", "b"} <= set(host.known)  # the steps are available here with it
        answer = await router.infer(request("chain", X=np.array([1.0], dtype=np.float32)))
        assert answer.error is None, answer.error
        assert float(np.asarray(answer.outputs["Y"]).reshape(-1)[0]) == 3.0  # (1 + 1) + 1
        # the steps are resident here as models of their own; the ensemble hosts no copies
        assert set(host.resident) == {"a", "b", "chain"}
        assert not host.resident["chain"].runtime.versions[1].backend.hosted  # type: ignore[attr-defined]
        assert host.counters["a"].loads == 1 and host.counters["b"].loads == 1
        await _ask(host, "a")  # a direct call finds the step loaded
        assert host.counters["a"].loads == 1
        answer = await router.infer(request("mixed", X=np.array([2.0], dtype=np.float32)))
        assert answer.error is None, answer.error
        assert float(np.asarray(answer.outputs["Y"]).reshape(-1)[0]) == 30.0 and far_calls == [3.0]
        assert "far" not in host.known and "far" not in host.resident
        await host.forget("b")
        assert "chain" not in host.resident and "chain" not in host.known
        assert "mixed" in host.resident  # it does not reach b
        await host.description("chain")  # described again, as the data plane does on its next request
        answer = await router.infer(request("chain", X=np.array([0.0], dtype=np.float32)))
        assert answer.error is None and host.counters["chain"].loads == 2
    finally:
        await host.close()


@pytest.mark.parametrize("instances", [1, 2])
async def test_a_runtime_of_several_instances_runs_that_many_batches_at_once(instances: int) -> None:
    """A pooled stateless model's CPU instances are one loaded model on a host (``pooled_instances``):
    its runtime hands the backend up to that many batches at once, as Triton runs its instances."""
    from deployments.backends.base import Backend
    from deployments.backends.registry import _BACKENDS, register_backend
    from deployments.inference import InferRequest, InferResponse
    from tests.backends.helpers import spec

    running, most = 0, 0

    class Probe(Backend):
        def load(self) -> None:
            pass

        async def execute(self, requests: Sequence[InferRequest]) -> list[InferResponse]:
            nonlocal running, most
            running += 1
            most = max(most, running)
            await asyncio.sleep(0.05)
            running -= 1
            return [InferResponse(model_name=r.model_name, outputs={"Y": r.inputs["X"]}) for r in requests]

    register_backend("concurrency_probe", lambda: Probe)
    model = describe(
        "probe", Path("/nowhere"), "concurrency_probe", [spec("X", "FP32", [1])], [spec("Y", "FP32", [1])]
    )
    runtime = ModelRuntime(model, instances=instances)
    try:
        await runtime.load()
        answers = await asyncio.gather(
            *(runtime.infer(request("probe", X=np.array([float(i)], dtype=np.float32))) for i in range(4))
        )
        assert all(a.error is None for a in answers)
        assert most == instances
    finally:
        await runtime.close()
        _BACKENDS.pop("concurrency_probe", None)


RAISING_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        raise pb_utils.TritonModelException("no answer for this")
"""


async def test_failures_count_over_every_load_of_a_pooled_model(tmp_path: Path) -> None:
    """What ``/metrics`` prints of a pooled model beside its statistics (its failures by reason) is
    the host's to report, as a replica reports its own; it outlives an eviction, and goes with the
    model when the model is unloaded (forgotten), as its statistics do."""
    host = _host(sized_models(tmp_path, {"f": 1}, source=RAISING_PY), budget_mib=100)

    async def fail() -> None:
        answer = await host.infer(request("f", X=np.array([0.0], dtype=np.float32)))
        assert answer.error is not None

    try:
        for expected in (1, 2):
            await fail()
            metrics = host.request_metrics("f")
            assert metrics["failures"] == {"1": {"BACKEND": expected}}
            assert metrics["pending"] == {"1": 0} and "stats" not in metrics
            await host._evict("f", host.resident["f"], reason="test")  # the budget's eviction
            assert host.request_metrics("f")["failures"] == {"1": {"BACKEND": expected}}
        assert host.statistics("f")[0]["inference_stats"]["fail"]["count"] == 2
        await host.forget("f")  # unloaded: loaded again, it counts from zero
        assert host.request_metrics("f")["failures"] == {} and host.statistics("f") == []
        await fail()
        assert host.request_metrics("f")["failures"] == {"1": {"BACKEND": 1}}
    finally:
        await host.close()
