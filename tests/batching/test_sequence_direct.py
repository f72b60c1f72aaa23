"""The sequence batcher's Direct strategy and lifecycle, with a fake accumulating backend."""

from __future__ import annotations

import asyncio
import random
import time

import numpy as np

from deployments.runtime.sequence import SequenceBatcher
from repository_loader.errors import Cancelled, InvalidArgument, Unavailable
from repository_loader.model import ModelDescription
from tests.batching.fakes import until
from tests.batching.sequence_models import (
    SCHEDULER_STATE,
    Accumulator,
    out,
    req,
    run_sequences,
    running_sums,
    sequence_model,
)


async def test_64_interleaved_sequences_each_get_their_own_running_sums() -> None:
    acc = Accumulator(delay=0.001)
    # scheduler-held state: the replica may run two instances' batches at once
    model = sequence_model(max_batch_size=8, extra=SCHEDULER_STATE)
    batcher = SequenceBatcher(model, acc, max_concurrent_batches=2)
    rng = random.Random(7)
    sequences = {cid: [float(rng.randint(1, 9)) for _ in range(rng.randint(1, 6))] for cid in range(1, 65)}
    got = await run_sequences(batcher, sequences)
    assert got == {cid: running_sums(values) for cid, values in sequences.items()}
    assert max(len(b) for b in acc.batches) > 1  # sequences shared batches
    assert acc.max_active == 2  # both instances ran at once
    await batcher.close()


async def test_control_tensors_at_start_middle_and_end() -> None:
    acc = Accumulator()
    batcher = SequenceBatcher(sequence_model(), acc)
    await batcher.submit(req(42, 1.0, start=True))
    await batcher.submit(req(42, 2.0))
    await batcher.submit(req(42, 3.0, end=True))
    assert [b[0] for b in acc.batches] == [(42, 1, 0.0, True), (42, 0, 0.0, True), (42, 0, 1.0, True)]
    inputs = acc.inputs[0][0]
    assert inputs["START"].dtype == np.int32 and inputs["START"].shape == (1, 1)
    assert inputs["END"].dtype == np.float32 and inputs["READY"].dtype == np.bool_
    assert inputs["CORRID"].dtype == np.uint64 and inputs["CORRID"].shape == (1, 1)
    single = SequenceBatcher(sequence_model(), Accumulator())
    response = await single.submit(req(7, 5.0, start=True, end=True))
    assert out(response) == 5.0


async def test_controls_of_a_model_without_batching_have_no_batch_dimension() -> None:
    acc = Accumulator()
    batcher = SequenceBatcher(sequence_model(max_batch_size=0), acc)
    await batcher.submit(req(3, 1.0, start=True))
    assert acc.inputs[0][0]["START"].shape == (1,)


async def test_each_sequence_keeps_its_slot_and_empty_slots_below_are_padded_not_ready() -> None:
    acc = Accumulator()
    batcher = SequenceBatcher(sequence_model(max_batch_size=4), acc)
    for cid in (1, 2, 3):  # slots 0, 1, 2
        await batcher.submit(req(cid, 1.0, start=True))
    acc.batches.clear()
    got = await asyncio.gather(batcher.submit(req(1, 1.0)), batcher.submit(req(3, 1.0)))
    assert [out(r) for r in got] == [2.0, 2.0]
    # one batch: slot 0 = sequence 1, slot 1 padded (READY false, CORRID 0), slot 2 = sequence 3, no slot 3
    assert acc.batches == [[(1, 0, 0.0, True), (0, 0, 0.0, False), (3, 0, 0.0, True)]]


async def test_string_and_uint64_correlation_ids() -> None:
    acc = Accumulator()
    batcher = SequenceBatcher(sequence_model(corrid_type="TYPE_STRING"), acc)
    sequences: dict[object, list[float]] = {"alpha": [1.0, 2.0], "beta": [5.0, 5.0, 5.0]}
    assert await run_sequences(batcher, sequences) == {"alpha": [1.0, 3.0], "beta": [5.0, 10.0, 15.0]}
    assert acc.inputs[0][0]["CORRID"].dtype == np.object_
    big = 2**64 - 1
    numeric = SequenceBatcher(sequence_model(), Accumulator())
    assert await run_sequences(numeric, {big: [1.0, 1.0]}) == {big: [1.0, 2.0]}
    response = await numeric.submit(req("text", 1.0, start=True))
    assert isinstance(response.error, InvalidArgument) and "TYPE_UINT64" not in str(response.error)


