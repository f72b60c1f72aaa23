"""Errors, cancellation, close() and the pass-through scheduler."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from deployments.inference import InferRequest, InferResponse
from deployments.runtime.batching import DynamicBatcher, PassThroughScheduler, make_scheduler
from repository_loader.errors import InternalError, InvalidArgument, NotFound, Unavailable
from repository_loader.model import ModelDescription
from tests.backends.helpers import describe, spec
from tests.batching.fakes import INPUTS, Recorder, config, request, until


async def test_a_failing_batch_fails_only_its_own_requests() -> None:
    rec = Recorder(fail=lambda ids: "bad" in ids, error=ValueError("kaput"))
    batcher = DynamicBatcher(config(), 2, INPUTS, rec, model_name="m")
    reqs = [request("ok0"), request("ok1"), request("bad"), request("mate"), request("ok2")]
    responses = await asyncio.gather(*(batcher.submit(r) for r in reqs))
    assert rec.batches == [["ok0", "ok1"], ["bad", "mate"], ["ok2"]]
    errors = {r.id: r.error for r in responses}
    assert errors["ok0"] is None and errors["ok1"] is None and errors["ok2"] is None
    for rid in ("bad", "mate"):
        assert isinstance(errors[rid], InternalError) and "kaput" in errors[rid].message
    assert (await batcher.submit(request("after"))).error is None


async def test_server_errors_from_execute_pass_through_unchanged() -> None:
    error = InvalidArgument("model 'm': input 'IN' is wrong")
    batcher = DynamicBatcher(config(), 4, INPUTS, Recorder(fail=lambda ids: True, error=error))
    response = await batcher.submit(request("a"))
    assert response.error is error and response.id == "a"


async def test_wrong_number_of_responses_is_an_internal_error() -> None:
    async def short(requests: list[InferRequest]) -> list[InferResponse]:
        return [InferResponse()]

    batcher = DynamicBatcher(config(), 4, INPUTS, short, model_name="m")
    responses = await asyncio.gather(batcher.submit(request("a")), batcher.submit(request("b")))
    assert all(
        isinstance(r.error, InternalError) and "exactly one response" in r.error.message for r in responses
    )


async def test_cancelled_waiter_does_not_break_its_batch() -> None:
    gate = asyncio.Event()
    rec = Recorder(gate=gate)
    batcher = DynamicBatcher(config(), 4, INPUTS, rec)
    tasks = [asyncio.ensure_future(batcher.submit(request(str(i)))) for i in range(3)]
    await until(lambda: len(rec.batches) == 1)
    tasks[1].cancel()
    gate.set()
    assert (await tasks[0]).error is None and (await tasks[2]).error is None
    assert rec.batches == [["0", "1", "2"]]
    assert (await batcher.submit(request("next"))).error is None


async def test_close_drains_the_queue_then_rejects_new_requests() -> None:
    rec = Recorder()
    batcher = DynamicBatcher(config(max_queue_delay_microseconds=30_000_000), 8, INPUTS, rec, model_name="m")
    queued = [asyncio.ensure_future(batcher.submit(request(str(i)))) for i in range(3)]
    await asyncio.sleep(0.01)
    assert rec.batches == []
    await asyncio.wait_for(batcher.close(), 5)
    assert all(t.result().error is None for t in queued)
    late = await batcher.submit(request("late"))
    assert isinstance(late.error, Unavailable) and "shutting down" in late.error.message


async def test_close_without_drain_rejects_what_is_queued() -> None:
    rec = Recorder()
    batcher = DynamicBatcher(config(max_queue_delay_microseconds=30_000_000), 8, INPUTS, rec)
    queued = [asyncio.ensure_future(batcher.submit(request(str(i)))) for i in range(2)]
    await asyncio.sleep(0.01)
    await asyncio.wait_for(batcher.close(drain=False), 5)
    assert all(isinstance(t.result().error, Unavailable) for t in queued)
    assert rec.batches == []


async def test_close_waits_for_running_batches() -> None:
    rec = Recorder(hold={"a": 0.03, "b": 0.03})
    batcher = DynamicBatcher(config(), 1, INPUTS, rec, max_concurrent_batches=2)
    tasks = [asyncio.ensure_future(batcher.submit(request(r))) for r in ("a", "b")]
    await until(lambda: len(rec.batches) == 2)
    await batcher.close()
    assert sorted(rec.completed) == ["a", "b"] and all(t.done() for t in tasks)


async def test_pass_through_executes_each_request_alone_one_at_a_time() -> None:
    rec = Recorder(hold={"0": 0.01})
    seen: list[tuple[int, int]] = []
    scheduler = PassThroughScheduler(8, rec, on_batch=lambda rows, n, q: seen.append((rows, n)))
    responses = await asyncio.gather(*(scheduler.submit(request(str(i), rows=2, value=i)) for i in range(4)))
    assert rec.batches == [["0"], ["1"], ["2"], ["3"]]
    assert rec.max_active == 1
    assert seen == [(2, 1)] * 4
    assert [float(r.outputs["OUT"][0, 0]) for r in responses] == [0.0, 2.0, 4.0, 6.0]
    await scheduler.close()
    assert isinstance((await scheduler.submit(request("late"))).error, Unavailable)


async def test_pass_through_isolates_errors_and_honours_instance_count() -> None:
    rec = Recorder(fail=lambda ids: ids == ["bad"], hold={"bad": 0.01, "ok": 0.01})
    scheduler = PassThroughScheduler(0, rec, max_concurrent=2)
    bad, ok = await asyncio.gather(scheduler.submit(request("bad")), scheduler.submit(request("ok")))
    assert isinstance(bad.error, InternalError) and ok.error is None
    assert rec.max_active == 2


def test_make_scheduler_follows_the_config(tmp_path) -> None:  # type: ignore[no-untyped-def]
    base = dict(
        name="m", path=tmp_path, platform="", backend="python", inputs=INPUTS, outputs=(), versions=(1,)
    )
    plain = ModelDescription(max_batch_size=8, **base)  # type: ignore[arg-type]
    batched = ModelDescription(max_batch_size=8, dynamic_batching=config(), **base)  # type: ignore[arg-type]
    assert isinstance(make_scheduler(plain, Recorder()), PassThroughScheduler)
    assert isinstance(make_scheduler(batched, Recorder()), DynamicBatcher)


async def test_a_model_runtime_with_no_version_loaded_yet_asks_for_a_retry(tmp_path: Path) -> None:
    """A replica or host that has not loaded its model yet answers 503: the model is not gone (the
    server application answers Triton's 404 "has no available versions" for a model it knows with
    no version ready)."""
    from deployments.runtime.model import ModelRuntime

    model = describe("m", tmp_path / "m", "python", [spec("X", "FP32", [4])], [spec("Y", "FP32", [4])])
    runtime = ModelRuntime(model)
    response = await runtime.infer(InferRequest("m", {"X": np.ones(4, np.float32)}, id="r"))
    assert isinstance(response.error, Unavailable) and response.error.http_status == 503
    assert "no version loaded here yet" in response.error.message


async def test_a_retired_version_is_not_at_ready_state_an_unknown_one_not_found(tmp_path: Path) -> None:
    from dataclasses import replace

    from deployments.runtime.model import ModelRuntime

    model = describe("m", tmp_path / "m", "python", [spec("X", "FP32", [4])], [spec("Y", "FP32", [4])])
    runtime = ModelRuntime(replace(model, retired_versions=(1,)))
    x = {"X": np.ones(4, np.float32)}
    retired = await runtime.infer(InferRequest("m", x, id="r", model_version="1"))
    assert isinstance(retired.error, Unavailable)
    assert retired.error.message == "Request for unknown model: 'm' version 1 is not at ready state"
    unknown = await runtime.infer(InferRequest("m", x, id="r", model_version="5"))
    assert isinstance(unknown.error, NotFound)
    assert unknown.error.message == "Request for unknown model: 'm' version 5 is not found"
