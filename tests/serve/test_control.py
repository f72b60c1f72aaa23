"""The model controller without Ray: control modes, the repository API's rules, POLL's change detection,
and the two-phase reload board, over a recording deployer and real repositories on disk."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from deployments.control import ModelController
from deployments.serve.reloads import ReloadBoard, follow
from deployments.serve.server_api import ServerClient
from deployments.settings import ServerSettings
from repository_loader.errors import InvalidArgument, NoAvailableVersion, NotFound, ServerError, Unavailable
from repository_loader.model import ModelDescription

MODEL_PY = textwrap.dedent(
    """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse(output_tensors=[]) for _ in requests]
    """
)


def _config(name: str, extra: str = "") -> str:
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n" + extra
    )


def add_model(repo: Path, name: str, versions: tuple[int, ...] = (1,), extra: str = "") -> Path:
    folder = repo / name
    for v in versions:
        (folder / str(v)).mkdir(parents=True, exist_ok=True)
        (folder / str(v) / "model.py").write_text(MODEL_PY)
    (folder / "config.pbtxt").write_text(_config(name, extra))
    return folder


def add_ensemble(repo: Path, name: str, step: str, keys: tuple[str, str] = ("INPUT0", "OUTPUT0")) -> None:
    """An ensemble of one step; ``keys`` are the step model's input and output (an ensemble's: IN, OUT)."""
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        "ensemble_scheduling { step [ { "
        f'model_name: "{step}" model_version: -1 '
        f'input_map {{ key: "{keys[0]}" value: "IN" }} output_map {{ key: "{keys[1]}" value: "OUT" }} }} ] }}\n'
    )


class RecordingDeployer:
    """Records what the controller asks for; ``fail`` names models whose deploy or reload fails."""

    def __init__(self) -> None:
        self.deployed: dict[str, ModelDescription] = {}
        self.calls: list[tuple[str, str]] = []
        self.fail: set[str] = set()
        self.lost: dict[str, str] = {}  # model -> why it has no running replica
        self.gpu_models: set[str] = set()  # models placed on GPUs
        self.kept_unloads: set[str] = set()  # the record a restart finds (the cluster's key-value store)

    def prepare(self, models: dict[str, ModelDescription]) -> None:
        pass

    async def deploy(self, model: ModelDescription) -> None:
        self.calls.append(("deploy", model.name))
        if model.name in self.fail:
            raise Unavailable(f"initialize() of '{model.name}' raised")
        self.deployed[model.name] = model

    async def reload(self, old: ModelDescription, new: ModelDescription) -> None:
        self.calls.append(("reload", new.name))
        if new.name in self.fail:
            raise Unavailable("the new version failed to load")
        self.deployed[new.name] = new

    async def delete(self, name: str) -> None:
        self.calls.append(("delete", name))
        self.deployed.pop(name, None)

    def needs_gpu(self, model: ModelDescription) -> bool:
        return model.name in self.gpu_models

    async def running(self) -> dict[str, ModelDescription]:
        return dict(getattr(self, "already_running", {}))

    async def unserved(self) -> dict[str, str]:
        return dict(self.lost)

    async def unloaded(self) -> set[str]:
        return set(self.kept_unloads)

    async def record_unloaded(self, name: str, unloaded: bool) -> None:
        if unloaded:
            self.kept_unloads.add(name)
        else:
            self.kept_unloads.discard(name)


def controller(repos: list[Path], **args: Any) -> tuple[ModelController, RecordingDeployer]:
    settings = ServerSettings.from_args({"model_repository": [str(r) for r in repos], **args}, {})
    deployer = RecordingDeployer()
    return ModelController(settings, deployer), deployer


def states(c: ModelController) -> dict[str, str]:
    return {row["name"]: row.get("state", "") for row in c.index_rows()}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    add_model(root, "a")
    add_model(root, "b")
    return root


def test_none_mode_loads_everything_and_refuses_the_api(repo: Path) -> None:
    c, d = controller([repo])
    asyncio.run(c.start())
    assert states(c) == {"a": "READY", "b": "READY"} and c.ready() and c.live()
    with pytest.raises(Unavailable, match="not allowed"):
        asyncio.run(c.load("a"))


def test_models_placed_on_gpus_are_deployed_before_the_others_at_start(repo: Path) -> None:
    add_model(repo, "c")
    c, d = controller([repo])
    d.gpu_models = {"c"}
    asyncio.run(c.start())
    assert d.calls[0] == ("deploy", "c") and sorted(d.calls[1:]) == [("deploy", "a"), ("deploy", "b")]
    assert states(c) == {"a": "READY", "b": "READY", "c": "READY"}


def test_a_loaded_model_without_a_running_replica_is_unavailable_in_the_index_until_one_runs(
    repo: Path,
) -> None:
    c, d = controller([repo])
    asyncio.run(c.start())
    d.lost["a"] = "no running replica: 1 waiting for resources {'GPU': 1.0}"
    rows = {r["name"]: r for r in asyncio.run(c.index())}
    assert rows["a"]["state"] == "UNAVAILABLE" and "waiting for resources" in rows["a"]["reason"]
    assert rows["b"]["state"] == "READY"
    assert [r["name"] for r in asyncio.run(c.index(ready_only=True))] == ["b"]
    d.lost.clear()  # its replica runs again: nothing to reload
    assert asyncio.run(c.index())[0] == {"name": "a", "version": "1", "state": "READY"}
    assert d.calls == [("deploy", "a"), ("deploy", "b")]


def test_a_model_its_replicas_cannot_load_again_is_unavailable_and_the_server_not_ready(repo: Path) -> None:
    """Its folder deleted, its replica restarted: the replica's pushes carry the load error."""
    c, _ = controller([repo])
    asyncio.run(c.start())
    c.replica_loaded("a", "replica-1", "model 'a' failed to initialize: no model.py")
    rows = {r["name"]: r for r in asyncio.run(c.index())}
    assert rows["a"]["state"] == "UNAVAILABLE" and "failed to load it again" in rows["a"]["reason"]
    assert "no model.py" in rows["a"]["reason"] and rows["b"]["state"] == "READY"
    assert not c.ready()
    c.replica_loaded("a", "replica-2", None)  # a replica that serves it again
    assert asyncio.run(c.index())[0] == {"name": "a", "version": "1", "state": "READY"} and c.ready()


