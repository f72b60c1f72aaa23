"""A stateful model with several instances runs one instance per replica, and a sequence runs on the
replica owning its ID; one replica may own most live sequences. Its batcher holds the slots of every
instance of the model, as Triton's one batcher does, so sequences Triton runs at once never wait in a
replica's backlog, where the sequences holding its slots would go idle meanwhile (no Ray running)."""

from __future__ import annotations

import asyncio
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deployments.inference import InferRequest, InferResponse
from deployments.runtime.batching import make_scheduler
from deployments.runtime.forward_order import SEQUENCE_ORDER, Order
from deployments.runtime.model import ModelRuntime
from deployments.runtime.router import (
    ABSENT_REPLY,
    FORWARDED,
    PROBE,
    Ranks,
    RawReply,
    RawRequest,
    Router,
    is_absent,
    is_taken,
    owner_rank,
)
from deployments.runtime.sequence import SequenceBatcher
from deployments.runtime.sequence_config import SequenceSettings, model_instances
from tests.batching.fakes import until
from tests.batching.sequence_models import (
    MODELS,
    SCHEDULER_STATE,
    Accumulator,
    from_text,
    out,
    req,
    sequence_model,
)

STEPS = 8
WORKERS = 8  # client threads: each step of every sequence is sent before the next step starts


async def _step_by_step(
    send: Any, cids: list[int], steps: int = STEPS, workers: int = WORKERS
) -> dict[int, list[InferResponse]]:
    """Every sequence's ``steps`` requests, step by step: a step's requests go out over ``workers``
    workers, and the next step starts once every sequence answered this one."""
    answers: dict[int, list[InferResponse]] = {cid: [] for cid in cids}

    async def worker(jobs: asyncio.Queue[int], step: int) -> None:
        while not jobs.empty():
            cid = jobs.get_nowait()
            answers[cid].append(await send(cid, step, step == 0, step == steps - 1))

    for step in range(steps):
        jobs: asyncio.Queue[int] = asyncio.Queue()
        for cid in cids:
            if not answers[cid] or answers[cid][-1].error is None:
                jobs.put_nowait(cid)
        await asyncio.gather(*(worker(jobs, step) for _ in range(workers)))
    return answers


def test_the_model_instances_count_every_group_and_named_gpu() -> None:
    assert model_instances(sequence_model()) == 1
    assert model_instances(sequence_model(instances=2)) == 2
    # a replica holds one instance's slots where the backend keeps the state, every instance's where
    # the scheduler does
    assert SequenceSettings.from_model(sequence_model(instances=3)).instances == 1
    assert SequenceSettings.from_model(sequence_model(instances=3, extra=SCHEDULER_STATE)).instances == 3
    text = (
        'name: "g" backend: "python" max_batch_size: 8 '
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ] '
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ] '
        "sequence_batching { direct { } } "
        "instance_group [ { kind: KIND_GPU count: 2 gpus: [ 0, 1 ] }, { kind: KIND_CPU count: 1 } ]"
    )
    assert model_instances(from_text(text, Path("/nonexistent/g"))) == 5


async def test_a_replica_of_a_model_keeping_its_own_state_holds_one_instances_slots() -> None:
    """Triton's contract: an instance sees no more sequences than its slots, each in its own batch slot
    (a model without batching keeps one sequence's state per instance). The ninth sequence waits."""
    acc = Accumulator()
    batcher = SequenceBatcher(sequence_model(max_batch_size=8, instances=2), acc)
    starts = await asyncio.gather(*(batcher.submit(req(cid, 1.0, start=True)) for cid in range(1, 9)))
    assert [out(r) for r in starts] == [1.0] * 8
    ninth = asyncio.ensure_future(batcher.submit(req(9, 5.0, start=True)))
    await until(lambda: batcher.backlog_size == 1)
    assert batcher.active_sequences == 8 and len(batcher.instances) == 1
    assert out(await batcher.submit(req(1, 1.0, end=True))) == 2.0
    assert out(await ninth) == 5.0
    await batcher.close(drain=False)


