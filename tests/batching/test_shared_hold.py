"""The first-batch hold counted over a model's replicas (TRITONSERVER_DELAY_SCHEDULER): schedulers of
one model in different replicas add their counts on one board, as tritonserver adds every instance's.
Two batchers here stand for two replicas; the board is the one the server application keeps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from deployments.runtime.batch_execute import HeldCount, HoldBoard, hold_first_batches
from deployments.runtime.batching import DynamicBatcher
from deployments.runtime.sequence import SequenceBatcher
from tests.batching.fakes import INPUTS, Recorder, config, request, until
from tests.batching.sequence_models import Accumulator, out, req, sequence_model


class BoardCount:
    """A ``HeldCount`` on an in-process board (the server application's, without Ray)."""

    def __init__(self, counts: BoardCounts, model: str, reporter: str, requests: int, backlog: int) -> None:
        self.counts, self.model, self.reporter = counts, model, reporter
        self.requests, self.backlog = requests, backlog

    async def reached(self, queued: int, backlogged: int) -> bool:
        self.counts.asked += 1
        if self.counts.failing:
            raise ConnectionError("the server application is away")
        return self.counts.board.report(
            self.model, self.reporter, queued, backlogged, self.requests, self.backlog
        )

    async def forget(self) -> None:
        self.counts.board.forget(self.model, self.reporter)


class BoardCounts:
    """A ``HeldCounts``: every scheduler made while it is the process's hold reports here."""

    def __init__(self) -> None:
        self.board = HoldBoard()
        self.asked = 0
        self.failing = False
        self._made = 0

    def __call__(self, model: str, requests: int, backlog: int) -> HeldCount:
        self._made += 1
        return BoardCount(self, model, f"replica/{self._made}", requests, backlog)


@pytest.fixture
def counts() -> Iterator[BoardCounts]:
    yield BoardCounts()
    hold_first_batches(0)


def sequence_batchers(
    counts: BoardCounts, requests: int, backlog: int = 0, slots: int = 4
) -> list[SequenceBatcher]:
    hold_first_batches(requests, backlog, counts)
    return [SequenceBatcher(sequence_model(max_batch_size=slots), Accumulator()) for _ in range(2)]


def accumulated(batcher: SequenceBatcher) -> list[int]:
    acc = batcher._execute
    assert isinstance(acc, Accumulator)
    return [len(b) for b in acc.batches]


async def test_two_replicas_sequence_batchers_release_together_when_their_sum_reaches_the_hold(
    counts: BoardCounts,
) -> None:
    a, b = sequence_batchers(counts, requests=3)
    on_a = [asyncio.ensure_future(a.submit(req(cid, 1.0, start=True))) for cid in (1, 2)]
    await asyncio.sleep(0.1)
    assert accumulated(a) == [] and not any(t.done() for t in on_a)  # 2 of 3, though all on one replica
    on_b = asyncio.ensure_future(b.submit(req(3, 5.0, start=True)))
    responses = await asyncio.wait_for(asyncio.gather(*on_a, on_b), 5)
    assert [out(r) for r in responses] == [1.0, 1.0, 5.0]
    assert accumulated(a) == [2] and accumulated(b) == [1]  # each released with what it held
    await asyncio.wait_for(a.submit(req(1, 1.0, end=True)), 5)  # not held again
    await a.close()
    await b.close()


async def test_the_backlog_is_counted_over_the_replicas_too(counts: BoardCounts) -> None:
    """One slot per replica, a hold of 2 queued and 2 backlogged requests: the sequences waiting for a
    slot on each replica add up."""
    a, b = sequence_batchers(counts, requests=2, backlog=2, slots=1)
    started = [
        asyncio.ensure_future(a.submit(req(1, 1.0, start=True))),
        asyncio.ensure_future(b.submit(req(2, 1.0, start=True))),
    ]
    waiting = [asyncio.ensure_future(a.submit(req(3, 1.0, start=True, end=True)))]  # a's backlog
    await asyncio.sleep(0.1)
    assert accumulated(a) == accumulated(b) == []  # 2 queued, 1 backlogged
    waiting.append(asyncio.ensure_future(b.submit(req(4, 1.0, start=True, end=True))))  # b's backlog
    await asyncio.wait_for(asyncio.gather(*started), 5)
    assert accumulated(a) == accumulated(b) == [1]
    for batcher, cid in ((a, 1), (b, 2)):  # each sequence's END frees its slot for the backlogged one
        await asyncio.wait_for(batcher.submit(req(cid, 1.0, end=True)), 5)
    assert [out(r) for r in await asyncio.wait_for(asyncio.gather(*waiting), 5)] == [1.0, 1.0]
    await a.close()
    await b.close()


async def test_a_held_scheduler_asks_the_shared_count_every_10_ms_not_on_every_wakeup(
    counts: BoardCounts,
) -> None:
    (a, _) = sequence_batchers(counts, requests=100, slots=8)
    started = time.monotonic()
    pending = [asyncio.ensure_future(a.submit(req(cid, 1.0, start=True))) for cid in range(1, 9)]
    await asyncio.sleep(0.2)
    await until(lambda: counts.asked >= 5)  # it keeps asking while it holds (a stalled loop asks less)
    asked, elapsed = counts.asked, time.monotonic() - started
    assert asked <= 2 + elapsed / 0.010  # at most one a 10 ms, for 8 arrivals and its polls
    await a.close()  # closing ends the hold: what is queued runs
    assert all(out(r) == 1.0 for r in await asyncio.wait_for(asyncio.gather(*pending), 5))


async def test_where_the_shared_count_fails_the_scheduler_s_own_count_decides(counts: BoardCounts) -> None:
    counts.failing = True
    (a, _) = sequence_batchers(counts, requests=2)
    first = asyncio.ensure_future(a.submit(req(1, 1.0, start=True)))
    await asyncio.sleep(0.05)
    assert not first.done()
    second = asyncio.ensure_future(a.submit(req(2, 1.0, start=True)))
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert accumulated(a) == [2]
    await a.close()


def dynamic_batchers(counts: BoardCounts, requests: int, n: int = 2) -> list[tuple[DynamicBatcher, Recorder]]:
    hold_first_batches(requests, 0, counts)
    made = []
    for _ in range(n):
        rec = Recorder()
        made.append(
            (DynamicBatcher(config(max_queue_delay_microseconds=0), 8, INPUTS, rec, model_name="m"), rec)
        )
    return made


async def test_two_replicas_dynamic_batchers_count_their_queues_together(counts: BoardCounts) -> None:
    """Triton's dynamic batcher is one queue for every instance of a model: the replicas' queues add up."""
    (a, rec_a), (b, rec_b) = dynamic_batchers(counts, requests=3)
    on_a = [asyncio.ensure_future(a.submit(request(str(i)))) for i in range(2)]
    await asyncio.sleep(0.1)
    assert rec_a.rows == [] and not any(t.done() for t in on_a)
    on_b = asyncio.ensure_future(b.submit(request("2")))
    await asyncio.wait_for(asyncio.gather(*on_a, on_b), 5)
    assert rec_a.rows == [2] and rec_b.rows == [1]
    # a third replica's batcher sees the counts the others last reported, as Triton's instances do
    ((c, rec_c),) = dynamic_batchers(counts, requests=3, n=1)
    await asyncio.wait_for(c.submit(request("3")), 5)
    assert rec_c.rows == [1]
    for batcher in (a, b, c):
        await batcher.close()
    # once they closed their counts are gone: a new batcher holds again
    ((d, rec_d),) = dynamic_batchers(counts, requests=3, n=1)
    held = asyncio.ensure_future(d.submit(request("4")))
    await asyncio.sleep(0.05)
    assert rec_d.rows == [] and not held.done()
    await d.close()
    await asyncio.wait_for(held, 5)


async def test_the_oldest_strategy_s_batchers_count_their_own_queues(counts: BoardCounts) -> None:
    """As tritonserver's per-instance dynamic batcher of the Oldest strategy: never the shared count."""
    hold_first_batches(2, 0, counts)
    batcher = SequenceBatcher(
        sequence_model(strategy="oldest { max_candidate_sequences: 4 }"),
        Accumulator(),
        dynamic_batcher=DynamicBatcher,
    )
    pending = [asyncio.ensure_future(batcher.submit(req(cid, 1.0, start=True))) for cid in (1, 2)]
    await asyncio.wait_for(asyncio.gather(*pending), 5)
    assert counts.asked == 0
    await batcher.close()
