"""The environment saved with a measurement: what counts as a local change to what was measured."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench import env


def _repository(root: Path) -> None:
    for name, text in {
        "deployments/code.py": "x = 1\n",
        "docs/measurements.md": "table\n",
        "README.md": "readme\n",
        "bench/results/overhead/results.json": "{}\n",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    for args in (
        ["init", "-q"],
        ["add", "."],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start"],
    ):
        subprocess.run(["git", *args], cwd=root, check=True)


def test_results_and_documentation_are_not_local_changes_but_code_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``bench summary`` rewrites the tables in the README and ``docs/measurements.md`` after each run:
    the next scenario of the same commit is not measured on changed code for that."""
    _repository(tmp_path)
    monkeypatch.setattr(env, "REPO_ROOT", tmp_path)
    assert not env.local_changes()
    for name in ("docs/measurements.md", "README.md", "bench/results/overhead/results.json"):
        (tmp_path / name).write_text("rewritten\n")
    assert not env.local_changes()
    assert env.environment()["git_dirty"] is False
    (tmp_path / "deployments/code.py").write_text("x = 2\n")
    assert env.local_changes() and env.environment()["git_dirty"] is True