async def test_integer_and_string_ids_of_equal_text_are_different_sequences() -> None:
    batcher = SequenceBatcher(sequence_model(corrid_type="TYPE_STRING"), Accumulator())
    await batcher.submit(req(5, 1.0, start=True))
    response = await batcher.submit(req("5", 1.0))
    assert "must specify the START flag" in str(response.error)


async def test_rejections_use_tritons_messages() -> None:
    batcher = SequenceBatcher(sequence_model(), Accumulator())
    missing = await batcher.submit(req(9, 1.0))
    assert isinstance(missing.error, InvalidArgument)
    assert str(missing.error).endswith(
        "inference request for sequence 9 to model 'seq' must specify the START flag on the first request "
        "of the sequence"
    ) or "inference request for sequence 9 to model 'seq' must specify the START flag" in str(missing.error)
    zero = await batcher.submit(req(0, 1.0, start=True))
    assert "must specify a non-zero or non-empty correlation ID" in str(zero.error)
    empty = await batcher.submit(req("", 1.0, start=True))
    assert "must specify a non-zero or non-empty correlation ID" in str(empty.error)
    two_rows = req(4, 1.0, start=True)
    two_rows.inputs["IN"] = np.zeros((2, 1), dtype=np.float32)
    rows = await batcher.submit(two_rows)
    assert "must specify batch-size 1 due to requirements of sequence batcher" in str(rows.error)


async def test_backlog_waits_for_a_free_slot() -> None:
    acc = Accumulator()
    batcher = SequenceBatcher(sequence_model(max_batch_size=2), acc)
    await batcher.submit(req(1, 1.0, start=True))
    await batcher.submit(req(2, 1.0, start=True))
    third = asyncio.ensure_future(batcher.submit(req(3, 10.0, start=True)))
    more = asyncio.ensure_future(batcher.submit(req(3, 10.0)))  # joins its backlogged sequence
    await asyncio.sleep(0.02)
    assert not third.done() and batcher.backlog_size == 1
    await batcher.submit(req(1, 1.0, end=True))  # frees slot 0
    assert [out(await third), out(await more)] == [10.0, 20.0]
    assert batcher.backlog_size == 0 and batcher.active_sequences == 2
    assert acc.batches[-1][0][0] == 3  # sequence 3 runs in slot 0


async def test_backlog_times_out_with_the_requests_timeout() -> None:
    batcher = SequenceBatcher(sequence_model(max_batch_size=1), Accumulator())
    await batcher.submit(req(1, 1.0, start=True))
    waiting = await batcher.submit(req(2, 1.0, start=True, timeout_us=20_000))
    assert isinstance(waiting.error, Unavailable)
    assert str(waiting.error).endswith("timeout of the corresponding sequence has been expired")
    late = await batcher.submit(req(2, 1.0))
    assert "must specify the START flag" in str(late.error)


async def test_idle_sequence_is_freed_and_its_later_requests_fail() -> None:
    acc = Accumulator()
    batcher = SequenceBatcher(sequence_model(max_batch_size=1, idle_us=50_000), acc)
    started = time.monotonic()  # before sequence 1's request arrives: its idle clock starts later
    await batcher.submit(req(1, 1.0, start=True))
    backlogged = asyncio.ensure_future(batcher.submit(req(2, 7.0, start=True)))
    assert out(await backlogged) == 7.0  # took the slot once sequence 1 went idle
    assert time.monotonic() - started >= 0.05
    late = await batcher.submit(req(1, 1.0))
    assert "inference request for sequence 1 to model 'seq' must specify the START flag" in str(late.error)
    assert batcher.active_sequences == 1


async def test_start_on_a_running_sequence_restarts_it_in_its_slot() -> None:
    acc = Accumulator()
    batcher = SequenceBatcher(sequence_model(max_batch_size=2), acc)
    assert await run_sequences(batcher, {1: [1.0, 2.0]}) == {1: [1.0, 3.0]}
    await batcher.submit(req(5, 4.0, start=True))
    await batcher.submit(req(5, 4.0))
    restarted = await batcher.submit(req(5, 1.0, start=True))
    assert out(restarted) == 1.0 and batcher.active_sequences == 1
    assert out(await batcher.submit(req(5, 1.0, end=True))) == 2.0
    assert batcher.active_sequences == 0


