"""``L0_model_namespacing``: two repositories with models of the same name, served with
``--model-namespacing=true`` in POLL and EXPLICIT mode.

``test.sh`` starts a server per test, each on a fresh copy of that test's two repositories
(``test_dir/addsub_repo`` and ``test_dir/subadd_repo``, a version folder added to every model), and the
test moves a model folder out of one repository and back while the server runs
(``NAMESPACE_TESTING_DIRCTORY``). The suite's Python models import the suite's own ``python_addsub`` /
``python_subadd`` from ``TRITON_QA_PYTHON_MODEL_DIR``, which the server's processes inherit.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from tools.triton_qa.suites import Model, Run, Suite, env, register

_TESTS = ("test_no_duplication", "test_duplication", "test_ensemble_duplication", "test_dynamic_resolution")
_ENV = env(
    TRITON_QA_ROOT_DIR="{qa}",
    TRITON_QA_PYTHON_MODEL_DIR="{qa}/L0_model_namespacing",
    NAMESPACE_TESTING_DIRCTORY="{qa}/L0_model_namespacing/test_dir",
    PYTHONDONTWRITEBYTECODE="1",  # a __pycache__ folder in a model's folder would be a change to POLL
)


def _layout(test: str) -> Callable[[Path, Callable[[Model, Path], None]], None]:
    """``test.sh``'s copy of the test's repositories to ``test_dir``, each model with a version folder."""

    def prepare(suite: Path, _build: Callable[[Model, Path], None]) -> None:
        target = suite / "test_dir"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(suite / test, target)
        for model in target.glob("*/*"):
            if model.is_dir():
                (model / "1").mkdir(exist_ok=True)

    return prepare


def _run(suite_class: str, mode: tuple[str, ...], test: str) -> Run:
    return Run(
        f"{suite_class}.{test}",
        "test.py",
        (),
        server_args=(
            "--model-namespacing=true",
            "--model-repository={qa}/L0_model_namespacing/test_dir/subadd_repo",
            *mode,
        ),
        env=_ENV,
        tests=(f"{suite_class}.{test}",),
        repository_at="test_dir/addsub_repo",
        prepare=_layout(test),
        timeout_s=300.0,
    )


L0_MODEL_NAMESPACING = Suite(
    "L0_model_namespacing",
    (
        *(
            _run("ModelNamespacePoll", ("--model-control-mode=poll", "--repository-poll-secs=2"), test)
            for test in _TESTS
        ),
        *(_run("ModelNamespaceExplicit", ("--model-control-mode=explicit",), test) for test in _TESTS),
    ),
)

register(L0_MODEL_NAMESPACING)
