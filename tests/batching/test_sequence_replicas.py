"""A stateful model with several instances runs one instance per replica, and a sequence runs on the
replica owning its ID; one replica may own most live sequences. Its batcher holds the slots of every
instance of the model, as Triton's one batcher does, so sequences Triton runs at once never wait in a
replica's backlog, where the sequences holding its slots would go idle meanwhile (no Ray running)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deployments.inference import InferRequest, InferResponse
from deployments.runtime.batching import make_scheduler
from deployments.runtime.forward_order import SEQUENCE_ORDER, Order
from deployments.runtime.model import ModelRuntime
from deployments.runtime.router import FORWARDED, Ranks, RawReply, RawRequest, Router, owner_rank
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


class InMemoryOwners:
    """``OwnerCalls`` between routers in one process: the owner's router answers, told the request
    was sent on to it (``x-triton-sequence-owner``), as a replica's HTTP app is."""

    def __init__(self) -> None:
        self.routers: dict[int, Router] = {}

    async def forward(
        self, model: str, rank: int, request: InferRequest, raw: RawRequest | None, order: Order
    ) -> InferResponse | RawReply:
        headers = [(FORWARDED, str(rank).encode()), (SEQUENCE_ORDER, order.header().encode())]
        sent_on = RawRequest(f"/v2/models/{model}/infer", headers, b"")
        return await self.routers[rank].route(request, sent_on)


def _two_instance_accumulator(tmp: Path, strategy: str) -> Any:
    """The Python accumulator as a two-instance model with Triton's default idle limit (1 s)."""
    folder = tmp / "sequence_accumulator"
    shutil.copytree(MODELS / "sequence_accumulator", folder)
    text = (folder / "config.pbtxt").read_text()
    text = text.replace("max_sequence_idle_microseconds: 5000000", "").replace("direct { }", strategy)
    text = text.replace("count: 1", "count: 2")
    (folder / "config.pbtxt").write_text(text)
    return from_text(text, folder)


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
    owners = InMemoryOwners()
    runtimes = []
    for rank in range(2):
        runtime = ModelRuntime(model)
        await runtime.load()
        owners.routers[rank] = Router(ranks=Ranks(model.name, rank, 2), owners=owners)
        owners.routers[rank].serve(model.name, runtime)
        runtimes.append(runtime)
    cids = list(range(1001, 1013))
    assert sorted(owner_rank(c, 2) for c in cids) == [0] * 6 + [1] * 6

    async def send(cid: int, step: int, start: bool, end: bool) -> InferResponse:
        landed = owners.routers[(cid // 2 + step) % 2]  # either replica, as HAProxy picks
        request = InferRequest(
            model.name,
            {"IN": np.array([[step + 1]], dtype=np.int32)},
            correlation_id=cid,
            sequence_start=start,
            sequence_end=end,
        )
        return await landed.infer(request)

    try:
        answers = await asyncio.wait_for(_step_by_step(send, cids), 20)
    finally:
        for runtime in runtimes:
            await runtime.close()
    for cid, responses in answers.items():
        assert [r.error for r in responses] == [None] * STEPS, cid
        assert [int(r.outputs["OUT"][0, 0]) for r in responses] == list(np.cumsum(range(1, STEPS + 1))), cid
    assert owners.routers[1].answered_here == 6 * STEPS
    assert owners.routers[0].answered_here == 6 * STEPS