def test_explicit_mode_loads_the_named_models_and_lists_the_rest_by_name(repo: Path) -> None:
    c, _ = controller([repo], model_control_mode="explicit", load_model=["a"])
    asyncio.run(c.start())
    assert asyncio.run(c.index()) == [{"name": "a", "version": "1", "state": "READY"}, {"name": "b"}]
    assert c.ready()


def test_a_restarted_controller_keeps_the_models_still_running_and_can_unload_them(repo: Path) -> None:
    first, d = controller([repo], model_control_mode="explicit", load_model=["a"])
    asyncio.run(first.start())
    asyncio.run(first.load("b"))  # through the repository API, then the server application restarts
    c, d = controller([repo], model_control_mode="explicit", load_model=["a"])
    d.already_running = {"b": first.entries["b"].model}  # type: ignore[attr-defined]
    asyncio.run(c.start())
    assert asyncio.run(c.index()) == [
        {"name": "a", "version": "1", "state": "READY"},
        {"name": "b", "version": "1", "state": "READY"},
    ]
    assert d.calls == [("deploy", "a")]  # b keeps its running replicas
    asyncio.run(c.unload("b"))
    assert d.calls[-1] == ("delete", "b") and states(c)["b"] == "UNAVAILABLE"


def test_a_restarted_controller_adopts_a_start_model_running_as_it_is_described_now(repo: Path) -> None:
    """A start model redeployed on a restart of the server application would have its replicas
    restarted; one running as the repository describes it now keeps them. A changed one is deployed."""
    first, _ = controller([repo], model_control_mode="explicit", load_model=["a", "b"])
    asyncio.run(first.start())
    c, d = controller([repo], model_control_mode="explicit", load_model=["a", "b"])
    running = {"a": first.entries["a"].model, "b": first.entries["b"].model}
    d.already_running = running  # type: ignore[attr-defined]
    add_model(repo, "b", versions=(1, 2))  # b changed while the server application was down
    asyncio.run(c.start())
    assert states(c) == {"a": "READY", "b": "READY"} and c.ready() and c.restarted
    assert d.calls == [("deploy", "b")]  # a keeps its running replicas


def test_a_restart_with_a_failing_start_model_keeps_what_runs(repo: Path) -> None:
    """exit_on_error fails a fresh start; a restart that finds models running logs the failure instead of
    failing (the server application would otherwise tear every model down and restart forever)."""
    first, _ = controller([repo], model_control_mode="explicit", load_model=["a"])
    asyncio.run(first.start())
    asyncio.run(first.load("b"))
    c, d = controller([repo], model_control_mode="explicit", load_model=["a"])
    d.already_running = {"b": first.entries["b"].model}  # type: ignore[attr-defined]
    d.fail = {"a"}
    asyncio.run(c.start())  # no raise
    assert states(c) == {"a": "UNAVAILABLE", "b": "READY"} and ("delete", "b") not in d.calls
    fresh, d2 = controller([repo], model_control_mode="explicit", load_model=["a"])
    d2.fail = {"a"}
    with pytest.raises(Unavailable, match="exit_on_error"):
        asyncio.run(fresh.start())


def test_the_index_reads_the_repository_again_at_each_call(repo: Path) -> None:
    c, d = controller([repo], model_control_mode="explicit", load_model=["a"])
    asyncio.run(c.start())
    add_model(repo, "late")  # added after start: Triton lists it by name at the next index call
    assert asyncio.run(c.index())[-1] == {"name": "late"} and d.calls == [("deploy", "a")]