async def test_a_replica_of_a_two_instance_model_with_scheduler_state_holds_the_slots_of_both() -> None:
    acc = Accumulator()
    batcher = SequenceBatcher(sequence_model(max_batch_size=8, instances=2, extra=SCHEDULER_STATE), acc)
    starts = await asyncio.gather(*(batcher.submit(req(cid, 1.0, start=True)) for cid in range(1, 17)))
    assert [out(r) for r in starts] == [1.0] * 16
    assert batcher.active_sequences == 16 and batcher.backlog_size == 0
    acc.batches.clear()
    steps = await asyncio.gather(*(batcher.submit(req(cid, 1.0)) for cid in range(1, 17)))
    assert [out(r) for r in steps] == [2.0] * 16
    # the first instance's 8 slots fill before the second's: two full batches, one at a time
    assert [len(b) for b in acc.batches] == [8, 8]
    assert all(ready for batch in acc.batches for *_, ready in batch)
    assert acc.max_active == 1
    seventeenth = asyncio.ensure_future(batcher.submit(req(17, 5.0, start=True)))
    await until(lambda: batcher.backlog_size == 1)
    assert out(await batcher.submit(req(1, 1.0, end=True))) == 3.0
    assert out(await seventeenth) == 5.0
    await batcher.close(drain=False)


async def test_new_sequences_take_slot_zero_of_each_instance_that_runs_at_once_first() -> None:
    """Triton's free-slot order: the lowest slot index over the instances, so two sequences run in two
    batches at once, not in one batch of two."""
    acc = Accumulator()
    model = sequence_model(max_batch_size=8, instances=2, extra=SCHEDULER_STATE)
    batcher = SequenceBatcher(model, acc, max_concurrent_batches=2)
    await asyncio.gather(*(batcher.submit(req(cid, 1.0, start=True)) for cid in (1, 2)))
    acc.batches.clear()
    steps = await asyncio.gather(*(batcher.submit(req(cid, 1.0)) for cid in (1, 2)))
    assert [out(r) for r in steps] == [2.0, 2.0]
    assert sorted(len(b) for b in acc.batches) == [1, 1]
    await batcher.close(drain=False)


@pytest.mark.parametrize("strategy", ["direct { }", "oldest { max_candidate_sequences: 8 }"])
async def test_twelve_sequences_step_by_step_on_one_replica_of_a_two_instance_model(strategy: str) -> None:
    """12 sequences, 8 steps, 8 workers, Triton's 1 s idle limit, every sequence on this replica: a
    replica with one instance's 8 slots backlogged 4 STARTs until the 8 sequences holding the slots
    went idle, and those then failed their second step for want of a START."""
    model = sequence_model(strategy, max_batch_size=8, idle_us=1_000_000, instances=2, extra=SCHEDULER_STATE)
    batcher = make_scheduler(model, Accumulator(delay=0.001))
    assert isinstance(batcher, SequenceBatcher)

    async def send(cid: int, step: int, start: bool, end: bool) -> InferResponse:
        return await batcher.submit(req(cid, float(step + 1), start=start, end=end))

    answers = await asyncio.wait_for(_step_by_step(send, list(range(1, 13))), 10)
    for cid, responses in answers.items():
        assert [r.error for r in responses] == [None] * STEPS, cid
        assert [out(r) for r in responses] == list(np.cumsum(range(1, STEPS + 1))), cid
    await batcher.close()


async def test_a_slot_kept_for_a_lent_sequence_takes_only_its_start_and_is_released_if_it_never_comes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    acc = Accumulator()
    batcher = SequenceBatcher(sequence_model(max_batch_size=2, idle_us=50_000), acc)
    assert batcher.reserve(5) and batcher.holds(5) and batcher.has_free_slot()
    assert not batcher.reserve(5)  # kept already
    refused = await batcher.submit(req(5, 1.0))
    assert refused.error is not None and "must specify the START flag" in refused.error.message
    assert out(await batcher.submit(req(5, 2.0, start=True))) == 2.0  # into the kept slot
    assert out(await batcher.submit(req(5, 3.0, end=True))) == 5.0
    assert "started again" not in caplog.text
    assert batcher.reserve(6) and batcher.reserve(7) and not batcher.has_free_slot()
    assert not batcher.reserve(8)
    await until(lambda: not batcher.holds(6) and not batcher.holds(7))  # no START came: idle, released
    assert batcher.has_free_slot() and out(await batcher.submit(req(8, 4.0, start=True))) == 4.0
    await batcher.close(drain=False)


