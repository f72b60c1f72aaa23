"""The sequence batcher's Oldest strategy: dynamic batches across candidate sequences."""

from __future__ import annotations

import asyncio
import random

from deployments.runtime.batching import make_scheduler
from deployments.runtime.sequence import SequenceBatcher
from tests.batching.sequence_models import Accumulator, out, req, run_sequences, running_sums, sequence_model


def oldest(candidates: int = 8, preferred: str = "", delay_us: int = 0) -> str:
    return (
        f"oldest {{ max_candidate_sequences: {candidates} {preferred} "
        f"max_queue_delay_microseconds: {delay_us} }}"
    )


async def test_batches_hold_several_sequences_at_most_one_request_each_in_order() -> None:
    acc = Accumulator(delay=0.002)
    batcher = make_scheduler(sequence_model(strategy=oldest(8, delay_us=2000), max_batch_size=8), acc)
    rng = random.Random(3)
    sequences = {cid: [float(rng.randint(1, 9)) for _ in range(rng.randint(2, 6))] for cid in range(1, 65)}
    got = await run_sequences(batcher, sequences)
    assert got == {cid: running_sums(values) for cid, values in sequences.items()}
    assert max(len(b) for b in acc.batches) > 1
    for batch in acc.batches:
        ids = [row[0] for row in batch]
        assert len(ids) == len(set(ids))  # one request per sequence per batch
        assert all(row[3] for row in batch)  # no padding in Oldest
    await batcher.close()


async def test_requests_of_one_sequence_never_share_a_batch_and_keep_their_order() -> None:
    acc = Accumulator(delay=0.005)
    batcher = make_scheduler(sequence_model(strategy=oldest(4, delay_us=20000), max_batch_size=8), acc)
    await batcher.submit(req(1, 1.0, start=True))
    results = await asyncio.gather(*(batcher.submit(req(1, 1.0, end=i == 4)) for i in range(5)))
    assert [r.outputs["OUT"][0, 0] for r in results] == [2.0, 3.0, 4.0, 5.0, 6.0]
    assert all(len(b) == 1 for b in acc.batches)


async def test_preferred_batch_size_cuts_the_batch_without_waiting() -> None:
    acc = Accumulator()
    model = sequence_model(
        strategy=oldest(8, "preferred_batch_size: [ 4 ]", delay_us=600_000_000), max_batch_size=8
    )
    batcher = make_scheduler(model, acc)
    # the queue delay (ten minutes) would outlast the wait: only the cut answers in time
    submitted = asyncio.gather(*(batcher.submit(req(c, 1.0, start=True)) for c in range(1, 5)))
    await asyncio.wait_for(submitted, 30)
    assert [len(b) for b in acc.batches] == [4]


async def test_more_sequences_than_candidates_wait_in_the_backlog() -> None:
    acc = Accumulator()
    batcher = make_scheduler(sequence_model(strategy=oldest(2), max_batch_size=4), acc)
    sequences = {cid: [1.0, 2.0, 3.0] for cid in range(1, 7)}
    assert await run_sequences(batcher, sequences) == {cid: [1.0, 3.0, 6.0] for cid in sequences}
    assert max(len(b) for b in acc.batches) <= 2


async def test_a_sequence_waiting_in_the_dynamic_batcher_is_not_idle() -> None:
    """Triton counts a sequence idle only while it has no request queued: a lone sequence whose requests
    each wait out a queue delay as long as the idle limit keeps its slot, step after step."""
    acc = Accumulator()
    model = sequence_model(
        strategy=oldest(2, "preferred_batch_size: [ 2 ]", delay_us=60_000), max_batch_size=4, idle_us=50_000
    )
    batcher = make_scheduler(model, acc)
    assert isinstance(batcher, SequenceBatcher)
    loop = asyncio.get_running_loop()
    started = loop.time()
    sequences: dict[object, list[float]] = {7: [1.0, 2.0, 3.0]}
    assert await run_sequences(batcher, sequences) == {7: [1.0, 3.0, 6.0]}
    assert loop.time() - started >= 0.18  # each step waited out the 60 ms delay, past the 50 ms limit
    assert [len(b) for b in acc.batches] == [1, 1, 1]
    await batcher.close()


async def test_the_idle_clock_starts_when_the_last_request_is_answered() -> None:
    """A gap longer than the idle limit, counted from the answer, frees the slot; requests queued then
    run first."""
    acc = Accumulator(delay=0.03)
    batcher = make_scheduler(sequence_model(strategy=oldest(1), max_batch_size=4, idle_us=50_000), acc)
    assert isinstance(batcher, SequenceBatcher)
    await batcher.submit(req(1, 1.0, start=True))
    await asyncio.sleep(0.035)  # 35 ms after the answer, 65 ms after the request came
    assert out(await batcher.submit(req(1, 2.0))) == 3.0
    await asyncio.sleep(0.08)
    late = await batcher.submit(req(1, 4.0))
    assert "inference request for sequence 1 to model 'seq' must specify the START flag" in str(late.error)
    assert batcher.active_sequences == 0
    await batcher.close()


async def test_a_cancelled_pending_request_cancels_its_sequence() -> None:
    """As with Direct: the request the dynamic batcher runs goes on, the sequence's pending ones are
    answered CANCELLED and the candidate slot is free for the next sequence."""
    from repository_loader.errors import Cancelled

    gate = asyncio.Event()
    acc = Accumulator(gate=gate)
    batcher = make_scheduler(sequence_model(strategy=oldest(1), max_batch_size=1), acc)
    running = asyncio.ensure_future(batcher.submit(req(1, 1.0, start=True)))
    await asyncio.sleep(0.02)
    dropped = asyncio.ensure_future(batcher.submit(req(1, 10.0)))
    pending = asyncio.ensure_future(batcher.submit(req(1, 20.0)))
    waiting = asyncio.ensure_future(batcher.submit(req(2, 3.0, start=True, end=True)))  # backlogged
    await asyncio.sleep(0.02)
    dropped.cancel()
    answer = await asyncio.wait_for(pending, 5)
    assert isinstance(answer.error, Cancelled)
    gate.set()
    assert out(await running) == 1.0
    assert out(await asyncio.wait_for(waiting, 5)) == 3.0
    assert [row[0] for batch in acc.batches for row in batch] == [1, 2]
    await batcher.close()