def test_a_name_in_two_repositories_is_an_error_for_that_name(repo: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    add_model(other, "a")
    add_model(other, "c")
    c, _ = controller([repo, other], exit_on_error=False)
    asyncio.run(c.start())
    rows = {r["name"]: r for r in asyncio.run(c.index())}
    assert (
        rows["a"]["state"] == "UNAVAILABLE"
        and rows["a"]["reason"] == "model appears in two or more repositories"
    )
    assert rows["b"]["state"] == rows["c"]["state"] == "READY"
    assert not c.ready()  # strict readiness: a model asked for is not READY
    assert str(tmp_path) not in json.dumps(asyncio.run(c.index()))


def test_exit_on_error_fails_the_start_and_non_strict_readiness_ignores_models(repo: Path) -> None:
    (repo / "b" / "config.pbtxt").write_text(_config("b").replace("max_batch_size: 8", "max_batch_size: -3"))
    c, _ = controller([repo])
    with pytest.raises(Unavailable, match="exit_on_error"):
        asyncio.run(c.start())
    c, _ = controller([repo], exit_on_error=False, strict_readiness=False)
    asyncio.run(c.start())
    assert states(c)["b"] == "UNAVAILABLE" and c.ready()


@pytest.mark.parametrize(
    "broken",
    [
        pytest.param(lambda folder: (folder / "config.pbtxt").write_text("max_batch_size: [\n"), id="syntax"),
        pytest.param(lambda folder: (folder / "config.pbtxt").write_bytes(b"\xff\xfe"), id="not-text"),
        pytest.param(lambda folder: (folder / "config.pbtxt").unlink(), id="absent-strict"),
    ],
)
def test_a_configuration_that_cannot_be_read_leaves_its_model_unknown(repo: Path, broken: Any) -> None:
    # Triton's poll fails for it and never adds it to its model lifecycle: "is not found", not "has no
    # available versions"; the index lists the folder by name, with the reason
    broken(repo / "b")
    c, _ = controller([repo], exit_on_error=False, disable_auto_complete_config=True)
    asyncio.run(c.start())
    row = next(r for r in c.index_rows() if r["name"] == "b")
    assert "state" not in row and row["reason"], row
    with pytest.raises(NotFound, match="^Request for unknown model: 'b' is not found$"):
        c.get("b")
    assert c.ready()  # nothing asked for it that it could know of
    with pytest.raises(Unavailable, match="exit_on_error.*'b'"):
        asyncio.run(controller([repo], disable_auto_complete_config=True)[0].start())
    c, _ = controller(
        [repo], model_control_mode="explicit", exit_on_error=False, disable_auto_complete_config=True
    )
    asyncio.run(c.start())
    with pytest.raises(
        InvalidArgument, match="^failed to load 'b', failed to poll from model repository: b/"
    ):
        asyncio.run(c.load("b"))
    with pytest.raises(NotFound, match="is not found"):
        c.get("b")
    add_model(repo, "b")  # readable again: it loads, and is known
    asyncio.run(c.load("b"))
    assert states(c)["b"] == "READY" and "reason" not in next(r for r in c.index_rows() if r["name"] == "b")


def test_loading_an_unknown_or_invalid_name_records_nothing(repo: Path) -> None:
    c, d = controller([repo], model_control_mode="explicit")
    asyncio.run(c.start())
    before = asyncio.run(c.index())
    with pytest.raises(InvalidArgument, match="failed to poll from model repository") as err:
        asyncio.run(c.load("doesnotexist"))
    assert str(repo) not in err.value.message
    for bad in ("x" * 10_000, "../a", "a/b", ".hidden", ""):
        with pytest.raises(InvalidArgument, match="invalid model name"):
            asyncio.run(c.load(bad))
    assert asyncio.run(c.index()) == before and c.ready() and d.calls == []


def test_explicit_load_with_a_config_override_then_unload(repo: Path) -> None:
    c, d = controller([repo], model_control_mode="explicit")
    asyncio.run(c.start())
    override = json.loads(json.dumps({"name": "a", "backend": "python", "max_batch_size": 2}))
    override["input"] = [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}]
    override["output"] = [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]
    asyncio.run(c.load("a", {"config": json.dumps(override)}))
    assert d.deployed["a"].max_batch_size == 2
    asyncio.run(c.load("a"))  # again, the repository unchanged: the override serves on (Triton's)
    assert d.calls[-1] == ("deploy", "a") and d.deployed["a"].max_batch_size == 2
    (repo / "a" / "config.pbtxt").write_text(_config("a", "# edited\n"))
    asyncio.run(c.load("a"))  # again, the repository changed: a reload from it
    assert d.calls[-1] == ("reload", "a") and d.deployed["a"].max_batch_size == 8
    asyncio.run(c.unload("a"))
    assert asyncio.run(c.index())[0] == {
        "name": "a",
        "version": "1",
        "state": "UNAVAILABLE",
        "reason": "unloaded",
    }
    assert c.ready()  # an unloaded model is not asked for any more