class InMemoryOwners:
    """``OwnerCalls`` between routers in one process: the owner's router answers, told the request
    was sent on to it (``x-triton-sequence-owner``), as a replica's HTTP app is."""

    def __init__(self) -> None:
        self.routers: dict[int, Router] = {}
        self.probes = 0  # requests asked of a replica that may hold their sequence

    async def forward(
        self,
        model: str,
        rank: int,
        request: InferRequest,
        raw: RawRequest | None,
        order: Order | None,
        probe: bool = False,
    ) -> InferResponse | RawReply:
        self.probes += probe
        headers = [(FORWARDED, str(rank).encode())]
        if order is not None:
            headers.append((SEQUENCE_ORDER, order.header().encode()))
        if probe:
            headers.append((PROBE, b"1"))
        router = self.routers.get(rank)
        if router is None:  # no replica holds the rank (the real calls answer so for a probe too)
            assert probe
            return ABSENT_REPLY
        sent_on = RawRequest(f"/v2/models/{model}/infer", headers, b"")
        answer = await router.route(request, sent_on)
        if isinstance(answer, tuple) and raw is None and not is_absent(answer) and not is_taken(answer):
            raise AssertionError("a raw reply to a request that was not raw")
        return answer


def _two_instance_accumulator(tmp: Path, strategy: str) -> Any:
    """The Python accumulator as a two-instance model with Triton's default idle limit (1 s)."""
    folder = tmp / "sequence_accumulator"
    shutil.copytree(MODELS / "sequence_accumulator", folder)
    text = (folder / "config.pbtxt").read_text()
    text = text.replace("max_sequence_idle_microseconds: 5000000", "").replace("direct { }", strategy)
    text = text.replace("count: 1", "count: 2")
    (folder / "config.pbtxt").write_text(text)
    return from_text(text, folder)


def _step_request(model: str, cid: int, value: int, start: bool, end: bool) -> InferRequest:
    return InferRequest(
        model,
        {"IN": np.array([[value]], dtype=np.int32)},
        correlation_id=cid,
        sequence_start=start,
        sequence_end=end,
    )


async def _run_to_the_end(send: Any, cids: list[int], runtimes: list[ModelRuntime]) -> None:
    """Every sequence step by step through ``send``, then the runtimes closed; each answer's running
    sum checked (the Python accumulator's ``OUT``)."""
    try:
        answers = await asyncio.wait_for(_step_by_step(send, cids), 20)
    finally:
        for runtime in runtimes:
            await runtime.close()
    for cid, responses in answers.items():
        assert [r.error for r in responses] == [None] * STEPS, cid
        assert [int(r.outputs["OUT"][0, 0]) for r in responses] == list(np.cumsum(range(1, STEPS + 1))), cid


async def _replicas_behind_routers(
    model: Any, count: int, owners: InMemoryOwners | None = None
) -> tuple[InMemoryOwners, list[ModelRuntime]]:
    """``count`` loaded runtimes of ``model``, each behind a router ranked ``0 .. count-1`` calling the
    others through ``owners`` (new in-memory calls where None)."""
    owners = InMemoryOwners() if owners is None else owners
    runtimes = []
    for rank in range(count):
        runtime = ModelRuntime(model)
        await runtime.load()
        owners.routers[rank] = Router(ranks=Ranks(model.name, rank, count), owners=owners)
        owners.routers[rank].serve(model.name, runtime)
        runtimes.append(runtime)
    return owners, runtimes


