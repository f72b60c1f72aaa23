"""Building ensemble graphs, and the one ensemble validator's rules on model descriptions."""

from __future__ import annotations

from typing import Any

import pytest

from ensembles.graph import build_graph
from repository_loader.ensemble_rules import shapes_agree, validate_ensemble
from repository_loader.errors import ConfigError, InternalError
from repository_loader.model import ModelDescription
from tests.ensembles.helpers import ensemble, model, step

F4 = ("FP32", (4,))


def models() -> dict:
    return {
        "pre": model("pre", [("IN", "FP32", (4,))], [("OUT", "FP32", (4,))]),
        "left": model("left", [("X", "FP32", (4,))], [("Y", "FP32", (4,))]),
        "right": model("right", [("X", "FP32", (-1,))], [("Y", "FP32", (4,))], versions=(1, 2, 3)),
        "join": model("join", [("A", "FP32", (4,)), ("B", "FP32", (4,))], [("SUM", "FP32", (4,))]),
        "ints": model("ints", [("X", "INT32", (4,))], [("Y", "INT32", (4,))]),
        "wide": model("wide", [("X", "FP32", (8,))], [("Y", "FP32", (8,))]),
    }


def diamond(**overrides: Any) -> ModelDescription:
    steps = overrides.pop(
        "steps",
        [
            step("pre", {"IN": "INPUT"}, {"OUT": "t0"}),
            step("left", {"X": "t0"}, {"Y": "t1"}),
            step("right", {"X": "t0"}, {"Y": "t2"}, version=2),
            step("join", {"A": "t1", "B": "t2"}, {"SUM": "OUTPUT"}),
        ],
    )
    return ensemble(
        overrides.pop("name", "diamond"),
        overrides.pop("inputs", [("INPUT", "FP32", (4,))]),
        overrides.pop("outputs", [("OUTPUT", "FP32", (4,))]),
        steps,
        **overrides,
    )


def test_diamond_is_ordered_and_resolves_versions() -> None:
    graph = build_graph(diamond(), models())
    order = [s.model_name for s in graph.steps]
    assert order.index("pre") < order.index("left") < order.index("join")
    assert order.index("right") < order.index("join")
    assert graph.producer == {"t0": 0, "t1": 1, "t2": 2, "OUTPUT": 3}
    right = next(s for s in graph.steps if s.model_name == "right")
    assert (right.version, right.pinned) == (2, True)
    left = next(s for s in graph.steps if s.model_name == "left")
    assert (left.version, left.pinned) == (1, False)


def test_latest_version_is_the_highest_served() -> None:
    steps = [step("right", {"X": "INPUT"}, {"Y": "OUTPUT"})]
    graph = build_graph(diamond(steps=steps), models())
    assert graph.steps[0].version == 3


def test_lookup_may_be_a_function() -> None:
    table = models()
    graph = build_graph(diamond(), table.get)
    assert len(graph.steps) == 4