def test_file_upload_is_refused_unless_allowed(repo: Path) -> None:
    params = {
        "config": json.dumps({"name": "up", "backend": "python", "max_batch_size": 0}),
        "file:1/model.py": base64.b64encode(MODEL_PY.encode()).decode(),
    }
    c, d = controller([repo], model_control_mode="explicit")
    asyncio.run(c.start())
    with pytest.raises(InvalidArgument, match="allow_model_file_upload"):
        asyncio.run(c.load("up", params))
    assert "up" not in states(c)
    c, d = controller([repo], model_control_mode="explicit", allow_model_file_upload=True)
    asyncio.run(c.start())
    with pytest.raises(InvalidArgument, match="file:<version>/<name>"):
        asyncio.run(c.load("up", {**params, "file:../../etc/passwd": "eA=="}))
    spec = {"name": "up", "backend": "python", "max_batch_size": 0}
    spec["input"] = [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}]
    spec["output"] = [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]
    asyncio.run(c.load("up", {**params, "config": json.dumps(spec)}))
    assert states(c)["up"] == "READY" and (d.deployed["up"].path / "1" / "model.py").read_text() == MODEL_PY
    asyncio.run(c.stop())
    assert not d.deployed["up"].path.exists()  # the uploaded files go with the controller


def test_loading_an_unchanged_model_again_leaves_it_serving_as_it_is(repo: Path) -> None:
    """Triton's L0_model_update counts initializations: a load with nothing changed runs none; a
    changed file or configuration reloads."""
    c, d = controller([repo], model_control_mode="explicit")
    asyncio.run(c.start())
    asyncio.run(c.load("a"))
    asyncio.run(c.load("a"))
    assert d.calls == [("deploy", "a")]
    with (repo / "a" / "1" / "model.py").open("a") as f:
        f.write("# changed\n")
    asyncio.run(c.load("a"))
    assert d.calls == [("deploy", "a"), ("reload", "a")]
    asyncio.run(c.load("a"))
    (repo / "a" / "config.pbtxt").write_text(
        _config("a", 'parameters { key: "k" value: { string_value: "v" } }\n')
    )
    asyncio.run(c.load("a"))
    assert d.calls == [("deploy", "a"), ("reload", "a"), ("reload", "a")]
    assert states(c)["a"] == "READY"


def test_a_failed_reload_keeps_the_serving_version(repo: Path) -> None:
    c, d = controller([repo], model_control_mode="explicit", load_model=["*"])
    asyncio.run(c.start())
    served = d.deployed["a"]
    (repo / "a" / "config.pbtxt").write_text(_config("a", "max_batch_size: -3\n"))
    with pytest.raises(InvalidArgument, match="load failed for model 'a': "):
        asyncio.run(c.load("a"))
    add_model(repo, "a", (1, 2))
    d.fail.add("a")
    with pytest.raises(InvalidArgument, match="the new version failed to load"):
        asyncio.run(c.load("a"))
    assert states(c)["a"] == "READY" and c.describe("a") is served and d.deployed["a"] is served


def test_an_ensemble_loads_its_steps_and_unload_dependents_unloads_them(repo: Path) -> None:
    add_ensemble(repo, "ens", "a")
    c, d = controller([repo], model_control_mode="explicit")
    asyncio.run(c.start())
    asyncio.run(c.load("ens"))
    assert [call for call in d.calls if call[0] == "deploy"] == [("deploy", "a"), ("deploy", "ens")]
    asyncio.run(c.unload("ens"))
    assert states(c) == {"a": "READY", "b": "", "ens": "UNAVAILABLE"}
    asyncio.run(c.load("ens"))
    asyncio.run(c.unload("ens", {"unload_dependents": True}))
    assert states(c) == {"a": "UNAVAILABLE", "b": "", "ens": "UNAVAILABLE"}


def test_unload_dependents_follows_nested_ensembles_and_keeps_what_another_ensemble_needs(repo: Path) -> None:
    add_ensemble(repo, "inner", "a")
    add_ensemble(repo, "outer", "inner", keys=("IN", "OUT"))
    add_ensemble(repo, "other", "a")
    c, d = controller([repo], model_control_mode="explicit")
    asyncio.run(c.start())
    asyncio.run(c.load("outer"))
    assert [n for kind, n in d.calls if kind == "deploy"] == ["a", "inner", "outer"]
    asyncio.run(c.load("other"))
    asyncio.run(c.unload("outer", {"unload_dependents": True}))
    assert states(c) == {
        "a": "READY",
        "b": "",
        "inner": "UNAVAILABLE",
        "other": "READY",
        "outer": "UNAVAILABLE",
    }


