"""Running ensemble requests: concurrency, pruning, versions, nesting and failures."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from deployments.inference import InferRequest, InferResponse, RequestedOutput
from deployments.runtime.checks import ModelSchema
from ensembles.graph import EnsembleGraph, build_graph
from ensembles.scheduler import EnsembleScheduler, StepTiming
from repository_loader.errors import ErrorCode, InternalError, InvalidArgument, Unavailable
from tests.ensembles.helpers import NumpyExecutor, ensemble, fp32, model, step

V = ("FP32", (2,))


def vec(name: str) -> tuple[str, str, tuple[int, ...]]:
    return (name, *V)


MODELS = {
    "pre": model("pre", [vec("IN")], [vec("OUT")]),
    "left": model("left", [vec("X")], [vec("Y")]),
    "right": model("right", [vec("X")], [vec("Y")], versions=(1, 2, 3)),
    "join": model("join", [vec("A"), vec("B")], [vec("SUM")]),
}


def diamond_graph(right_version: int = -1) -> EnsembleGraph:
    """INPUT -> pre -> (left, right) -> join -> OUTPUT; LEFT and RIGHT also exposed."""
    ens = ensemble(
        "diamond",
        [vec("INPUT")],
        [vec("OUTPUT"), vec("LEFT"), vec("RIGHT")],
        [
            step("pre", {"IN": "INPUT"}, {"OUT": "t0"}),
            step("left", {"X": "t0"}, {"Y": "LEFT"}),
            step("right", {"X": "t0"}, {"Y": "RIGHT"}, version=right_version),
            step("join", {"A": "LEFT", "B": "RIGHT"}, {"SUM": "OUTPUT"}),
        ],
    )
    return build_graph(ens, MODELS)


def executor(**functions) -> NumpyExecutor:
    ex = NumpyExecutor({})
    ex.add("pre", functions.get("pre", lambda i: {"OUT": i["IN"] + 1}))
    ex.add("left", functions.get("left", lambda i: {"Y": i["X"] * 2}))
    for v in (1, 2, 3):
        ex.add("right", functions.get("right", lambda i, v=v: {"Y": i["X"] * 10 * v}), version=v)
    ex.add("join", functions.get("join", lambda i: {"SUM": i["A"] + i["B"]}))
    return ex


def request(outputs: list[str] | None = None, value: float = 1.0) -> InferRequest:
    requested = None if outputs is None else [RequestedOutput(o) for o in outputs]
    return InferRequest("diamond", {"INPUT": fp32(value, value)}, id="r1", requested_outputs=requested)


async def test_diamond_runs_both_branches_at_once() -> None:
    started = {"left": asyncio.Event(), "right": asyncio.Event()}

    def branch(me: str, other: str, factor: float):
        async def run(inputs: dict) -> dict:
            started[me].set()
            await asyncio.wait_for(started[other].wait(), timeout=2)  # fails unless both are in flight
            return {"Y": inputs["X"] * factor}

        return run

    ex = executor(left=branch("left", "right", 2), right=branch("right", "left", 10))
    response = await EnsembleScheduler(diamond_graph(), ex).infer(request())
    assert response.error is None
    np.testing.assert_array_equal(response.outputs["OUTPUT"], fp32(24, 24))  # (1+1)*2 + (1+1)*10
    assert set(response.outputs) == {"OUTPUT", "LEFT", "RIGHT"}
    assert (response.model_name, response.id) == ("diamond", "r1")


@pytest.mark.parametrize(("start", "end"), [(True, False), (False, False), (False, True)])
async def test_a_sequence_request_is_answered_with_its_flags(start: bool, end: bool) -> None:
    sequence = request()
    sequence.correlation_id, sequence.sequence_start, sequence.sequence_end = 7, start, end
    response = await EnsembleScheduler(diamond_graph(), executor()).infer(sequence)
    assert response.error is None
    assert response.parameters == {"sequence_start": start, "sequence_end": end}
    assert (await EnsembleScheduler(diamond_graph(), executor()).infer(request())).parameters == {}


async def test_versions_latest_and_pinned() -> None:
    ex = executor()
    latest = await EnsembleScheduler(diamond_graph(), ex).infer(request(["RIGHT"]))
    np.testing.assert_array_equal(latest.outputs["RIGHT"], fp32(60, 60))  # version 3
    assert ex.called("right")[-1].version == "3"
    pinned = await EnsembleScheduler(diamond_graph(right_version=2), ex).infer(request(["RIGHT"]))
    np.testing.assert_array_equal(pinned.outputs["RIGHT"], fp32(40, 40))  # version 2
    assert ex.called("right")[-1].version == "2"


async def test_partial_outputs_run_only_the_needed_steps() -> None:
    ex = executor()
    response = await EnsembleScheduler(diamond_graph(), ex).infer(request(["LEFT"]))
    assert list(response.outputs) == ["LEFT"]
    np.testing.assert_array_equal(response.outputs["LEFT"], fp32(4, 4))
    assert [c.model_name for c in ex.calls] == ["pre", "left"]
    assert ex.called("left")[0].requested == ["Y"]


async def test_failing_step_fails_its_request_only() -> None:
    cancelled = []

    def left(inputs: dict) -> dict:
        if inputs["X"][0] < 0:
            raise Unavailable("left is overloaded")
        return {"Y": inputs["X"] * 2}

    async def right(inputs: dict) -> dict:
        try:
            await asyncio.sleep(60 if inputs["X"][0] < 0 else 0)  # the failed request's: until cancelled
        except asyncio.CancelledError:
            cancelled.append(float(inputs["X"][0]))
            raise
        return {"Y": inputs["X"] * 10}

    ex = executor(left=left, right=right)
    scheduler = EnsembleScheduler(diamond_graph(), ex)
    bad, good = await asyncio.gather(scheduler.infer(request(value=-5)), scheduler.infer(request(value=1)))
    assert isinstance(bad.error, Unavailable)
    assert bad.error.code is ErrorCode.UNAVAILABLE
    assert bad.error.message == "in ensemble 'diamond', step 'left': left is overloaded"
    assert bad.outputs == {}
    assert cancelled == [-4.0]  # the slow branch of the failed request was cancelled
    assert good.error is None
    np.testing.assert_array_equal(good.outputs["OUTPUT"], fp32(24, 24))
    assert len(ex.called("join")) == 1  # only the good request reached the join


async def test_unexpected_exception_and_missing_output_are_internal_errors() -> None:
    ex = executor(pre=lambda i: {"OUT": i["IN"][5]})
    response = await EnsembleScheduler(diamond_graph(), ex).infer(request())
    assert isinstance(response.error, InternalError)
    assert response.error.message.startswith("in ensemble 'diamond', step 'pre': IndexError")


async def test_an_output_a_step_does_not_send_is_absent_as_in_triton() -> None:
    """Triton's placeholder: a requested ensemble output no step sent is left out of the response; a
    later step that reads the missing tensor runs without it (an optional input) or fails its own check."""
    ex = executor(left=lambda i: {"WRONG": i["X"]})
    response = await EnsembleScheduler(diamond_graph(), ex).infer(request(["LEFT", "RIGHT"]))
    assert response.error is None and list(response.outputs) == ["RIGHT"]
    assert [c.inputs for c in ex.called("join")] == []  # not needed for LEFT and RIGHT
    response = await EnsembleScheduler(diamond_graph(), ex).infer(request(["OUTPUT"]))
    (join,) = ex.called("join")
    assert "A" not in join.inputs and "B" in join.inputs  # the step got what exists, nothing in its place
    assert isinstance(response.error, InternalError)  # this fake's join needs A: its KeyError is the step's
    assert response.error.message.startswith("in ensemble 'diamond', step 'join': KeyError")


def test_ensemble_requests_meet_the_one_request_check() -> None:
    """An ensemble's requests are checked where every model's are, with the same wording."""
    schema = ModelSchema.from_description(diamond_graph().ensemble)
    with pytest.raises(InvalidArgument, match="unexpected inference output 't0' for model 'diamond'"):
        schema.check_request(request(["t0"]))
    with pytest.raises(InvalidArgument, match="missing required input"):
        schema.check_request(InferRequest("diamond", {}))
    with pytest.raises(InvalidArgument, match="unexpected inference input 'X' for model 'diamond'"):
        schema.check_request(InferRequest("diamond", {"INPUT": fp32(1, 1), "X": fp32(1, 1)}))


async def test_step_timings_are_reported() -> None:
    timings: list[StepTiming] = []
    scheduler = EnsembleScheduler(diamond_graph(right_version=1), executor(), on_step=timings.append)
    await scheduler.infer(request())
    assert sorted((t.model_name, t.model_version) for t in timings) == [
        ("join", 1),
        ("left", 1),
        ("pre", 1),
        ("right", 1),
    ]
    assert all(t.success and t.duration_ns >= 0 and t.ensemble == "diamond" for t in timings)
    by_name = {t.model_name: t for t in timings}
    assert by_name["pre"].end_ns <= by_name["left"].start_ns
    assert max(by_name["left"].end_ns, by_name["right"].end_ns) <= by_name["join"].start_ns


class RoutingExecutor:
    """Sends ensembles to their scheduler and everything else to the numpy functions."""

    def __init__(self, models: NumpyExecutor) -> None:
        self.models = models
        self.ensembles: dict[str, EnsembleScheduler] = {}

    async def infer(self, request: InferRequest) -> InferResponse:
        if request.model_name in self.ensembles:
            return await self.ensembles[request.model_name].infer(request)
        return await self.models.infer(request)


def nested_graph() -> EnsembleGraph:
    table = dict(MODELS)
    table["inner"] = ensemble(
        "inner",
        [vec("I")],
        [vec("O"), vec("SIDE")],
        [step("left", {"X": "I"}, {"Y": "O"}), step("right", {"X": "I"}, {"Y": "SIDE"}, version=1)],
    )
    outer = ensemble(
        "outer",
        [vec("INPUT")],
        [vec("OUTPUT")],
        [step("pre", {"IN": "INPUT"}, {"OUT": "t0"}), step("inner", {"I": "t0"}, {"O": "OUTPUT"})],
    )
    return build_graph(outer, table)


@pytest.mark.parametrize("inline", [False, True])
async def test_nested_ensemble(inline: bool) -> None:
    graph = nested_graph()
    models = executor()
    routing = RoutingExecutor(models)
    routing.ensembles["inner"] = EnsembleScheduler(graph.nested["inner"], routing)
    scheduler = EnsembleScheduler(graph, routing, inline_nested=inline)
    response = await scheduler.infer(InferRequest("outer", {"INPUT": fp32(1, 2)}))
    assert response.error is None
    np.testing.assert_array_equal(response.outputs["OUTPUT"], fp32(4, 6))
    # the inner ensemble was asked only for O, so its 'right' step never ran
    assert [c.model_name for c in models.calls] == ["pre", "left"]


async def test_nested_ensemble_error_names_both_levels() -> None:
    graph = nested_graph()

    def left(inputs: dict) -> dict:
        raise InvalidArgument("negative input")

    routing = RoutingExecutor(executor(left=left))
    routing.ensembles["inner"] = EnsembleScheduler(graph.nested["inner"], routing)
    response = await EnsembleScheduler(graph, routing).infer(InferRequest("outer", {"INPUT": fp32(1, 2)}))
    assert isinstance(response.error, InvalidArgument)
    assert response.error.message == (
        "in ensemble 'outer', step 'inner': in ensemble 'inner', step 'left': negative input"
    )


def _nop_ensemble(ensemble_batch: int, step_batch: int, dims: tuple[int, ...]) -> EnsembleGraph:
    """INPUT -> nop -> OUTPUT, the ensemble and its step each batching or not (L0_infer_zero's shape)."""
    nop = model("nop", [("IN", "FP32", dims)], [("OUT", "FP32", dims)], max_batch_size=step_batch)
    ens = ensemble(
        "zero",
        [("INPUT", "FP32", dims)],
        [("OUTPUT", "FP32", dims)],
        [step("nop", {"IN": "INPUT"}, {"OUT": "OUTPUT"})],
        max_batch_size=ensemble_batch,
    )
    return build_graph(ens, {"nop": nop})


async def test_a_step_that_batches_gets_a_batch_of_one_from_an_ensemble_that_does_not() -> None:
    ex = NumpyExecutor({})
    ex.add("nop", lambda i: {"OUT": i["IN"].copy()})
    scheduler = EnsembleScheduler(_nop_ensemble(0, 1024, (-1,)), ex)
    for length in (0, 3):
        data = np.arange(length, dtype=np.float32)
        response = await scheduler.infer(InferRequest("zero", {"INPUT": data}))
        assert response.error is None
        # the step saw [1, n] (its batch dimension added), the client gets [n] back, as it sent
        assert ex.calls[-1].inputs["IN"].shape == (1, length)
        assert response.outputs["OUTPUT"].shape == (length,)
        assert response.outputs["OUTPUT"].tolist() == data.tolist()


async def test_a_step_that_does_not_batch_gets_a_batch_of_one_without_its_batch_dimension() -> None:
    ex = NumpyExecutor({})
    ex.add("nop", lambda i: {"OUT": i["IN"] * 2})
    scheduler = EnsembleScheduler(_nop_ensemble(8, 0, (4,)), ex)
    response = await scheduler.infer(InferRequest("zero", {"INPUT": np.ones((1, 4), np.float32)}))
    assert response.error is None
    assert ex.calls[-1].inputs["IN"].shape == (4,)
    assert response.outputs["OUTPUT"].shape == (1, 4) and response.outputs["OUTPUT"].tolist() == [[2.0] * 4]
    # a batch of more than one cannot drop its batch dimension: it goes as it is, for the step to refuse
    await scheduler.infer(InferRequest("zero", {"INPUT": np.ones((3, 4), np.float32)}))
    assert ex.calls[-1].inputs["IN"].shape == (3, 4)