@pytest.mark.parametrize("strategy", ["direct { }", "oldest { max_candidate_sequences: 8 }"])
async def test_two_replicas_behind_their_routers_run_twelve_sequences_step_by_step(
    tmp_path: Path, strategy: str
) -> None:
    """The failing setup without Ray: two replicas of the Python accumulator (count 2, max_batch_size
    8), each a runtime behind a router ranked 0 and 1 of 2; requests land on either replica and go on
    to their owner. The sequences are numbered one after another, as clients number them, so each
    replica owns six and holds them in its own eight slots (with IDs owned 10 to 2, four backlogged
    STARTs held client threads until the sequences holding the slots went idle)."""
    model = _two_instance_accumulator(tmp_path, strategy)
    owners, runtimes = await _replicas_behind_routers(model, 2)
    cids = list(range(1001, 1013))
    assert sorted(owner_rank(c, 2) for c in cids) == [0] * 6 + [1] * 6

    async def send(cid: int, step: int, start: bool, end: bool) -> InferResponse:
        landed = owners.routers[(cid // 2 + step) % 2]  # either replica, as HAProxy picks
        request = _step_request(model.name, cid, step + 1, start, end)
        return await landed.infer(request)

    await _run_to_the_end(send, cids, runtimes)
    assert owners.routers[1].answered_here == 6 * STEPS
    assert owners.routers[0].answered_here == 6 * STEPS


async def test_sequences_live_through_a_count_change_that_keeps_their_replicas(tmp_path: Path) -> None:
    """A count change scales a stateful model in place (docs/sequence.md): the replicas serving on
    keep the sequences they hold. 2 -> 4 replicas with eight sequences live: those whose owner moved to
    a new rank are asked of the others and run where they live; 4 -> 3 with Serve removing rank 1 (its
    sequences ended) and renumbering rank 3 to 1: its live sequences still run there. New sequences
    start at their owner of the new count and never need asking."""
    model = _two_instance_accumulator(tmp_path, "direct { }")
    owners = InMemoryOwners()
    runtimes: dict[int, ModelRuntime] = {}

    async def add(rank: int, world: int) -> None:
        runtime = ModelRuntime(model)
        await runtime.load()
        runtimes[rank] = runtime
        owners.routers[rank] = Router(ranks=Ranks(model.name, rank, world), owners=owners)
        owners.routers[rank].serve(model.name, runtime)

    sums: dict[int, int] = {}

    async def step(cid: int, value: int, landed: int, start: bool = False, end: bool = False) -> None:
        request = InferRequest(
            model.name,
            {"IN": np.array([[value]], dtype=np.int32)},
            correlation_id=cid,
            sequence_start=start,
            sequence_end=end,
        )
        response = await owners.routers[landed].infer(request)
        assert response.error is None, (cid, response.error)
        sums[cid] = sums.get(cid, 0) + value
        assert int(response.outputs["OUT"][0, 0]) == sums[cid], cid

    try:
        for rank in range(2):
            await add(rank, 2)
        old = list(range(1, 9))
        for cid in old:
            await step(cid, cid, landed=cid % 2, start=True)
        held = {rank: sorted(c for c in old if runtimes[rank].holds_sequence(c)) for rank in runtimes}
        assert held == {0: [2, 4, 6, 8], 1: [1, 3, 5, 7]}
        # 2 -> 4: two replicas added with the new count, the two kept ones told it
        for rank in (2, 3):
            await add(rank, 4)
        for rank in (0, 1):
            owners.routers[rank].ranks.world_size = 4  # type: ignore[union-attr]
        for cid in old:  # land anywhere; 3 and 7 now have owner 3, 2 and 6 owner 2: asked, not lost
            await step(cid, 10, landed=(cid * 3) % 4)
        assert owners.probes > 0
        new = list(range(9, 17))
        for cid in new:
            await step(cid, 1, landed=cid % 4, start=True)
        assert all(runtimes[owner_rank(c, 4)].holds_sequence(c) for c in new)
        asked = owners.probes
        for cid in new:
            await step(cid, 2, landed=(cid + 1) % 4)
        assert owners.probes == asked  # a sequence started under the new count is at its owner
        # 4 -> 3: rank 1's sequences end, Serve removes it and gives rank 3's replica rank 1
        for cid in [c for c in old + new if runtimes[1].holds_sequence(c)]:
            await step(cid, 1, landed=1, end=True)
        del owners.routers[1]
        await runtimes.pop(1).close()
        owners.routers[1] = owners.routers.pop(3)
        runtimes[1] = runtimes.pop(3)
        for router in owners.routers.values():
            router.ranks.world_size = 3  # type: ignore[union-attr]
        owners.routers[1].ranks.rank = 1  # type: ignore[union-attr]
        live = [c for c in old + new if any(r.holds_sequence(c) for r in runtimes.values())]
        assert live and any(runtimes[1].holds_sequence(c) for c in live)
        for cid in live:
            await step(cid, 5, landed=cid % 3, end=True)
        assert not any(r.holds_sequence(c) for r in runtimes.values() for c in old + new)
        # a request of a sequence nobody holds still fails for its missing START, after asking
        request = InferRequest(model.name, {"IN": np.array([[1]], dtype=np.int32)}, correlation_id=99)
        failed = await owners.routers[0].infer(request)
        assert failed.error is not None and "must specify the START flag" in failed.error.message
    finally:
        for runtime in runtimes.values():
            await runtime.close()


async def test_a_probed_replica_that_does_not_hold_the_sequence_answers_absent_without_queuing() -> None:
    """A probe runs the request only where the sequence lives; elsewhere the answer is ABSENT at once and
    the runner never sees it (no missing-START failure counted there)."""

    class Holding:
        def __init__(self, live: set[int]) -> None:
            self.live = live
            self.calls: list[int | str] = []

        def holds_sequence(self, cid: int | str) -> bool:
            return cid in self.live

        async def infer(self, request: InferRequest) -> InferResponse:
            self.calls.append(request.correlation_id)
            return InferResponse(id="ran")

        def infer_stream(self, request: InferRequest) -> Any:
            raise AssertionError("not streamed")

    runner = Holding({7})
    router = Router(ranks=Ranks("m", 0, 2), owners=InMemoryOwners())
    router.serve("m", runner)
    probe = RawRequest("/v2/models/m/infer", [(FORWARDED, b"0"), (PROBE, b"1")], b"")
    asked = InferRequest("m", {"IN": np.zeros((1, 1), np.int32)}, correlation_id=8)
    assert await router.route(asked, probe) == ABSENT_REPLY and runner.calls == []
    held = InferRequest("m", {"IN": np.zeros((1, 1), np.int32)}, correlation_id=7)
    answer = await router.route(held, probe)
    assert isinstance(answer, InferResponse) and answer.id == "ran" and runner.calls == [7]
    start = InferRequest("m", {"IN": np.zeros((1, 1), np.int32)}, correlation_id=8, sequence_start=True)
    # a probed START is a full owner's offer, never run: this runner keeps no slots for one
    assert await router.route(start, probe) == ABSENT_REPLY and runner.calls == [7]


async def test_an_owner_with_no_free_slot_lends_new_sequences_to_a_replica_that_has_one(
    tmp_path: Path,
) -> None:
    """Twelve sequences whose IDs all belong to rank 0 (even IDs, two replicas of eight slots each):
    rank 0 fills its eight slots and lends the four others to rank 1, where they run to their END, as
    Triton's one set of slots over both instances runs all twelve at once. Before, the four waited in
    rank 0's backlog while rank 1 stood idle, and failed once the sequences holding the slots went idle."""
    model = _two_instance_accumulator(tmp_path, "direct { }")
    owners, runtimes = await _replicas_behind_routers(model, 2)
    cids = list(range(2, 26, 2))
    assert {owner_rank(c, 2) for c in cids} == {0}
    held_after_start: dict[int, list[int]] = {}

    async def send(cid: int, step: int, start: bool, end: bool) -> InferResponse:
        landed = owners.routers[(cid // 2 + step) % 2]  # either replica, as HAProxy picks
        request = _step_request(model.name, cid, step + 1, start, end)
        answer = await landed.infer(request)
        if step == 0:
            held_after_start[cid] = [r for r, runtime in enumerate(runtimes) if runtime.holds_sequence(cid)]
        return answer

    await _run_to_the_end(send, cids, runtimes)
    assert sorted(held_after_start.values()) == [[0]] * 8 + [[1]] * 4
    assert owners.routers[0].lent_count == 4 and owners.routers[1].answered_here == 4 * STEPS
    assert owners.routers[0].lent == {}  # each lent sequence forgotten once its END was sent on
    assert owners.probes == 4  # one ask per lent sequence: rank 1 had a free slot each time


class _Slots:
    """A runner with ``free`` slots for new sequences, recording what it ran."""

    def __init__(self, free: int, idle_ns: int = 1_000_000_000) -> None:
        self.free = free
        self.idle_ns = idle_ns
        self.live: set[int | str] = set()
        self.calls: list[tuple[int | str, bool]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    def holds_sequence(self, cid: int | str) -> bool:
        return cid in self.live

    def can_start_sequence(self, version: str) -> bool:
        return self.free > 0

    def reserve_sequence(self, version: str, cid: int | str) -> bool:
        if self.free <= 0:
            return False
        self.free -= 1
        self.live.add(cid)
        return True

    def sequence_idle_ns(self) -> int:
        return self.idle_ns

    async def infer(self, request: InferRequest) -> InferResponse:
        if request.sequence_start and request.correlation_id not in self.live:
            self.free -= 1
            self.live.add(request.correlation_id)
        self.calls.append((request.correlation_id, request.sequence_start))
        await self.gate.wait()
        return InferResponse(id=str(len(self.calls)))

    def infer_stream(self, request: InferRequest) -> Any:
        raise AssertionError("not streamed")


def _request(cid: int, start: bool = False, end: bool = False) -> InferRequest:
    return InferRequest(
        "m", {"IN": np.zeros((1, 1), np.int32)}, correlation_id=cid, sequence_start=start, sequence_end=end
    )


async def test_a_full_owner_keeps_the_start_where_every_replica_is_full_and_a_full_replica_refuses_a_loan() -> (
    None
):
    owners = InMemoryOwners()
    runners = {0: _Slots(0), 1: _Slots(0), 2: _Slots(1)}
    for rank, runner in runners.items():
        owners.routers[rank] = Router(ranks=Ranks("m", rank, 3), owners=owners)
        owners.routers[rank].serve("m", runner)
    # 3 is rank 0's: rank 1 is full (it answers absent, running nothing), rank 2 takes it
    assert isinstance(await owners.routers[0].infer(_request(3, start=True)), InferResponse)
    assert runners[1].calls == [] and runners[2].calls == [(3, True)] and owners.probes == 2
    assert owners.routers[0].lent == {3: (2, owners.routers[0].lent[3][1])}
    # 6 is rank 0's too: nobody has a free slot, so it starts (waits) at its owner, as before
    await owners.routers[0].infer(_request(6, start=True))
    assert runners[0].calls == [(6, True)] and 6 not in owners.routers[0].lent
    # a probe START at a replica with no free slot is refused without running
    probe = RawRequest("/v2/models/m/infer", [(FORWARDED, b"1"), (PROBE, b"1")], b"")
    assert await owners.routers[1].route(_request(9, start=True), probe) == ABSENT_REPLY
    # the lent sequence's requests go on to rank 2 from wherever they land; its END ends the loan
    await owners.routers[1].infer(_request(3))
    await owners.routers[0].infer(_request(3, end=True))
    assert runners[2].calls == [(3, True), (3, False), (3, False)] and owners.routers[0].lent == {}


async def test_a_lent_sequences_requests_follow_its_start_without_waiting_for_its_answer() -> None:
    """The lender keeps a slot and answers the offer at once; the START and the requests that came
    meanwhile then go on there in order, as a stream's requests are all queued in Triton. Waiting for
    the START's answer deadlocked a batch held until they were queued (TRITONSERVER_DELAY_SCHEDULER,
    L0_sequence_batcher's test_backlog with four instances)."""
    owners = _HeldProbes()
    runners = {0: _Slots(0), 1: _Slots(1)}
    for rank, runner in runners.items():
        owners.routers[rank] = Router(ranks=Ranks("m", rank, 2), owners=owners)
        owners.routers[rank].serve("m", runner)
    runners[1].gate.clear()  # rank 1 answers nothing until both requests are there
    start = asyncio.ensure_future(owners.routers[0].infer(_request(4, start=True)))
    await asyncio.sleep(0.01)
    second = asyncio.ensure_future(owners.routers[1].infer(_request(4)))  # lands on rank 1: via the owner
    await asyncio.sleep(0.01)
    assert runners[1].calls == [] and owners.routers[0].placing.holding(4)  # the offer is still out
    owners.probes_go.set()
    await until(lambda: len(runners[1].calls) == 2)
    assert runners[1].calls == [(4, True), (4, False)] and not start.done() and not second.done()
    runners[1].gate.set()
    await asyncio.wait_for(asyncio.gather(start, second), 5)
    assert runners[0].calls == [] and owners.routers[0].lent.keys() == {4}


async def test_a_loan_is_forgotten_once_the_lender_has_released_the_sequence_for_idling() -> None:
    owners = InMemoryOwners()
    runners = {0: _Slots(0, idle_ns=1_000_000), 1: _Slots(1)}
    for rank, runner in runners.items():
        owners.routers[rank] = Router(ranks=Ranks("m", rank, 2), owners=owners)
        owners.routers[rank].serve("m", runner)
    await owners.routers[0].infer(_request(2, start=True))
    assert runners[1].calls == [(2, True)] and 2 in owners.routers[0].lent
    await asyncio.sleep(0.01)  # past twice the 1 ms idle limit: rank 1 released it
    runners[0].free = 1
    await owners.routers[0].infer(_request(2, start=True))  # a new sequence 2, into the owner's slot
    assert runners[0].calls == [(2, True)] and owners.routers[0].lent == {}


class _Numbered(_Slots):
    """``_Slots`` recording each request's id, and calling ``on_start`` as a START is queued."""

    def __init__(self, free: int) -> None:
        super().__init__(free)
        self.ran: list[str] = []
        self.on_start: Any = None

    async def infer(self, request: InferRequest) -> InferResponse:
        self.ran.append(request.id)
        if request.sequence_start and self.on_start is not None:
            self.on_start()
        return await super().infer(request)


class _HeldProbes(InMemoryOwners):
    """``InMemoryOwners`` whose probes wait for ``probes_go``."""

    def __init__(self) -> None:
        super().__init__()
        self.probes_go = asyncio.Event()

    async def forward(
        self,
        model: str,
        rank: int,
        request: InferRequest,
        raw: RawRequest | None,
        order: Order | None,
        probe: bool = False,
    ) -> InferResponse | RawReply:
        if probe:
            await self.probes_go.wait()
        return await super().forward(model, rank, request, raw, order, probe)


async def test_requests_that_waited_for_their_start_go_on_before_one_that_comes_as_it_is_queued() -> None:
    """Both ranks full: the START asks rank 1, then is queued at its owner. Steps 1 and 2 came while it
    asked; step 3 comes just as the START is queued. The old wait let step 3 run before steps 1 and 2
    (wrong running sums in Triton's sequence stress test)."""
    owners = _HeldProbes()
    runners = {0: _Numbered(0), 1: _Numbered(0)}
    for rank, runner in runners.items():
        owners.routers[rank] = Router(ranks=Ranks("m", rank, 2), owners=owners)
        owners.routers[rank].serve("m", runner)
    owner = owners.routers[0]

    def step(n: int, start: bool = False) -> InferRequest:
        request = _request(4, start=start)
        request.id = f"step-{n}"
        return request

    late: list[asyncio.Future[InferResponse]] = []
    runners[0].on_start = lambda: late.append(asyncio.ensure_future(owner.infer(step(3))))
    start = asyncio.ensure_future(owner.infer(step(0, start=True)))
    waiting = [asyncio.ensure_future(owner.infer(step(n))) for n in (1, 2)]
    await asyncio.sleep(0.01)
    assert runners[0].ran == [] and owner.placing.holding(4)
    owners.probes_go.set()
    await asyncio.wait_for(asyncio.gather(start, *waiting), 5)
    await asyncio.wait_for(late[0], 5)
    assert runners[0].ran == ["step-0", "step-1", "step-2", "step-3"] and runners[1].ran == []
    assert owners.probes == 1 and owner.placing.lines == 0


async def test_a_lent_sequence_its_lender_released_fails_there_and_is_never_sent_back_and_forth() -> None:
    """A probe is answered where the sequence lives, never sent on: a lender that released the sequence
    (idle) asks the other ranks, and the owner's loan pointing back at it does not send it there again."""
    owners = InMemoryOwners()
    runners = {0: _Slots(0), 1: _Slots(1)}
    for rank, runner in runners.items():
        owners.routers[rank] = Router(ranks=Ranks("m", rank, 2), owners=owners)
        owners.routers[rank].serve("m", runner)
    await owners.routers[0].infer(_request(2, start=True))
    assert owners.routers[0].lent.keys() == {2} and runners[1].calls == [(2, True)]
    runners[1].live.clear()  # released for idling, within the owner's memory of the loan
    await asyncio.wait_for(owners.routers[0].infer(_request(2)), 5)
    # rank 1 got it from the loan, asked rank 0 (absent), and ran it: a real runtime answers the
    # missing START there
    assert runners[1].calls == [(2, True), (2, False)] and runners[0].calls == []
    assert owners.probes == 2


async def test_sequences_of_the_stress_pattern_keep_their_running_sums_across_lending_replicas(
    tmp_path: Path,
) -> None:
    """Triton's sequence stress test's pattern: client threads send sequences as gRPC streams (every
    request at once, in order) landing on any replica, correlation IDs reused by the next sequence,
    sequences without END left to go idle, and few slots (two ranks of two, or four of one) so that
    owners lend; calls between replicas take a random time, so they overtake each other."""
    for ranks, slots in ((2, 2), (4, 1)):
        folder = tmp_path / f"acc{ranks}"
        shutil.copytree(MODELS / "sequence_accumulator", folder)
        text = (folder / "config.pbtxt").read_text()
        text = text.replace(
            "max_sequence_idle_microseconds: 5000000", "max_sequence_idle_microseconds: 1000000"
        )
        text = text.replace("max_batch_size: 8", f"max_batch_size: {slots}").replace(
            "count: 1", f"count: {ranks}"
        )
        (folder / "config.pbtxt").write_text(text)
        await _stress(from_text(text, folder), ranks, seed=ranks)


class _SlowOwners(InMemoryOwners):
    """Calls between replicas that take 0-3 ms each way (random, seeded)."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self.rng = rng

    async def forward(self, *args: Any, **kwargs: Any) -> InferResponse | RawReply:
        await asyncio.sleep(self.rng.random() * 0.003)
        answer = await super().forward(*args, **kwargs)
        await asyncio.sleep(self.rng.random() * 0.003)
        return answer


async def _stress(model: Any, count: int, seed: int, clients: int = 4, sequences: int = 12) -> None:
    rng = random.Random(seed)
    owners, runtimes = await _replicas_behind_routers(model, count, _SlowOwners(rng))
    wrong: list[tuple[int, int, int, int]] = []

    async def stream(cid: int, values: list[int], end: bool) -> None:
        landed = owners.routers[rng.randrange(count)]  # a stream's replica, as HAProxy picks
        sent = []
        for n, value in enumerate(values):
            request = _step_request(model.name, cid, value, n == 0, end and n == len(values) - 1)
            sent.append(asyncio.ensure_future(landed.infer(request)))
            await asyncio.sleep(0)
        total = 0
        for n, (value, answer) in enumerate(zip(values, await asyncio.gather(*sent), strict=True)):
            total += value
            assert answer.error is None, (cid, n, answer.error)
            if int(answer.outputs["OUT"][0, 0]) != total:
                wrong.append((cid, n, int(answer.outputs["OUT"][0, 0]), total))

    async def client(number: int) -> None:
        own = random.Random(seed * 100 + number)
        for _ in range(sequences):
            cid = 1 + number * 100 + own.randrange(2)  # two IDs per client, reused sequence after sequence
            values = [own.randrange(1, 1000) for _ in range(max(1, int(own.gauss(8, 4))))]
            await stream(cid, values, end=own.random() > 0.15)  # some never end: they go idle

    try:
        await asyncio.wait_for(asyncio.gather(*(client(n) for n in range(clients))), 60)
    finally:
        for runtime in runtimes:
            await runtime.close()
    assert wrong == []
    assert sum(router.lent_count for router in owners.routers.values()) > 0  # the pattern made owners lend


def test_oldest_without_a_candidate_count_takes_a_batchs_worth() -> None:
    # Triton's sequence batcher: max_candidate_sequences left out (0) means max_batch_size candidates
    from repository_loader.config import parse_config
    from repository_loader.describe import describe
    from repository_loader.findings import Findings
    from repository_loader.sequence_rules import check_sequence_batching

    config = parse_config(
        'name: "m"\nbackend: "python"\nmax_batch_size: 4\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        "sequence_batching { oldest { } }\n"
    )
    findings = Findings("m", "config.pbtxt")
    check_sequence_batching(config, findings)
    assert not findings.errors
    model = describe(config, Path("/m"), [1])
    assert SequenceSettings.from_model(model).max_candidate_sequences == 4
