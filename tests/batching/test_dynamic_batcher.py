"""The dynamic batcher forming batches: rows, delay, shapes, preferred sizes, load."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from deployments.inference import InferRequest, InferResponse
from deployments.runtime.batching import DynamicBatcher
from tests.batching.fakes import INPUTS, RAGGED_INPUTS, Recorder, SchedulerStats, config, request, until


async def submit_all(batcher: DynamicBatcher, reqs: list[InferRequest]) -> list[InferResponse]:
    return await asyncio.gather(*(batcher.submit(r) for r in reqs))


async def test_rows_are_counted_not_requests() -> None:
    rec = Recorder()
    stats = SchedulerStats()
    batcher = DynamicBatcher(config(), 8, INPUTS, rec, on_batch=stats.record)
    reqs = [request("a", rows=3), request("b", rows=3), request("c", rows=2), request("d", rows=1)]
    await submit_all(batcher, reqs)
    assert rec.batches == [["a", "b", "c"], ["d"]]
    assert rec.rows == [8, 1]
    assert stats.batch_counts == {8: 1, 1: 1}


async def test_each_request_gets_its_own_rows_back() -> None:
    batcher = DynamicBatcher(config(), 8, INPUTS, Recorder())
    responses = await submit_all(batcher, [request(str(i), rows=1 + i % 3, value=i) for i in range(6)])
    for i, response in enumerate(responses):
        assert response.error is None and response.id == str(i)
        assert response.outputs["OUT"].shape == (1 + i % 3, 2)
        assert np.all(response.outputs["OUT"] == 2 * i)


async def test_requests_queued_while_a_batch_runs_form_the_next_batch() -> None:
    gate = asyncio.Event()
    rec = Recorder(gate=gate)
    batcher = DynamicBatcher(config(), 16, INPUTS, rec)
    first = asyncio.ensure_future(batcher.submit(request("first")))
    await until(lambda: len(rec.batches) == 1)
    later = [asyncio.ensure_future(batcher.submit(request(f"r{i}"))) for i in range(5)]
    await asyncio.sleep(0.01)
    gate.set()
    await asyncio.gather(first, *later)
    assert rec.batches == [["first"], [f"r{i}" for i in range(5)]]


async def test_queue_delay_lets_a_batch_grow_from_trickling_requests() -> None:
    """The first request waits for more (the delay, 30 s, is past the test's limit): the batch runs
    once the trickle fills it."""
    rec = Recorder()
    batcher = DynamicBatcher(config(max_queue_delay_microseconds=30_000_000), 4, INPUTS, rec)
    tasks = []
    for i in range(4):
        tasks.append(asyncio.ensure_future(batcher.submit(request(str(i)))))
        await asyncio.sleep(0.002)
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert rec.batches == [["0", "1", "2", "3"]]


async def test_lone_request_waits_out_the_queue_delay() -> None:
    rec = Recorder()
    stats = SchedulerStats()
    batcher = DynamicBatcher(
        config(max_queue_delay_microseconds=100_000), 16, INPUTS, rec, on_batch=stats.record
    )
    start = time.monotonic()
    response = await batcher.submit(request("a"))
    assert response.error is None
    assert time.monotonic() - start >= 0.09
    assert stats.queue_ns >= 90_000_000


async def test_lone_request_without_delay_runs_at_once_without_a_timer() -> None:
    loop = asyncio.get_running_loop()
    timers = []
    original = loop.call_later

    def counting_call_later(delay, callback, *args, **kwargs):  # type: ignore[no-untyped-def]
        timers.append(delay)
        return original(delay, callback, *args, **kwargs)

    loop.call_later = counting_call_later  # type: ignore[method-assign]
    try:
        batcher = DynamicBatcher(config(), 8, INPUTS, Recorder())
        for i in range(3):
            assert (await batcher.submit(request(str(i)))).error is None
    finally:
        loop.call_later = original  # type: ignore[method-assign]
    assert timers == []


async def test_incompatible_shapes_never_share_a_batch() -> None:
    rec = Recorder()
    batcher = DynamicBatcher(config(), 16, INPUTS, rec)
    widths = [3, 3, 4, 4, 3, 5]
    responses = await submit_all(batcher, [request(str(i), width=w) for i, w in enumerate(widths)])
    assert all(r.error is None for r in responses)
    assert rec.batches == [["0", "1"], ["2", "3"], ["4"], ["5"]]
    for shapes in rec.shapes:
        assert len({s[1:] for s in shapes}) == 1


async def test_ragged_inputs_share_a_batch_across_shapes() -> None:
    rec = Recorder()
    batcher = DynamicBatcher(config(), 16, RAGGED_INPUTS, rec)
    await submit_all(batcher, [request(str(i), width=w) for i, w in enumerate([3, 4, 5])])
    assert rec.batches == [["0", "1", "2"]]


async def test_preferred_size_executes_without_waiting_for_the_delay() -> None:
    rec = Recorder()
    batcher = DynamicBatcher(
        config(preferred_batch_size=(2, 4), max_queue_delay_microseconds=30_000_000), 8, INPUTS, rec
    )
    responses = await asyncio.wait_for(submit_all(batcher, [request(str(i)) for i in range(6)]), 10)
    assert all(r.error is None for r in responses)
    assert rec.rows == [4, 2]  # the largest attainable preferred size first


async def test_rows_short_of_a_preferred_size_wait_until_close_flushes_them() -> None:
    rec = Recorder()
    batcher = DynamicBatcher(
        config(preferred_batch_size=(4,), max_queue_delay_microseconds=30_000_000), 8, INPUTS, rec
    )
    tasks = [asyncio.ensure_future(batcher.submit(request(str(i)))) for i in range(5)]
    await until(lambda: rec.rows == [4])
    await asyncio.sleep(0.02)
    assert rec.rows == [4] and not tasks[4].done()
    await batcher.close()
    assert rec.rows == [4, 1] and tasks[4].result().error is None


async def test_oversized_request_runs_alone_without_blocking_the_queue() -> None:
    rec = Recorder()
    batcher = DynamicBatcher(config(), 4, INPUTS, rec)
    responses = await submit_all(batcher, [request("big", rows=9), request("a"), request("b")])
    assert all(r.error is None for r in responses)
    assert rec.batches == [["big"], ["a", "b"]]


async def test_thousand_concurrent_requests_get_their_own_rows() -> None:
    async def merged_execute(requests: list[InferRequest]) -> list[InferResponse]:
        joined = np.concatenate([r.inputs["IN"] for r in requests], axis=0)
        await asyncio.sleep(0.001)
        doubled = joined * 2 + 1
        bounds = np.cumsum([r.batch_rows() for r in requests])[:-1]
        parts = np.split(doubled, bounds, axis=0)
        return [InferResponse(outputs={"OUT": p}, id=r.id) for p, r in zip(parts, requests, strict=True)]

    sizes: list[int] = []
    stats = SchedulerStats()

    def on_batch(rows: int, n: int, queue_ns: list[int]) -> None:
        sizes.append(rows)
        stats.record(rows, n, queue_ns)

    batcher = DynamicBatcher(
        config(max_queue_delay_microseconds=2_000),
        32,
        INPUTS,
        merged_execute,
        max_concurrent_batches=2,
        on_batch=on_batch,
    )
    reqs = [request(str(i), rows=1 + i % 2, value=float(i)) for i in range(1000)]
    responses = await submit_all(batcher, reqs)
    for i, response in enumerate(responses):
        assert response.id == str(i)
        assert response.outputs["OUT"].shape == (1 + i % 2, 2)
        assert np.all(response.outputs["OUT"] == 2 * i + 1)
    assert sum(sizes) == sum(1 + i % 2 for i in range(1000))
    assert max(sizes) > 1 and max(sizes) <= 32
    assert stats.executed_requests == 1000


async def test_a_held_batcher_waits_for_that_many_requests_before_its_first_batch_only() -> None:
    """Triton's TRITONSERVER_DELAY_SCHEDULER (``hold_first_batches``): with 3, two requests that make a
    preferred batch wait for a third; then all three form one batch (the largest preferred size), and
    later requests are not held."""
    from deployments.runtime.batch_execute import hold_first_batches

    rec = Recorder()
    hold_first_batches(3)
    try:
        batcher = DynamicBatcher(
            config(preferred_batch_size=(2, 3), max_queue_delay_microseconds=30_000_000), 8, INPUTS, rec
        )
    finally:
        hold_first_batches(0)
    first = [asyncio.ensure_future(batcher.submit(request(str(i)))) for i in range(2)]
    await asyncio.sleep(0.05)
    assert rec.rows == [] and not any(t.done() for t in first)  # a preferred batch of 2, held
    third = asyncio.ensure_future(batcher.submit(request("2")))
    await asyncio.wait_for(asyncio.gather(*first, third), 5)
    assert rec.rows == [3]
    await asyncio.wait_for(submit_all(batcher, [request("3"), request("4")]), 5)
    assert rec.rows == [3, 2]  # not held again
    await batcher.close()