def test_pruned_keeps_only_the_needed_steps() -> None:
    steps = [
        step("pre", {"IN": "INPUT"}, {"OUT": "t0"}),
        step("left", {"X": "t0"}, {"Y": "A"}),
        step("right", {"X": "INPUT"}, {"Y": "B"}),
    ]
    ens = diamond(steps=steps, outputs=[("A", "FP32", (4,)), ("B", "FP32", (4,))])
    graph = build_graph(ens, models())
    assert [s.model_name for s in graph.pruned(["A"]).steps] == ["pre", "left"]
    assert [s.model_name for s in graph.pruned(["B"]).steps] == ["right"]
    assert len(graph.pruned(["A", "B"]).steps) == 3
    with pytest.raises(ConfigError, match="'t0' is not an output"):
        graph.pruned(["t0"])


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        (
            [step("pre", {"IN": "INPUT"}, {"OUT": "OUTPUT"}), step("ghost", {"X": "INPUT"}, {"Y": "z"})],
            r"step\[1\] 'ghost'.model_name: model 'ghost' is not in the repository",
        ),
        (
            [step("pre", {"NOPE": "INPUT", "IN": "INPUT"}, {"OUT": "OUTPUT"})],
            r"step\[0\] 'pre'.input_map: 'NOPE' is not an input of model 'pre'",
        ),
        (
            [step("pre", {"IN": "INPUT"}, {"OUT": "OUTPUT", "EXTRA": "x"})],
            r"step\[0\] 'pre'.output_map: 'EXTRA' is not an output of model 'pre'",
        ),
        (
            [step("join", {"A": "INPUT"}, {"SUM": "OUTPUT"})],
            r"step\[0\] 'join'.input_map: required input 'B' of model 'join' is not mapped",
        ),
        (
            [step("right", {"X": "INPUT"}, {"Y": "OUTPUT"}, version=7)],
            r"step\[0\] 'right'.model_version: model_version 7 of 'right' is not served \(versions: 1, 2, 3\)",
        ),
        (
            [step("pre", {"IN": "INPUT"}, {"OUT": "OUTPUT"}), step("left", {"X": "INPUT"}, {"Y": "OUTPUT"})],
            r"step\[1\] 'left'.output_map: ensemble tensor 'OUTPUT' can appear in an output map only once \(step\[0\] 'pre' writes it\)",
        ),
        (
            [step("pre", {"IN": "INPUT"}, {"OUT": "OUTPUT"}), step("left", {"X": "OUTPUT"}, {"Y": "INPUT"})],
            r"step\[1\] 'left'.output_map: ensemble tensor 'INPUT' is an ensemble input; a step cannot write it",
        ),
        (
            [step("join", {"A": "INPUT", "B": "missing"}, {"SUM": "OUTPUT"})],
            r"output: output 'OUTPUT' for ensemble 'diamond' is not written: at least one of its depending tensors, 'missing', is not connected",
        ),
        (
            [step("pre", {"IN": "INPUT"}, {"OUT": "t0"})],
            r"output: ensemble output 'OUTPUT' for ensemble 'diamond' is not used",
        ),
        (
            [
                step("pre", {"IN": "INPUT"}, {"OUT": "OUTPUT"}),
                step("left", {"X": "t2"}, {"Y": "t1"}),
                step("right", {"X": "t1"}, {"Y": "t2"}),
            ],
            r"step\[1\] 'left'.output_map: ensemble tensor 't1' is unused in ensemble 'diamond'",
        ),
        (
            [step("ints", {"X": "INPUT"}, {"Y": "OUTPUT"})],
            r"step\[0\] 'ints'.input_map: ensemble tensor 'INPUT': inconsistent data type: TYPE_FP32 is inferred from model 'diamond' while TYPE_INT32 is inferred from model 'ints'",
        ),
        (
            [step("pre", {"IN": "INPUT"}, {"OUT": "t0"}), step("wide", {"X": "t0"}, {"Y": "OUTPUT"})],
            r"step\[1\] 'wide'.input_map: ensemble tensor 't0': inconsistent shape: \[4\] is inferred from model 'pre' while \[8\] is inferred from model 'wide'",
        ),
    ],
)
def test_each_rule_names_ensemble_step_and_tensor(steps: list, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        validate_ensemble(diamond(steps=steps), models())
    assert info.value.message.startswith("model 'diamond' ")


def test_ensemble_output_must_agree_with_its_producer() -> None:
    steps = [step("pre", {"IN": "INPUT"}, {"OUT": "OUTPUT"})]
    ens = diamond(steps=steps, outputs=[("OUTPUT", "FP32", (5,))])
    with pytest.raises(
        ConfigError,
        match=r"ensemble tensor 'OUTPUT': inconsistent shape: \[5\] is inferred from model 'diamond' "
        r"while \[4\] is inferred from model 'pre'",
    ):
        validate_ensemble(ens, models())


def test_wildcard_dims_agree() -> None:
    assert shapes_agree((-1, 4), (3, 4))
    assert not shapes_agree((4,), (4, 1))
    # 'right' takes X with dims [-1]: a [4] producer fits
    steps = [step("pre", {"IN": "INPUT"}, {"OUT": "t0"}), step("right", {"X": "t0"}, {"Y": "OUTPUT"})]
    assert len(build_graph(diamond(steps=steps), models()).steps) == 2


def test_batching_ensemble_needs_batching_models_that_take_as_many_rows() -> None:
    table = {
        "b8": model("b8", [("X", "FP32", (4,))], [("Y", "FP32", (4,))], max_batch_size=8),
        "b2": model("b2", [("X", "FP32", (4,))], [("Y", "FP32", (4,))], max_batch_size=2),
        "flat": model("flat", [("X", "FP32", (-1, 4))], [("Y", "FP32", (-1, 4))]),
    }
    ok = diamond(steps=[step("b8", {"X": "INPUT"}, {"Y": "OUTPUT"})], max_batch_size=4)
    validate_ensemble(ok, table)
    assert build_graph(ok, table).steps[0].model_name == "b8"
    too_many = diamond(steps=[step("b2", {"X": "INPUT"}, {"Y": "OUTPUT"})], max_batch_size=4)
    with pytest.raises(
        ConfigError,
        match=r"step\[0\] 'b2'.model_name: ensemble 'diamond' allows max_batch_size 4, "
        r"but model 'b2' allows only 2",
    ):
        validate_ensemble(too_many, table)
    # a model that does not batch serves a batching ensemble where its dims are the ensemble's full shape
    # (Triton's rule: only a batching model may limit the ensemble's batch size)
    no_batch = diamond(steps=[step("flat", {"X": "INPUT"}, {"Y": "OUTPUT"})], max_batch_size=4)
    validate_ensemble(no_batch, table)
    table["flat5"] = model("flat5", [("X", "FP32", (-1, 5))], [("Y", "FP32", (-1, 5))])
    with pytest.raises(ConfigError, match=r"'flat5'.input_map: ensemble tensor 'INPUT': inconsistent shape"):
        validate_ensemble(
            diamond(steps=[step("flat5", {"X": "INPUT"}, {"Y": "OUTPUT"})], max_batch_size=4), table
        )
    # a non-batching ensemble feeding a batching model: the batch dim is part of the ensemble's dims
    unbatched = diamond(
        steps=[step("b8", {"X": "INPUT"}, {"Y": "OUTPUT"})],
        inputs=[("INPUT", "FP32", (-1, 4))],
        outputs=[("OUTPUT", "FP32", (-1, 4))],
    )
    validate_ensemble(unbatched, table)
    assert build_graph(unbatched, table).steps[0].model.max_batch_size == 8
    # ... or where its dims are the model's own (L0_infer_zero's ensembles: the step gets a batch of one)
    same_dims = diamond(steps=[step("b8", {"X": "INPUT"}, {"Y": "OUTPUT"})])
    validate_ensemble(same_dims, table)


def test_nested_ensembles_are_built_and_validated() -> None:
    table = models()
    table["inner"] = ensemble(
        "inner",
        [("I", "FP32", (4,))],
        [("O", "FP32", (4,))],
        [step("left", {"X": "I"}, {"Y": "m"}), step("right", {"X": "m"}, {"Y": "O"})],
    )
    outer = diamond(
        name="outer",
        steps=[step("pre", {"IN": "INPUT"}, {"OUT": "t0"}), step("inner", {"I": "t0"}, {"O": "OUTPUT"})],
    )
    validate_ensemble(outer, table)
    graph = build_graph(outer, table)
    assert [s.model_name for s in graph.nested["inner"].steps] == ["left", "right"]
    table["inner"] = ensemble(
        "inner", [("I", "FP32", (4,))], [("O", "FP32", (4,))], [step("ghost", {"X": "I"}, {"Y": "O"})]
    )
    with pytest.raises(ConfigError, match=r"model 'inner' .*step\[0\] 'ghost'"):
        validate_ensemble(outer, table)
    with pytest.raises(InternalError, match="'inner' was not validated"):
        build_graph(outer, table)


def test_ensembles_that_contain_each_other_are_rejected() -> None:
    table = models()
    table["a"] = ensemble(
        "a", [("I", "FP32", (4,))], [("O", "FP32", (4,))], [step("b", {"I": "I"}, {"O": "O"})]
    )
    table["b"] = ensemble(
        "b", [("I", "FP32", (4,))], [("O", "FP32", (4,))], [step("a", {"I": "I"}, {"O": "O"})]
    )
    with pytest.raises(ConfigError, match=r"circular dependency between ensembles: a -> b -> a"):
        validate_ensemble(table["a"], table)
    with pytest.raises(InternalError, match=r"contains itself \(a -> b -> a\)"):
        build_graph(table["a"], table)


def test_not_an_ensemble() -> None:
    with pytest.raises(ConfigError, match="model 'pre' is not an ensemble"):
        build_graph(models()["pre"], models())
