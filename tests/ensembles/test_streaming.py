"""Ensembles with a decoupled step: steps run once per response, the ensemble answers as outputs come."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator
from pathlib import Path

import numpy as np

from deployments.inference import InferRequest, InferResponse, RequestedOutput
from ensembles.graph import build_graph
from ensembles.scheduler import EnsembleScheduler, common_path
from repository_loader.errors import ErrorCode, InvalidArgument
from repository_loader.repository import load_repository
from tests.ensembles.helpers import NumpyExecutor, ensemble, model, step

I32 = ("INT32", (-1,))
ONE = ("INT32", (1,))
MODELS = {
    "repeat": model("repeat", [("IN", *I32)], [("OUT", *ONE), ("IDX", *ONE)], decoupled=True),
    "square": model("square", [("IN", *ONE)], [("OUT", *ONE)], decoupled=True),
    "ident": model("ident", [("INPUT0", *I32)], [("OUTPUT0", *I32)]),
    "join": model("join", [("A", *ONE), ("B", *ONE)], [("SUM", *ONE)]),
}


class StreamingExecutor(NumpyExecutor):
    """``repeat`` answers each element of IN (OUT, IDX) and ``square`` answers n with n copies of n, each
    as a response of its own, then the final flag alone; other models answer once."""

    async def stream(self, request: InferRequest) -> AsyncGenerator[InferResponse, None]:
        values = [int(v) for v in np.asarray(request.inputs["IN"]).ravel()]
        if request.model_name == "repeat":
            if values and values[0] < 0:
                yield InferResponse(error=InvalidArgument("negative"))
                return
            answers = [
                {"OUT": np.array([v], np.int32), "IDX": np.array([i], np.int32)} for i, v in enumerate(values)
            ]
        else:
            answers = [{"OUT": np.array([values[0]], np.int32)}] * values[0]
        for outputs in answers:
            await asyncio.sleep(0)
            yield InferResponse(outputs=outputs, final=False)
        yield InferResponse(final=True)


def executor() -> StreamingExecutor:
    ex = StreamingExecutor({})
    ex.add("ident", lambda i: {"OUTPUT0": i["INPUT0"]})
    ex.add("join", lambda i: {"SUM": i["A"] + i["B"]})
    return ex


def ask(name: str, values: list[int], outputs: list[str] | None = None) -> InferRequest:
    requested = None if outputs is None else [RequestedOutput(o) for o in outputs]
    return InferRequest(name, {"IN": np.array(values, np.int32)}, id="r", requested_outputs=requested)


async def answers(scheduler: EnsembleScheduler, request: InferRequest) -> list[InferResponse]:
    return [r async for r in scheduler.stream(request)]


def fan() -> EnsembleScheduler:
    """IN -> repeat -> (ident, join(repeat's OUT, ident's)) -> OUT = 2 * each element."""
    fan = ensemble(
        "fan",
        [("IN", *I32)],
        [("OUT", *ONE)],
        [
            step("repeat", {"IN": "IN"}, {"OUT": "r"}),
            step("ident", {"INPUT0": "r"}, {"OUTPUT0": "i"}),
            step("join", {"A": "r", "B": "i"}, {"SUM": "OUT"}),
        ],
    )
    return EnsembleScheduler(build_graph(fan, MODELS), executor())


def test_paths_on_one_line_join_at_the_longest() -> None:
    assert common_path([(), (1,), (1, 2)]) == (1, 2)
    assert common_path([(0,), (1,)]) is None
    assert common_path([]) == ()


async def test_each_response_of_a_decoupled_step_runs_the_steps_after_it_then_the_final_flag() -> None:
    got = await answers(fan(), ask("fan", [100, 101, 102]))
    assert [r.outputs["OUT"].tolist() for r in got[:-1]] == [[200], [202], [204]]
    assert all(not r.final and r.id == "r" and r.model_name == "fan" for r in got[:-1])
    assert got[-1].final and not got[-1].outputs and got[-1].error is None


async def test_no_response_from_the_decoupled_step_leaves_the_final_flag_alone() -> None:
    got = await answers(fan(), ask("fan", []))
    assert len(got) == 1 and got[0].final and not got[0].outputs


async def test_outputs_of_different_steps_on_one_path_come_in_one_response() -> None:
    seq = ensemble(
        "seq",
        [("IN", *I32)],
        [("OUT", *ONE), ("IDX", *ONE)],
        [
            step("repeat", {"IN": "IN"}, {"OUT": "r", "IDX": "IDX"}),
            step("ident", {"INPUT0": "r"}, {"OUTPUT0": "OUT"}),
        ],
    )
    scheduler = EnsembleScheduler(build_graph(seq, MODELS), executor())
    got = await answers(scheduler, ask("seq", [5, 6]))
    assert [(r.outputs["OUT"].tolist(), r.outputs["IDX"].tolist()) for r in got[:-1]] == [
        ([5], [0]),
        ([6], [1]),
    ]
    only_out = await answers(scheduler, ask("seq", [5, 6], outputs=["OUT"]))
    assert [sorted(r.outputs) for r in only_out[:-1]] == [["OUT"], ["OUT"]]


async def test_a_nested_decoupled_ensemble_streams_into_the_next_step() -> None:
    table = dict(MODELS)
    inner = ensemble("inner", [("IN", *I32)], [("OUT", *ONE)], [step("repeat", {"IN": "IN"}, {"OUT": "OUT"})])
    table["inner"] = dataclasses.replace(inner, decoupled=True)
    outer = ensemble(
        "outer",
        [("IN", *I32)],
        [("OUT", *ONE)],
        [step("inner", {"IN": "IN"}, {"OUT": "r"}), step("square", {"IN": "r"}, {"OUT": "OUT"})],
    )
    scheduler = EnsembleScheduler(build_graph(outer, table), executor(), inline_nested=True)
    got = await answers(scheduler, ask("outer", [2, 3]))
    assert [r.outputs["OUT"].tolist() for r in got[:-1]] == [[2], [2], [3], [3], [3]]
    assert got[-1].final


async def test_a_failing_step_ends_the_stream_with_its_error() -> None:
    got = await answers(fan(), ask("fan", [-1]))
    assert len(got) == 1 and got[0].final and got[0].error is not None
    assert got[0].error.code == ErrorCode.INVALID_ARG
    assert got[0].error.message == "in ensemble 'fan', step 'repeat': negative"


def _write(folder: Path, name: str, config: str) -> None:
    (folder / name / "1").mkdir(parents=True)
    (folder / name / "config.pbtxt").write_text(config)
    if "ensemble" not in config:
        (folder / name / "1" / "model.py").write_text("")


def test_an_ensemble_with_a_decoupled_step_at_any_depth_is_decoupled(tmp_path: Path) -> None:
    tensor = 'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
    tensor += 'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
    one_step = 'ensemble_scheduling { step [ { model_name: "%s" model_version: -1 input_map { key: "IN" '
    one_step += 'value: "IN" } output_map { key: "OUT" value: "OUT" } } ] }\n'
    python = 'backend: "python"\nmax_batch_size: 0\n' + tensor
    _write(tmp_path, "rep", 'name: "rep"\n' + python + "model_transaction_policy { decoupled: True }\n")
    _write(tmp_path, "plain", 'name: "plain"\n' + python)
    ensemble_head = 'platform: "ensemble"\nmax_batch_size: 0\n' + tensor
    _write(tmp_path, "inner", 'name: "inner"\n' + ensemble_head + one_step % "rep")
    _write(tmp_path, "outer", 'name: "outer"\n' + ensemble_head + one_step % "inner")
    _write(tmp_path, "calm", 'name: "calm"\n' + ensemble_head + one_step % "plain")
    models = load_repository(tmp_path, auto_complete=False).models
    assert models["inner"].decoupled and models["outer"].decoupled and not models["calm"].decoupled
    assert models["outer"].config_json["model_transaction_policy"] == {"decoupled": True}
