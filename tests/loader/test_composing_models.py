"""An ensemble's closure (``composing_models``): the models it needs, nested ensembles included."""

from __future__ import annotations

from pathlib import Path

from repository_loader.ensemble_rules import composing_models, reached
from repository_loader.model import EnsembleStep, ModelDescription


def _model(name: str, *steps: str) -> ModelDescription:
    return ModelDescription(
        name=name,
        path=Path("/models") / name,
        platform="ensemble" if steps else "",
        backend="" if steps else "python",
        max_batch_size=0,
        inputs=(),
        outputs=(),
        versions=(1,),
        ensemble_steps=tuple(EnsembleStep(s) for s in steps),
    )


def _table(*models: ModelDescription) -> dict[str, ModelDescription]:
    return {m.name: m for m in models}


def test_nested_ensembles_are_followed_and_each_model_is_listed_once() -> None:
    table = _table(_model("a"), _model("b"), _model("inner", "a", "b"), _model("outer", "inner", "a"))
    assert sorted(composing_models(table["outer"], table)) == ["a", "b", "inner"]
    assert composing_models(table["a"], table) == []


def test_a_name_not_known_is_listed_and_not_followed() -> None:
    table = _table(_model("a"), _model("outer", "missing", "a"))
    assert sorted(composing_models(table["outer"], table)) == ["a", "missing"]
    assert composing_models(table["outer"], lambda name: None) == ["a", "missing"]


def test_a_cycle_ends_the_walk() -> None:
    table = _table(_model("x", "y"), _model("y", "x"))
    assert composing_models(table["x"], table) == ["y", "x"]


def test_the_walk_meets_the_last_successor_first() -> None:
    edges = {"r": ["a", "b"], "a": ["c"], "b": ["c", "d"], "c": [], "d": []}
    assert reached(edges.__getitem__, ["r"]) == ["r", "b", "d", "c", "a"]
