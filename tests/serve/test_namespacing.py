"""Model namespacing (tritonserver's ``--model-namespacing``) in the model controller, without Ray: a name
in several repositories is a model in each, an ensemble runs the copy of its own repository, the plain
name of such a model is ambiguous, and the resolution follows copies that come and go (POLL and
EXPLICIT), over a recording deployer and real repositories on disk."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from deployments.control import ModelController
from deployments.control.listing import list_repositories, namespaces
from repository_loader.errors import InvalidArgument, NotFound
from tests.serve.test_control import RecordingDeployer, add_ensemble, add_model, controller

AMBIGUOUS = r"There are 2 identifiers of model 'composing' in global map, .* to resolve ambiguity"


@pytest.fixture
def repos(tmp_path: Path) -> tuple[Path, Path]:
    """Triton's ``test_duplication`` layout: each repository has an ensemble running ``composing``,
    which both repositories have."""
    first, second = tmp_path / "addsub_repo", tmp_path / "subadd_repo"
    for repo, ensemble in ((first, "simple_addsub"), (second, "simple_subadd")):
        add_model(repo, "composing")
        add_ensemble(repo, ensemble, "composing")
    return first, second


def steps(d: RecordingDeployer, ensemble: str) -> list[str]:
    return [s.model_name for s in d.deployed[ensemble].ensemble_steps]


def index(c: ModelController) -> list[tuple[str, str]]:
    return sorted((r["name"], r.get("state", "")) for r in asyncio.run(c.index()))


def test_without_namespacing_a_name_in_two_repositories_is_an_error_for_it(repos: tuple[Path, Path]) -> None:
    c, d = controller(list(repos), exit_on_error=False)
    asyncio.run(c.start())
    assert "composing" not in d.deployed and c.entries["composing"].state.value == "UNAVAILABLE"


def test_each_copy_is_a_model_and_each_ensemble_runs_its_own(repos: tuple[Path, Path]) -> None:
    c, d = controller(list(repos), model_namespacing=True)
    asyncio.run(c.start())
    assert sorted(d.deployed) == [
        "composing@addsub_repo",
        "composing@subadd_repo",
        "simple_addsub",
        "simple_subadd",
    ]
    assert steps(d, "simple_addsub") == ["composing@addsub_repo"]
    assert steps(d, "simple_subadd") == ["composing@subadd_repo"]
    # each copy is read from its own folder and keeps its name where a model or client sees it
    copy = d.deployed["composing@subadd_repo"]
    assert copy.path == repos[1] / "composing" and copy.folder_name == "composing"
    # the plain name is ambiguous; the others are found as they are
    with pytest.raises(InvalidArgument, match=AMBIGUOUS):
        c.get("composing")
    assert c.describe("simple_addsub").name == "simple_addsub"
    with pytest.raises(NotFound):
        c.get("nothing")
    # the index lists the model once per repository, by its name
    assert index(c) == [
        ("composing", "READY"),
        ("composing", "READY"),
        ("simple_addsub", "READY"),
        ("simple_subadd", "READY"),
    ]


def test_a_name_in_one_repository_keeps_its_name(tmp_path: Path) -> None:
    """Triton's ``test_no_duplication``: with namespacing on and no name twice, nothing changes."""
    first, second = tmp_path / "one", tmp_path / "two"
    add_model(first, "composing_addsub")
    add_ensemble(first, "simple_addsub", "composing_addsub")
    add_model(second, "composing_subadd")
    add_ensemble(second, "simple_subadd", "composing_addsub")  # a step of the other repository
    c, d = controller([first, second], model_namespacing=True)
    asyncio.run(c.start())
    assert sorted(d.deployed) == ["composing_addsub", "composing_subadd", "simple_addsub", "simple_subadd"]
    assert steps(d, "simple_subadd") == ["composing_addsub"]


