"""Python-based backends: ``backend: "<name>"`` runs ``<backend directory>/<name>/model.py`` on the
Python backend, as Triton does (its python_based_backends docs), with the model's own folders for data."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from deployments.backends.registry import create_backend
from repository_loader import ModelLoadError, load_model, load_repository
from tests.backends.helpers import context, request

# a backend directory holding the Python-based backend ``add_sub``: adds or subtracts, as the model's own
# model.json says; it completes the model's configuration and reads its version folder through
# pb_utils.get_model_dir()
BACKENDS = Path(__file__).parent / "python_backends"


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """The backend directory and a repository of two models on its ``add_sub`` (no model.py in their
    version folders: only each one's model.json)."""
    backends, repo = BACKENDS, tmp_path / "models"
    for name, operation in (("add", "add"), ("sub", "sub")):
        version = repo / name / "1"
        version.mkdir(parents=True)
        (version / "model.json").write_text(json.dumps({"operation": operation}))
        (repo / name / "config.pbtxt").write_text('backend: "add_sub"\n')
    return backends, repo


def test_the_loader_runs_the_backend_directorys_model_py_and_fills_in_runtime(
    layout: tuple[Path, Path],
) -> None:
    backends, repo = layout
    model = load_model(repo, "add", backend_directory=backends)
    assert model.backend == "add_sub" and model.kind == "python"
    assert model.python_runtime == str(backends / "add_sub" / "model.py")
    assert model.config_json["runtime"] == "model.py"  # as Triton reports a Python-based backend's model
    # completed by the backend's auto_complete_config
    assert [t.name for t in model.inputs] == ["INPUT0", "INPUT1"]
    assert [t.name for t in model.outputs] == ["OUTPUT"]


def test_a_repository_of_python_based_models_loads(layout: tuple[Path, Path]) -> None:
    backends, repo = layout
    state = load_repository(repo, backend_directory=backends)
    assert not state.failed and {m.kind for m in state.models.values()} == {"python"}


def test_auto_complete_config_reads_the_models_own_folder(layout: tuple[Path, Path]) -> None:
    backends, repo = layout
    assert load_model(repo, "add", backend_directory=backends).max_batch_size == 0
    (repo / "add" / "1" / "model.json").write_text(json.dumps({"operation": "add", "batching": True}))
    assert load_model(repo, "add", backend_directory=backends).max_batch_size == 8


def test_without_the_backend_the_model_fails_naming_the_backend_directory(layout: tuple[Path, Path]) -> None:
    _, repo = layout
    state = load_repository(repo, backend_directory=repo.parent / "elsewhere")
    assert set(state.failed) == {"add", "sub"}
    assert "unknown backend 'add_sub'" in state.failed["add"][0]
    assert "add_sub/model.py in the backend directory" in state.failed["add"][0]


def test_a_python_runtime_the_backend_directory_lacks_is_refused(layout: tuple[Path, Path]) -> None:
    backends, repo = layout
    (repo / "add" / "config.pbtxt").write_text('backend: "add_sub"\nruntime: "other.py"\n')
    with pytest.raises(ModelLoadError) as caught:
        load_model(repo, "add", backend_directory=backends)
    assert f"no 'other.py' in '{backends}/add_sub'" in "; ".join(caught.value.errors)


def test_models_of_one_backend_run_it_each_with_its_own_folder(layout: tuple[Path, Path]) -> None:
    backends, repo = layout
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 10, dtype=np.float32)

    async def infer(name: str) -> np.ndarray:
        model = load_model(repo, name, backend_directory=backends)
        backend = create_backend(context(model))
        backend.load()
        try:
            (response,) = await backend.execute([request(name, INPUT0=a, INPUT1=b)])
            assert response.error is None
            return response.outputs["OUTPUT"]
        finally:
            backend.unload()

    np.testing.assert_array_equal(asyncio.run(infer("add")), a + b)
    np.testing.assert_array_equal(asyncio.run(infer("sub")), a - b)


def test_validate_names_the_python_based_backend(layout: tuple[Path, Path]) -> None:
    import io

    from deployments.cli import build_parser, run_validate

    backends, repo = layout
    out = io.StringIO()
    args = build_parser().parse_args(["validate", str(repo), "--backend-directory", str(backends)])
    assert run_validate(args, out) == 0
    assert (
        f"OK    add  version 1  [add_sub: Python-based backend {backends}/add_sub/model.py" in out.getvalue()
    )