def _utilization_model(delay_us: int) -> ModelDescription:
    return sequence_model(
        strategy=f"direct {{ max_queue_delay_microseconds: {delay_us} minimum_slot_utilization: 0.75 }}",
        max_batch_size=4,
    )


async def test_minimum_slot_utilization_holds_a_batch_until_the_delay() -> None:
    acc = Accumulator()
    batcher = SequenceBatcher(_utilization_model(100_000), acc)
    started = time.monotonic()
    await asyncio.gather(*(batcher.submit(req(c, 1.0, start=True)) for c in (1, 2)))
    assert time.monotonic() - started >= 0.09  # 2 of 4 slots: waited for the delay
    assert len(acc.batches) == 1
    # 3 of 4 slots meet the utilization: they run at once, not after a delay longer than the wait here
    acc = Accumulator()
    batcher = SequenceBatcher(_utilization_model(60_000_000), acc)
    for starting in (True, False):
        calls = (batcher.submit(req(c, 1.0, start=starting)) for c in (1, 2, 3))
        await asyncio.wait_for(asyncio.gather(*calls), 10)
    assert [len(b) for b in acc.batches] == [3, 3]


async def test_a_cancelled_pending_request_cancels_its_sequence_and_frees_the_slot() -> None:
    """Triton: cancelling a pending request of a sequence cancels the sequence's other pending
    requests (CANCELLED) and ends it; the request already running goes on."""
    gate = asyncio.Event()
    acc = Accumulator(gate=gate)
    batcher = SequenceBatcher(sequence_model(max_batch_size=1), acc)
    first = asyncio.ensure_future(batcher.submit(req(1, 1.0, start=True)))
    await until(lambda: acc.active == 1)  # the START runs (held by the gate)
    dropped = asyncio.ensure_future(batcher.submit(req(1, 100.0)))
    pending = asyncio.ensure_future(batcher.submit(req(1, 5.0)))
    await asyncio.sleep(0.01)
    dropped.cancel()
    answer = await asyncio.wait_for(pending, 5)
    assert isinstance(answer.error, Cancelled) and answer.error.grpc_status == "CANCELLED"
    late = await batcher.submit(req(1, 2.0, end=True))  # the sequence is over
    assert "must specify the START flag" in str(late.error)
    gate.set()
    assert out(await first) == 1.0
    await until(lambda: batcher.active_sequences == 0)
    fresh = await batcher.submit(req(2, 7.0, start=True, end=True))  # the slot is free again
    assert out(fresh) == 7.0
    assert [row[0] for batch in acc.batches for row in batch] == [1, 2]  # 100 and 5 never ran


async def test_cancelling_a_backlogged_request_cancels_its_whole_sequence() -> None:
    gate = asyncio.Event()
    acc = Accumulator(gate=gate)
    batcher = SequenceBatcher(sequence_model(max_batch_size=1), acc)
    running = asyncio.ensure_future(batcher.submit(req(1, 1.0, start=True)))
    await until(lambda: acc.active == 1)
    start = asyncio.ensure_future(batcher.submit(req(2, 1.0, start=True)))
    second = asyncio.ensure_future(batcher.submit(req(2, 2.0)))
    other = asyncio.ensure_future(batcher.submit(req(3, 3.0, start=True, end=True)))
    await asyncio.sleep(0.01)
    assert batcher.backlog_size == 2
    start.cancel()
    answer = await asyncio.wait_for(second, 5)
    assert isinstance(answer.error, Cancelled)
    assert batcher.backlog_size == 1 and not batcher.holds(2)
    gate.set()
    assert out(await running) == 1.0
    await batcher.submit(req(1, 1.0, end=True))
    assert out(await other) == 3.0  # the next backlogged sequence took the slot


