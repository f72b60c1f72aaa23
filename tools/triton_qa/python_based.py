"""``L0_backend_python``'s ``python_based_backends`` subset: test.sh's layout of a Python-based backend.

``test.sh`` copies ``qa/python_models/python_based_backends/add_sub_backend/model.py`` into the backend
directory as the backend ``add_sub``, writes two models on it (``add`` with versions 1 and 2, ``sub``)
that hold only a ``model.json`` naming the operation, copies the Python model ``add_sub`` as versions
1 and 2, and generates the TorchScript ``add_sub_pytorch`` with ``qa/common/gen_qa_pytorch_model.py``.
The run's ``--backend-directory`` names that folder; for tritonserver it also links its own Python
backend there (``python/``), where Triton looks for the stub a Python-based backend runs on.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

FOLDER = "python_based_backends"
REPOSITORY = f"{FOLDER}/models"  # the run's repository, relative to the suite's folder
BACKENDS = f"{FOLDER}/backends"  # the run's --backend-directory, relative to the suite's folder
_BACKEND_SOURCE = "python_models/python_based_backends/add_sub_backend/model.py"  # under qa/


def prepare(suite_dir: Path, build: Callable[[Any, Path], None]) -> None:
    """Lay out what test.sh adds beside the built repository (``add_sub`` version 1 is built)."""
    qa = suite_dir.parent
    repo, backends = suite_dir / REPOSITORY, suite_dir / BACKENDS
    shutil.rmtree(backends, ignore_errors=True)
    (backends / "add_sub").mkdir(parents=True)
    shutil.copy2(qa / _BACKEND_SOURCE, backends / "add_sub" / "model.py")
    link_python_backend(backends)
    for name, operation, versions in (("add", "add", ("1", "2")), ("sub", "sub", ("1",))):
        shutil.rmtree(repo / name, ignore_errors=True)
        for version in versions:
            (repo / name / version).mkdir(parents=True)
            (repo / name / version / "model.json").write_text(json.dumps({"operation": operation}) + "\n")
        (repo / name / "config.pbtxt").write_text('backend: "add_sub"\n')
    shutil.rmtree(repo / "add_sub" / "2", ignore_errors=True)
    shutil.copytree(repo / "add_sub" / "1", repo / "add_sub" / "2")
    shutil.rmtree(repo / "add_sub_pytorch", ignore_errors=True)
    subprocess.run(
        [sys.executable, str(qa / "common" / "gen_qa_pytorch_model.py"), "-m", str(repo)],
        check=True,
        capture_output=True,
    )


def link_python_backend(backends: Path) -> None:
    """Link the installed tritonserver's Python backend (``python -m bench.peers``) into ``backends``,
    where tritonserver looks for the stub a Python-based backend runs on (this server ignores it)."""
    from bench.peers import backend_directory

    found = backend_directory() / "python"
    if found.is_dir():
        (backends / "python").symlink_to(found, target_is_directory=True)