def test_unloading_a_step_unloads_the_ensembles_that_run_it(repo: Path) -> None:
    """Triton unloads the ensembles serving with a model as a step (nested ones too) when the model is
    unloaded; loading the model again does not bring them back."""
    add_ensemble(repo, "inner", "a")
    add_ensemble(repo, "outer", "inner", keys=("IN", "OUT"))
    add_ensemble(repo, "other", "b")
    c, _ = controller([repo], model_control_mode="explicit")
    asyncio.run(c.start())
    asyncio.run(c.load("outer"))
    asyncio.run(c.load("other"))
    asyncio.run(c.unload("a"))
    assert states(c) == {
        "a": "UNAVAILABLE",
        "b": "READY",
        "inner": "UNAVAILABLE",
        "other": "READY",
        "outer": "UNAVAILABLE",
    }
    asyncio.run(c.load("a"))
    assert states(c)["a"] == "READY" and states(c)["inner"] == states(c)["outer"] == "UNAVAILABLE"


def test_loads_and_unloads_log_tritons_lines(repo: Path, caplog: pytest.LogCaptureFixture) -> None:
    c, _ = controller([repo], model_control_mode="explicit")
    asyncio.run(c.start())
    with caplog.at_level("INFO", logger="deployments.control"):
        asyncio.run(c.load("a"))
        asyncio.run(c.unload("a"))
    lines = [r.getMessage() for r in caplog.records]
    assert lines.count("successfully loaded 'a'") == 1 and lines.count("successfully unloaded 'a'") == 1


def test_an_ensemble_may_run_a_model_of_another_repository(repo: Path, tmp_path: Path) -> None:
    """Triton's repositories share one model namespace: an ensemble of one runs a model of another,
    and loading the ensemble at start loads that model with it."""
    other = tmp_path / "other"
    add_ensemble(other, "ens", "a")
    c, d = controller([repo, other], model_control_mode="explicit", load_model=["ens"])
    asyncio.run(c.start())
    assert states(c) == {"a": "READY", "b": "", "ens": "READY"}
    assert [n for kind, n in d.calls if kind == "deploy"] == ["a", "ens"]


def test_unloading_a_step_while_its_ensemble_loads_leaves_both_unloaded(repo: Path) -> None:
    add_ensemble(repo, "ens", "a")
    c, d = controller([repo], model_control_mode="explicit")
    asyncio.run(c.start())
    started = asyncio.Event()

    async def slow_deploy(model: ModelDescription, real=d.deploy) -> None:  # type: ignore[no-untyped-def]
        if model.name == "ens":
            started.set()
            await asyncio.sleep(0.05)
        await real(model)

    d.deploy = slow_deploy  # type: ignore[method-assign]

    async def scenario() -> None:
        load = asyncio.create_task(c.load("ens"))
        await started.wait()  # the step is loaded, the ensemble is loading
        await c.unload("a")
        await load

    asyncio.run(scenario())
    assert states(c) == {"a": "UNAVAILABLE", "b": "", "ens": "UNAVAILABLE"}


def test_a_load_with_an_invalid_file_parameter_names_the_load(repo: Path) -> None:
    c, _ = controller([repo], model_control_mode="explicit", allow_model_file_upload=True)
    asyncio.run(c.start())
    files = {"file:../../root/x.txt": base64.b64encode(b"x").decode()}
    with pytest.raises(InvalidArgument, match="^failed to load 'new': invalid file parameter"):
        asyncio.run(c.load("new", {"config": json.dumps({"backend": "identity"}), **files}))
    good = {"file:1/model.py": base64.b64encode(MODEL_PY.encode()).decode()}
    with pytest.raises(InvalidArgument, match="^failed to load 'a', failed to poll from model repository: "):
        asyncio.run(c.load("a", good))  # files need a configuration


def test_at_start_a_nested_ensemble_loads_before_the_ensemble_that_runs_it(repo: Path) -> None:
    add_ensemble(repo, "z_inner", "a")  # sorts after the ensemble that runs it
    add_ensemble(repo, "a_outer", "z_inner", keys=("IN", "OUT"))
    c, d = controller([repo])
    asyncio.run(c.start())
    deployed = [n for kind, n in d.calls if kind == "deploy"]
    assert deployed.index("z_inner") < deployed.index("a_outer")
    assert states(c) == {"a": "READY", "a_outer": "READY", "b": "READY", "z_inner": "READY"}


def test_poll_picks_up_each_kind_of_change(repo: Path) -> None:
    c, d = controller([repo], model_control_mode="poll")

    async def scenario() -> None:
        await c.start()
        assert await c.poll() == []
        add_model(repo, "c")  # a new model folder
        assert await c.poll() == ["c"] and states(c)["c"] == "READY"
        add_model(repo, "a", (1, 2))  # a new version folder (latest policy: 2 replaces 1)
        assert await c.poll() == ["a"] and d.deployed["a"].versions == (2,)
        shutil.rmtree(repo / "a" / "2")  # a removed version folder
        assert await c.poll() == ["a"] and d.deployed["a"].versions == (1,)
        (repo / "b" / "config.pbtxt").write_text(
            _config("b").replace("max_batch_size: 8", "max_batch_size: 4")
        )
        assert await c.poll() == ["b"] and d.deployed["b"].max_batch_size == 4  # an edited config
        (repo / "c" / "1" / "model.py").write_text(MODEL_PY + "\n# v2\n")  # a changed model file
        assert await c.poll() == ["c"] and d.calls[-1] == ("reload", "c")
        shutil.rmtree(repo / "c")  # a removed model folder
        assert await c.poll() == ["c"] and "c" not in states(c) and "c" not in d.deployed
        (repo / "b" / "config.pbtxt").write_text(_config("b", "max_batch_size: -3\n"))
        await c.poll()  # a broken edit: the served version stays
        assert states(c)["b"] == "READY" and d.deployed["b"].max_batch_size == 4
        await c.stop()

    asyncio.run(scenario())
    reloads = [n for kind, n in d.calls if kind == "reload"]
    assert reloads == ["a", "a", "b", "c"]


