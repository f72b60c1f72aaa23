"""A reload keeps the loaded versions whose files and configuration did not change (as Triton reloads
only the versions whose files changed): a replica's new runtime takes them over instead of loading
them again, with real Python-backend models whose ``initialize`` and ``finalize`` leave a trace."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from deployments.runtime.model import ModelRuntime
from repository_loader.model import ModelDescription
from repository_loader.revision import version_signatures
from tests.backends.helpers import describe, request, spec

# answers its version; notes each initialize and finalize in the file its LOG parameter names
VERSIONED_PY = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.version = int(args["model_version"])
        self.log = json.loads(args["model_config"])["parameters"]["LOG"]["string_value"]
        self._note("init")

    def _note(self, what):
        with open(self.log, "a") as f:
            f.write(f"{what} {self.version}\\n")

    def execute(self, requests):
        out = np.array([self.version], dtype=np.int32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("V", out)]) for _ in requests]

    def finalize(self):
        self._note("finalize")
"""


def _model(tmp_path: Path, versions: tuple[int, ...], **changes: object) -> ModelDescription:
    folder = tmp_path / "versioned"
    for version in (1, 2, 3):
        (folder / str(version)).mkdir(parents=True, exist_ok=True)
        if not (folder / str(version) / "model.py").exists():
            (folder / str(version) / "model.py").write_text(VERSIONED_PY)
    model = describe(
        "versioned",
        folder,
        "python",
        [spec("X", "INT32", [1])],
        [spec("V", "INT32", [1])],
        parameters={"LOG": str(tmp_path / "events.log")},
    )
    return dataclasses.replace(model, versions=versions, **changes)  # type: ignore[arg-type]


def _events(tmp_path: Path) -> list[str]:
    log = tmp_path / "events.log"
    return log.read_text().splitlines() if log.exists() else []


async def _answer(runtime: ModelRuntime, version: str) -> int:
    response = await runtime.infer(
        dataclasses.replace(request("versioned", X=np.zeros(1, np.int32)), model_version=version)
    )
    assert response.error is None, response.error
    return int(response.outputs["V"].reshape(-1)[0])


def _touch(path: Path) -> None:
    later = path.stat().st_mtime + 10
    os.utime(path, (later, later))


async def _reload(old: ModelRuntime, model: ModelDescription) -> ModelRuntime:
    """What a replica does for a committed reload (``deployments.serve.model_app``)."""
    signatures = version_signatures(model)
    new = ModelRuntime(model, keep=old.reusable(model, signatures), signatures=signatures)
    await new.load()
    new.take_over(old)
    await old.close()
    return new


async def test_only_changed_and_new_versions_load_again(tmp_path: Path) -> None:
    old = ModelRuntime(_model(tmp_path, (1, 2)))
    await old.load()
    assert sorted(_events(tmp_path)) == ["init 1", "init 2"]
    kept = old.versions[1]
    _touch(tmp_path / "versioned" / "2" / "model.py")
    new = await _reload(old, _model(tmp_path, (1, 2, 3)))
    try:
        # version 1 served on as it was; version 2 (its file changed) and version 3 (new) loaded
        assert sorted(_events(tmp_path)) == ["finalize 2", "init 1", "init 2", "init 2", "init 3"]
        assert new.versions[1] is kept and kept.model is new.model
        assert [await _answer(new, v) for v in ("1", "2", "3")] == [1, 2, 3]
    finally:
        await new.close()
    assert sorted(_events(tmp_path)).count("finalize 1") == 1


async def test_a_version_the_policy_drops_is_finalized_and_the_others_kept(tmp_path: Path) -> None:
    old = ModelRuntime(_model(tmp_path, (1, 2, 3)))
    await old.load()
    new = await _reload(old, _model(tmp_path, (3,)))
    try:
        assert sorted(_events(tmp_path)) == ["finalize 1", "finalize 2", "init 1", "init 2", "init 3"]
        assert await _answer(new, "3") == 3
    finally:
        await new.close()


async def test_a_file_beside_the_versions_or_another_configuration_loads_every_version(
    tmp_path: Path,
) -> None:
    old = ModelRuntime(_model(tmp_path, (1, 2)))
    await old.load()
    (tmp_path / "versioned" / "dependency.py").write_text("X = 1\n")  # a change every version may read
    new = await _reload(old, _model(tmp_path, (1, 2)))
    assert sorted(_events(tmp_path)).count("init 1") == 2
    changed = _model(tmp_path, (1, 2), max_batch_size=4)  # the same files, another configuration
    assert new.reusable(changed, version_signatures(changed)) == {}
    newer = await _reload(new, changed)
    try:
        assert sorted(_events(tmp_path)).count("init 1") == 3
    finally:
        await newer.close()


async def test_a_reload_that_is_not_committed_leaves_the_kept_versions_serving(tmp_path: Path) -> None:
    old = ModelRuntime(_model(tmp_path, (1, 2)))
    await old.load()
    model = _model(tmp_path, (1, 2, 3))
    prepared = ModelRuntime(model, keep=old.reusable(model, version_signatures(model)))
    await prepared.load()
    await prepared.close()  # aborted: discarded without taking over
    try:
        assert sorted(_events(tmp_path)) == ["finalize 3", "init 1", "init 2", "init 3"]
        assert [await _answer(old, v) for v in ("1", "2")] == [1, 2]
    finally:
        await old.close()