async def test_close_drains_and_then_refuses_new_sequences() -> None:
    batcher = SequenceBatcher(sequence_model(), Accumulator(delay=0.01))
    pending = [asyncio.ensure_future(batcher.submit(req(c, 1.0, start=True))) for c in (1, 2)]
    await asyncio.sleep(0)
    await batcher.close()
    assert [out(await p) for p in pending] == [1.0, 1.0]
    refused = await batcher.submit(req(3, 1.0, start=True))
    assert isinstance(refused.error, Unavailable)


async def test_close_without_drain_rejects_queued_and_backlogged_requests() -> None:
    gate = asyncio.Event()
    acc = Accumulator(gate=gate)
    batcher = SequenceBatcher(sequence_model(max_batch_size=1), acc)
    running = asyncio.ensure_future(batcher.submit(req(1, 1.0, start=True)))
    await until(lambda: acc.active == 1)  # its batch runs (until the gate opens)
    queued = asyncio.ensure_future(batcher.submit(req(1, 1.0)))
    backlogged = asyncio.ensure_future(batcher.submit(req(2, 1.0, start=True)))
    await asyncio.sleep(0)
    closing = asyncio.ensure_future(batcher.close(drain=False))
    assert isinstance((await queued).error, Unavailable)
    assert isinstance((await backlogged).error, Unavailable)
    assert not closing.done()  # the running batch is waited for
    gate.set()
    await closing
    assert out(await running) == 1.0


async def test_a_held_sequence_batcher_waits_for_requests_and_backlog_before_its_first_batch() -> None:
    """TRITONSERVER_DELAY_SCHEDULER / TRITONSERVER_BACKLOG_DELAY_SCHEDULER (``hold_first_batches``):
    two slots, a hold of 2 queued requests and 2 backlogged ones: the first two sequences wait until a
    third sequence's two requests wait behind them (the backlog counts requests, as Triton's does),
    then run in one batch; later requests are not held."""
    from deployments.runtime.batch_execute import hold_first_batches

    acc = Accumulator()
    hold_first_batches(2, backlog=2)
    try:
        batcher = SequenceBatcher(sequence_model(max_batch_size=2), acc)
    finally:
        hold_first_batches(0)
    first = [asyncio.ensure_future(batcher.submit(req(cid, 1.0, start=True))) for cid in (1, 2)]
    third = [asyncio.ensure_future(batcher.submit(req(3, 1.0, start=True)))]  # no slot: the backlog
    await asyncio.sleep(0.05)
    assert acc.batches == [] and not any(t.done() for t in [*first, *third])  # one backlogged request
    third.append(asyncio.ensure_future(batcher.submit(req(3, 2.0, end=True))))
    await asyncio.wait_for(asyncio.gather(*first), 5)
    assert [len(b) for b in acc.batches][:1] == [2]
    await asyncio.wait_for(batcher.submit(req(1, 1.0, end=True)), 5)  # frees a slot for sequence 3
    assert [out(r) for r in await asyncio.wait_for(asyncio.gather(*third), 5)] == [1.0, 3.0]
    await batcher.close()


async def test_an_iterative_sequence_is_one_request_its_controls_filled_by_the_scheduler() -> None:
    """``iterative_sequence: true``: a request without a sequence ID or flags is a whole sequence (START
    and END), under an ID of the server's own; one with an ID keeps it."""
    acc = Accumulator()
    batcher = SequenceBatcher(sequence_model(extra="iterative_sequence: true"), acc)
    first = await batcher.submit(req(0, 2.0))
    second = await batcher.submit(req(0, 3.0))
    assert out(first) == 2.0 and out(second) == 3.0  # two sequences: no running sum across them
    (cid_a, start_a, end_a, ready_a), (cid_b, *_) = acc.batches[0][0], acc.batches[1][0]
    assert (start_a, end_a, ready_a) == (1, 1.0, True) and cid_a >= 1 << 63 and cid_b == cid_a + 1
    own = await batcher.submit(req(5, 4.0))
    assert out(own) == 4.0 and acc.batches[-1][0][0] == 5
    assert batcher.active_sequences == 0  # every one ended with its request
    # without the field, the same request is refused as Triton refuses it
    plain = SequenceBatcher(sequence_model(), Accumulator())
    refused = await plain.submit(req(0, 1.0))
    assert isinstance(refused.error, InvalidArgument) and "correlation ID" in refused.error.message
    await batcher.close()
    await plain.close()