def test_explicit_load_of_an_ambiguous_name_loads_every_copy(tmp_path: Path) -> None:
    """Triton's ``test_ensemble_duplication``: both repositories have an ensemble of one name."""
    first, second = tmp_path / "addsub_repo", tmp_path / "subadd_repo"
    add_model(first, "composing_addsub")
    add_ensemble(first, "simple_ensemble", "composing_addsub")
    add_model(second, "composing_subadd")
    add_ensemble(second, "simple_ensemble", "composing_subadd")
    c, d = controller([first, second], model_namespacing=True, model_control_mode="explicit")

    async def scenario() -> None:
        await c.start()
        assert d.deployed == {}
        with pytest.raises(NotFound):  # nothing of that name is known yet
            c.get("simple_ensemble")
        await c.load("simple_ensemble")
        assert sorted(d.deployed) == [
            "composing_addsub",
            "composing_subadd",
            "simple_ensemble@addsub_repo",
            "simple_ensemble@subadd_repo",
        ]
        assert steps(d, "simple_ensemble@subadd_repo") == ["composing_subadd"]
        with pytest.raises(InvalidArgument, match="ambiguity"):
            c.get("simple_ensemble")
        await c.unload("simple_ensemble")  # every copy, as Triton unloads them
        assert sorted(d.deployed) == ["composing_addsub", "composing_subadd"]

    asyncio.run(scenario())


def test_poll_follows_a_copy_that_leaves_and_comes_back(repos: tuple[Path, Path]) -> None:
    """Triton's ``test_dynamic_resolution`` in POLL mode."""
    c, d = controller(list(repos), model_namespacing=True, model_control_mode="poll")
    moved = repos[0].parent / "composing"

    async def scenario() -> None:
        await c.start()
        shutil.move(repos[0] / "composing", moved)  # only the second repository has it now
        await c.poll()
        assert sorted(d.deployed) == ["composing", "simple_addsub", "simple_subadd"]
        assert steps(d, "simple_addsub") == steps(d, "simple_subadd") == ["composing"]
        assert c.describe("composing").path == repos[1] / "composing"
        # make before break: the ensembles run the model under its new key before the old key goes
        calls = d.calls[-6:]
        assert calls.index(("reload", "simple_subadd")) < calls.index(("delete", "composing@subadd_repo"))
        assert calls.index(("deploy", "composing")) < calls.index(("reload", "simple_addsub"))
        shutil.move(moved, repos[0] / "composing")
        await c.poll()
        assert steps(d, "simple_addsub") == ["composing@addsub_repo"]
        assert steps(d, "simple_subadd") == ["composing@subadd_repo"]
        assert "composing" not in d.deployed and "composing" not in c.entries
        with pytest.raises(InvalidArgument, match=AMBIGUOUS):
            c.get("composing")
        await c.stop()

    asyncio.run(scenario())


def test_explicit_load_moves_a_loaded_copy_to_its_key(repos: tuple[Path, Path]) -> None:
    """Triton's ``test_dynamic_resolution`` in EXPLICIT mode: the model loaded while its name was in
    one repository goes on under its repository's key once the name is in two; the ensemble that runs
    it follows, though only the other ensemble was loaded again."""
    c, d = controller(list(repos), model_namespacing=True, model_control_mode="explicit")
    moved = repos[0].parent / "composing"

    async def scenario() -> None:
        await c.start()
        shutil.move(repos[0] / "composing", moved)
        await c.load("simple_addsub")
        await c.load("simple_subadd")
        assert steps(d, "simple_addsub") == steps(d, "simple_subadd") == ["composing"]
        shutil.move(moved, repos[0] / "composing")
        await c.load("simple_addsub")
        assert steps(d, "simple_addsub") == ["composing@addsub_repo"]
        assert steps(d, "simple_subadd") == ["composing@subadd_repo"]
        assert sorted(d.deployed) == [
            "composing@addsub_repo",
            "composing@subadd_repo",
            "simple_addsub",
            "simple_subadd",
        ]
        with pytest.raises(InvalidArgument, match=AMBIGUOUS):
            c.get("composing")

    asyncio.run(scenario())