def test_an_unloaded_model_whose_folder_is_deleted_leaves_the_index_at_once(repo: Path) -> None:
    """The index reads the repositories at each call: an unloaded model whose folder was removed is
    not listed, whether or not a load or poll has read the repositories since."""
    c, _ = controller([repo], model_control_mode="explicit")

    async def scenario() -> None:
        await c.start()
        await c.load("a")
        await c.unload("a")
        assert {r["name"]: r.get("reason") for r in await c.index()}["a"] == "unloaded"
        shutil.rmtree(repo / "a")
        first = [r["name"] for r in await c.index()]
        await c.load("b")  # reads the repositories again
        assert first == [r["name"] for r in await c.index()] == ["b"]
        with pytest.raises(NoAvailableVersion):  # still known: unloaded
            c.get("a")

    asyncio.run(scenario())


def test_a_model_known_without_a_ready_version_says_so_as_triton_does(repo: Path) -> None:
    """A model that left the repository (POLL), was unloaded or failed to load stays known: its requests
    get Triton's NOT_FOUND "has no available versions", a name never known "is not found"."""
    (repo / "c" / "1").mkdir(parents=True)
    (repo / "c" / "config.pbtxt").write_text(_config("c", 'default_model_filename: "absent.py"\n'))
    c, _ = controller([repo], model_control_mode="poll", exit_on_error=False)

    async def scenario() -> None:
        await c.start()
        shutil.rmtree(repo / "a")
        assert await c.poll() == ["a"]
        for name in ("a", "c"):  # left the repository; failed to load
            with pytest.raises(NoAvailableVersion) as err:
                c.get(name)
            assert err.value.message == f"Request for unknown model: '{name}' has no available versions"
            assert err.value.http_status == NotFound("").http_status
        with pytest.raises(NotFound, match="Request for unknown model: 'nope' is not found"):
            c.get("nope")
        # the index lists the repository's models: the one that left is not there any more
        assert [r["name"] for r in await c.index()] == ["b", "c"]
        add_model(repo, "a")
        assert await c.poll() == ["a"] and states(c)["a"] == "READY"
        await c.stop()

    asyncio.run(scenario())


def test_an_explicit_load_that_fails_answers_as_triton(repo: Path) -> None:
    """A model of the repository that does not load: Triton's "load failed for model"; a name in no
    repository: "failed to poll from model repository"."""
    shutil.rmtree(repo / "a" / "1")
    (repo / "a" / "1").mkdir()
    c, d = controller([repo], model_control_mode="explicit")
    asyncio.run(c.start())
    with pytest.raises(InvalidArgument) as err:
        asyncio.run(c.load("a"))  # its model file is gone
    assert err.value.message.startswith("load failed for model 'a': ")
    d.fail.add("b")
    with pytest.raises(InvalidArgument, match="^load failed for model 'b': "):
        asyncio.run(c.load("b"))  # it fails to deploy
    with pytest.raises(InvalidArgument, match="^failed to load 'x', failed to poll from model repository$"):
        asyncio.run(c.load("x"))


def test_a_version_a_reload_drops_stays_known_to_the_replicas(repo: Path) -> None:
    """Triton keeps a version it served known after a reload drops it: the new description names it."""
    add_model(repo, "v", (1, 2, 3), extra="version_policy: { all { } }\n")
    c, d = controller([repo], model_control_mode="poll")

    async def scenario() -> None:
        await c.start()
        shutil.rmtree(repo / "v" / "1")
        assert await c.poll() == ["v"]
        assert d.deployed["v"].versions == (2, 3) and d.deployed["v"].retired_versions == (1,)
        shutil.rmtree(repo / "v" / "2")
        (repo / "v" / "1").mkdir()
        (repo / "v" / "1" / "model.py").write_text(MODEL_PY)
        assert await c.poll() == ["v"]
        assert d.deployed["v"].versions == (1, 3) and d.deployed["v"].retired_versions == (2,)
        await c.stop()

    asyncio.run(scenario())


def test_unload_of_a_model_never_loaded_and_of_an_unknown_one(repo: Path) -> None:
    c, _ = controller([repo], model_control_mode="explicit")
    asyncio.run(c.start())
    asyncio.run(c.unload("a"))  # in the repository, not loaded: nothing to do
    asyncio.run(c.unload("nope"))  # in no repository: nothing to do either, as Triton answers
    assert states(c) == {"a": "", "b": ""}


