"""Each folder of tests/loader/broken is a repository breaking one rule; its model must fail with the expected message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repository_loader.repository import load_repository

BROKEN = Path(__file__).parent / "broken"
CASES = sorted(p.name for p in BROKEN.iterdir() if (p / "expected.json").is_file())


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 30


@pytest.mark.parametrize("case", CASES)
def test_broken_config_is_reported(case: str) -> None:
    expected = json.loads((BROKEN / case / "expected.json").read_text())
    state = load_repository(BROKEN / case, auto_complete=expected.get("auto_complete", True))
    model = expected["model"]
    assert model not in state.models
    errors = state.failed[model]
    assert any(expected["message"] in error for error in errors), errors
    # Every message names the model it is about.
    assert all(f"'{model}'" in error or error.startswith(f"{model}/") for error in errors), errors