def test_a_step_may_name_its_model_namespace(repos: tuple[Path, Path]) -> None:
    config = repos[0] / "simple_addsub" / "config.pbtxt"
    config.write_text(
        config.read_text().replace("model_version: -1", 'model_version: -1 model_namespace: "subadd_repo"')
    )
    c, d = controller(list(repos), model_namespacing=True)
    asyncio.run(c.start())
    assert steps(d, "simple_addsub") == ["composing@subadd_repo"]
    config.write_text(config.read_text().replace('"subadd_repo"', f'"{repos[1]}"'))  # its path
    assert c._read("simple_addsub", str(repos[0])).ensemble_steps[0].model_name == "composing@subadd_repo"
    config.write_text(config.read_text().replace(f'"{repos[1]}"', '"elsewhere"'))
    with pytest.raises(InvalidArgument, match="no model 'composing' in the model namespace 'elsewhere'"):
        c._read("simple_addsub", str(repos[0]))


def test_an_ensemble_whose_step_is_only_in_other_repositories_twice_is_ambiguous(tmp_path: Path) -> None:
    first, second, third = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    add_model(first, "composing")
    add_model(second, "composing")
    add_ensemble(third, "pipeline", "composing")
    c, d = controller([first, second, third], model_namespacing=True, exit_on_error=False)
    asyncio.run(c.start())
    assert "pipeline" not in d.deployed and "ambiguity" in c.entries["pipeline"].reason


def test_namespaces_are_unique_where_repositories_end_alike() -> None:
    assert namespaces(["/x/models", "/y/models", "s3://b/other/"]) == {
        "/x/models": "models-0",
        "/y/models": "models-1",
        "s3://b/other/": "other",
    }


def test_the_listing_keys_a_copy_by_its_repository(repos: tuple[Path, Path]) -> None:
    listing = list_repositories([str(r) for r in repos], namespacing=True)
    assert listing.keys_of("composing") == ["composing@addsub_repo", "composing@subadd_repo"]
    assert listing.key_of("composing", str(repos[1])) == "composing@subadd_repo"
    assert listing.key_of("simple_addsub", str(repos[1])) is None and listing.duplicates == {}
    assert list_repositories([str(r) for r in repos]).duplicates == {"composing": [str(r) for r in repos]}


def test_without_namespacing_a_steps_model_namespace_is_ignored_and_said(
    repos: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    config = repos[0] / "simple_addsub" / "config.pbtxt"
    config.write_text(
        config.read_text().replace("model_version: -1", 'model_version: -1 model_namespace: "x"')
    )
    shutil.rmtree(repos[1] / "composing")  # one copy: without namespacing the name is not a duplicate
    c, _ = controller(list(repos))
    assert c._read("simple_addsub", str(repos[0])).ensemble_steps[0].model_name == "composing"
    assert "names model namespace 'x', which is ignored" in caplog.text


def test_a_folder_whose_name_has_the_keys_mark_is_its_own_model(repos: tuple[Path, Path]) -> None:
    """``name@x`` is a valid folder name: it is that model's name, not a copy of ``name``."""
    add_model(repos[0], "odd@name")
    c, d = controller(list(repos), model_namespacing=True, model_control_mode="poll")

    async def scenario() -> None:
        await c.start()
        assert "odd@name" in d.deployed and d.deployed["odd@name"].folder_name == "odd@name"
        with pytest.raises(NotFound):
            c.describe("odd")
        (repos[0] / "odd@name" / "config.pbtxt").write_text(
            (repos[0] / "odd@name" / "config.pbtxt")
            .read_text()
            .replace("max_batch_size: 8", "max_batch_size: 4")
        )
        assert await c.poll() == ["odd@name"] and d.deployed["odd@name"].max_batch_size == 4
        await c.stop()

    asyncio.run(scenario())
    assert ("odd@name", "READY") in index(c)