def _override(name: str, batch: int) -> str:
    return json.dumps(
        {
            "name": name,
            "backend": "python",
            "max_batch_size": batch,
            "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        }
    )


def test_an_override_folder_lives_while_the_model_is_described_from_it(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    c, d = controller([repo], model_control_mode="explicit")

    def overlays() -> list[Path]:
        return sorted(p.resolve() for p in temp.glob("triton-serve-overrides-*/*"))

    def served() -> Path:
        return d.deployed["a"].path.parent.resolve()

    async def scenario() -> None:
        await c.start()
        await c.load("a", {"config": _override("a", 2)})
        first = served()
        assert overlays() == [first] and (first / "a" / "1" / "model.py").read_text() == MODEL_PY
        await c.load("a", {"config": _override("a", 4)})  # another override: the first one goes
        assert overlays() == [served()] and not first.exists()
        d.fail.add("a")
        with pytest.raises(InvalidArgument, match="the new version failed to load"):
            await c.load("a", {"config": _override("a", 6)})  # the serving override stays
        assert overlays() == [served()] and d.deployed["a"].max_batch_size == 4
        d.fail.clear()
        with pytest.raises(InvalidArgument, match="load failed for model 'a': "):
            await c.load("a", {"config": json.dumps({"name": "a", "max_batch_size": -3})})
        assert overlays() == [served()]
        await c.load("a")  # the repository's folder did not change: the override serves on
        assert overlays() == [served()] and d.deployed["a"].max_batch_size == 4
        (repo / "a" / "config.pbtxt").write_text(_config("a", "# edited\n"))
        await c.load("a")  # from the repository again: no override is left
        assert list(temp.iterdir()) == [] and d.deployed["a"].max_batch_size == 8
        await c.load("b", {"config": _override("b", 2)})
        assert len(overlays()) == 1
        await c.unload("b")
        assert list(temp.iterdir()) == []
        await c.load("b", {"config": _override("b", 2)})
        await c.stop()
        assert list(temp.iterdir()) == []

    asyncio.run(scenario())
    assert (repo / "a" / "1" / "model.py").read_text() == MODEL_PY  # the links went, not their targets


def test_a_load_that_waits_holds_up_no_other_models_action_nor_its_override_folder(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One model's deploy waits (its replicas find no resources): loads and unloads of other models
    go on meanwhile, a second action on the same model waits its turn, and the waiting load's
    override folder stays while other actions end."""
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    add_model(repo, "c")
    c, d = controller([repo], model_control_mode="explicit", load_model=["b"])

    async def scenario() -> None:
        await c.start()
        placed = asyncio.Event()
        deploy = d.deploy

        waiting = asyncio.Event()

        async def waiting_deploy(model: ModelDescription) -> None:
            if model.name == "a":
                waiting.set()
                await placed.wait()
            await deploy(model)

        d.deploy = waiting_deploy  # type: ignore[method-assign]
        slow = asyncio.create_task(c.load("a", {"config": _override("a", 2)}))
        await asyncio.wait_for(waiting.wait(), 5)  # a's deploy waits
        await asyncio.wait_for(c.load("c"), 5)  # another model: not behind a's load
        await asyncio.wait_for(c.unload("b"), 5)
        assert states(c)["c"] == "READY" and states(c)["b"] == "UNAVAILABLE"
        again = asyncio.create_task(c.unload("a"))  # the same model: after its load
        await asyncio.sleep(0.05)
        assert not slow.done() and not again.done()
        assert len(list(temp.glob("triton-serve-overrides-*/*"))) == 1  # a's override, still read
        placed.set()
        await asyncio.wait_for(slow, 5)
        await asyncio.wait_for(again, 5)
        assert d.calls.index(("deploy", "a")) < d.calls.index(("delete", "a"))  # in the order asked
        assert states(c)["a"] == "UNAVAILABLE" and "a" not in d.deployed
        assert list(temp.iterdir()) == []
        await c.stop()

    asyncio.run(scenario())


# --- the reload board: two phases across replicas ------------------------------------------------


class FakeReplica:
    def __init__(self, board: ReloadBoard, name: str, replica: str, fail: bool = False) -> None:
        self.board, self.name, self.replica, self.fail = board, name, replica, fail
        self.serving = "old"
        self.closed: list[str] = []
        self.described: list[int] = []  # the max_batch_size of each description taken
        self.world: list[int] = []  # ... and the model's replica count it came with

    def server(self) -> Any:
        board = self.board

        class Method:
            def __init__(self, fn: Any) -> None:
                self.remote = fn

        class Handle:
            reload_order = Method(lambda name, seen, timeout: board.wait(name, seen, timeout))
            reload_report = Method(board.report)

        return Handle()

    async def prepare(self, model: ModelDescription, composing: Any) -> str:
        await asyncio.sleep(0.01)
        if self.fail:
            raise ServerError("warmup 'w' failed")
        return f"v{model.max_batch_size}"

    async def commit(self, runtime: str) -> None:
        self.serving = runtime

    async def discard(self, runtime: str) -> None:
        self.closed.append(runtime)

    async def describe(self, model: ModelDescription, replicas: int) -> None:
        self.described.append(model.max_batch_size)
        self.world.append(replicas)

    def run(self) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(
            follow(
                self.name,
                self.replica,
                ServerClient(self.server()),
                self.prepare,
                self.commit,
                self.discard,
                self.describe,
                0.2,
            )
        )


async def _until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Until ``condition()`` holds (other tasks run meanwhile); fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.001)


def _model(repo: Path, batch: int) -> ModelDescription:
    from repository_loader import load_model

    (repo / "a" / "config.pbtxt").write_text(
        _config("a").replace("max_batch_size: 8", f"max_batch_size: {batch}")
    )
    return load_model(str(repo), "a")


def test_the_board_commits_when_every_replica_prepared_and_aborts_on_one_failure(repo: Path) -> None:
    async def scenario() -> None:
        board = ReloadBoard()
        replicas = [FakeReplica(board, "a", f"r{i}") for i in range(2)]
        tasks = [r.run() for r in replicas]
        await board.swap(_model(repo, 4), 2, 5.0)
        assert [r.serving for r in replicas] == ["v4", "v4"]
        replicas[1].fail = True
        with pytest.raises(Unavailable, match="warmup 'w' failed"):
            await board.swap(_model(repo, 2), 2, 5.0)
        await _until(lambda: replicas[0].closed == ["v2"])  # r0 prepared it, then took the abort
        assert [r.serving for r in replicas] == ["v4", "v4"]
        late = FakeReplica(board, "a", "r9")  # a replica Serve started later catches up
        tasks.append(late.run())
        await _until(lambda: late.serving == "v4")
        for t in tasks:
            t.cancel()

    asyncio.run(scenario())


def test_a_describe_order_reaches_every_replica_without_loading_anything(repo: Path) -> None:
    async def scenario() -> None:
        board = ReloadBoard()
        replicas = [FakeReplica(board, "a", f"r{i}") for i in range(2)]
        tasks = [r.run() for r in replicas]
        await board.describe(_model(repo, 4), 2, 5.0)  # returns once both took it
        assert [r.described for r in replicas] == [[4], [4]]
        assert [r.world for r in replicas] == [[2], [2]]  # a stateful model's ranks follow the count
        assert [r.serving for r in replicas] == ["old", "old"] and replicas[0].closed == []
        await board.swap(_model(repo, 2), 2, 5.0)  # a later reload still reaches them
        assert [r.serving for r in replicas] == ["v2", "v2"]
        for t in tasks:
            t.cancel()

    asyncio.run(scenario())


# --- Triton's restricted API on the HTTP front end --------------------------------------------------


def test_restricted_api_groups_need_their_header(tmp_path: Path) -> None:
    from deployments.protocol.http import ServerHTTPApp
    from deployments.settings import RestrictedApi, SettingsError
    from tests.protocol.fakes import FakeDataPlane, all_models
    from tests.protocol.test_http_app import call

    app = ServerHTTPApp(FakeDataPlane(all_models(tmp_path)))
    app.restricted = (RestrictedApi.parse("model-repository,statistics:Admin-Key=s3cret"),)

    async def scenario() -> None:
        refused = await call(app, "POST", "/v2/repository/index")
        assert refused is not None and refused.status == 403
        assert refused.json() == {"error": "This API is restricted, expecting header 'admin-key'"}
        wrong = await call(app, "GET", "/v2/models/stats", headers={"admin-key": "S3CRET"})
        assert wrong is not None and wrong.status == 403
        allowed = await call(app, "POST", "/v2/repository/index", headers={"Admin-Key": "s3cret"})
        assert allowed is not None and allowed.status == 200
        open_route = await call(app, "GET", "/v2/health/live")
        assert open_route is not None and open_route.status == 200

    asyncio.run(scenario())
    for bad in ("model-repository", "model-repository:key", "nope:k=v", ":k=v"):
        with pytest.raises(SettingsError):
            RestrictedApi.parse(bad)


def test_a_config_override_may_leave_object_keys_unquoted() -> None:
    # Triton reads the load API's config with protobuf's JSON parser, which takes bare keys
    # (L0_iterative_sequence's test_backlog_fill sends `direct: { ... }`); text in strings stays as sent
    from deployments.control.overlay import parse_overrides

    config, _ = parse_overrides(
        {"config": '{"sequence_batching": {"iterative_sequence": true, direct: {"x": "a, b: c"}}}'}, False
    )
    assert config == {"sequence_batching": {"iterative_sequence": True, "direct": {"x": "a, b: c"}}}
    with pytest.raises(InvalidArgument, match="failed to parse the 'config' parameter as JSON: Expecting"):
        parse_overrides({"config": '{"a": }'}, False)
