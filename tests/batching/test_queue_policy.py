"""Priorities, queue policies (timeouts, max_queue_size) and preserve_ordering."""

from __future__ import annotations

import asyncio

from deployments.runtime.batching import DynamicBatcher
from deployments.runtime.model import failure_reason
from repository_loader.errors import Unavailable
from repository_loader.model import DynamicBatching, QueuePolicy
from tests.batching.fakes import INPUTS, Recorder, config, request, until


async def blocked_batcher(
    cfg: DynamicBatching, max_batch_size: int = 2
) -> tuple[DynamicBatcher, Recorder, asyncio.Event, asyncio.Future]:
    """A batcher whose first batch ("first") holds the model until the gate opens."""
    gate = asyncio.Event()
    rec = Recorder(gate=gate)
    batcher = DynamicBatcher(cfg, max_batch_size, INPUTS, rec, model_name="m")
    first = asyncio.ensure_future(batcher.submit(request("first")))
    await until(lambda: len(rec.batches) == 1)
    return batcher, rec, gate, first


async def test_higher_priority_requests_are_served_first() -> None:
    batcher, rec, gate, first = await blocked_batcher(config(priority_levels=3, default_priority_level=2))
    tasks = [asyncio.ensure_future(batcher.submit(request(f"low{i}", priority=3))) for i in range(2)]
    tasks += [asyncio.ensure_future(batcher.submit(request(f"mid{i}"))) for i in range(2)]  # default level 2
    tasks += [asyncio.ensure_future(batcher.submit(request(f"high{i}", priority=1))) for i in range(2)]
    await asyncio.sleep(0.005)
    gate.set()
    await asyncio.gather(first, *tasks)
    assert rec.batches[1:] == [["high0", "high1"], ["mid0", "mid1"], ["low0", "low1"]]


async def test_out_of_range_priority_uses_the_default_level() -> None:
    batcher, rec, gate, first = await blocked_batcher(config(priority_levels=2, default_priority_level=2))
    tasks = [
        asyncio.ensure_future(batcher.submit(request("weird", priority=7))),
        asyncio.ensure_future(batcher.submit(request("top", priority=1))),
    ]
    await asyncio.sleep(0.005)
    gate.set()
    await asyncio.gather(first, *tasks)
    assert rec.batches[1:] == [["top", "weird"]]


async def test_uint64_priority_levels_cost_only_the_levels_in_use() -> None:
    # Triton's L0_model_queue sets priority_levels to the largest uint64 and the default level past
    # uint32: a queue per level would never finish allocating
    top, default = 2**64 - 1, 2**32
    cfg = config(priority_levels=top, default_priority_level=default)
    batcher, rec, gate, first = await blocked_batcher(cfg)
    tasks = [
        asyncio.ensure_future(batcher.submit(request("default", priority=0))),
        asyncio.ensure_future(batcher.submit(request("past", priority=2**32 + 5))),
        asyncio.ensure_future(batcher.submit(request("beyond", priority=top + 1))),  # out of range
        asyncio.ensure_future(batcher.submit(request("one", priority=1))),
    ]
    await asyncio.sleep(0.005)
    levels = [q.level for q in batcher._queues.levels]
    assert levels == [1, default, 2**32 + 5]
    gate.set()
    await asyncio.gather(first, *tasks)
    # level 1 first, then the default level (with the out-of-range one), then the lower level
    assert rec.batches[1:] == [["one", "default"], ["beyond", "past"]]
    assert [q.level for q in batcher._queues.levels] == [default]  # emptied levels are forgotten


async def test_timeout_reject_fails_the_request_and_spares_the_others() -> None:
    cfg = config(timeout_action="REJECT", allow_timeout_override=True)
    batcher, rec, gate, first = await blocked_batcher(cfg, max_batch_size=1)
    hasty = asyncio.ensure_future(batcher.submit(request("hasty", timeout_us=1_000)))
    patient = asyncio.ensure_future(batcher.submit(request("patient")))
    await until(hasty.done)  # rejected while the model is still busy
    response = hasty.result()
    assert isinstance(response.error, Unavailable)
    assert "Request timeout expired" in response.error.message and "'hasty'" in response.error.message
    assert failure_reason(response.error) == "REJECTED"  # counted as Triton counts a rejected request
    gate.set()
    await asyncio.gather(first, patient)
    assert patient.result().error is None
    assert rec.batches == [["first"], ["patient"]]
    answered = [first.result(), hasty.result(), patient.result()]
    assert sum(isinstance(r.error, Unavailable) for r in answered) == 1  # one rejection


async def test_timeout_delay_moves_the_request_behind_but_runs_it() -> None:
    cfg = config(timeout_action="DELAY", allow_timeout_override=True)
    batcher, rec, gate, first = await blocked_batcher(cfg, max_batch_size=1)
    hasty = asyncio.ensure_future(batcher.submit(request("hasty", timeout_us=1_000)))
    patient = [asyncio.ensure_future(batcher.submit(request(f"p{i}"))) for i in range(2)]
    await asyncio.sleep(0.02)
    gate.set()
    await asyncio.gather(first, hasty, *patient)
    assert hasty.result().error is None
    assert rec.batches == [["first"], ["p0"], ["p1"], ["hasty"]]


async def test_request_timeout_may_only_shorten_the_default() -> None:
    cfg = config(timeout_action="REJECT", default_timeout_microseconds=1_000, allow_timeout_override=True)
    batcher, rec, gate, first = await blocked_batcher(cfg, max_batch_size=1)
    longer = asyncio.ensure_future(batcher.submit(request("longer", timeout_us=60_000_000)))
    await until(longer.done)
    assert isinstance(longer.result().error, Unavailable)
    gate.set()
    await first


async def test_request_timeout_is_ignored_without_override() -> None:
    cfg = config(timeout_action="REJECT", allow_timeout_override=False)
    batcher, rec, gate, first = await blocked_batcher(cfg, max_batch_size=1)
    req = asyncio.ensure_future(batcher.submit(request("r", timeout_us=1_000)))
    await asyncio.sleep(0.02)
    gate.set()
    await asyncio.gather(first, req)
    assert req.result().error is None


async def test_per_priority_policy_applies_to_its_level_only() -> None:
    cfg = DynamicBatching(
        priority_levels=2,
        default_priority_level=2,
        priority_queue_policy={1: QueuePolicy(max_queue_size=1)},
    )
    batcher, rec, gate, first = await blocked_batcher(cfg)
    high = [asyncio.ensure_future(batcher.submit(request(f"h{i}", priority=1))) for i in range(2)]
    low = [asyncio.ensure_future(batcher.submit(request(f"l{i}", priority=2))) for i in range(3)]
    await until(high[1].done)
    assert "Exceeds maximum queue size" in high[1].result().error.message
    gate.set()
    await asyncio.gather(first, high[0], *low)
    assert all(t.result().error is None for t in low)


async def test_full_queue_rejects_new_requests_at_once() -> None:
    batcher, rec, gate, first = await blocked_batcher(config(max_queue_size=2))
    queued = [asyncio.ensure_future(batcher.submit(request(f"q{i}"))) for i in range(2)]
    await asyncio.sleep(0)
    response = await batcher.submit(request("extra"))
    assert isinstance(response.error, Unavailable) and response.error.http_status == 503
    assert "Exceeds maximum queue size" in response.error.message and "'m'" in response.error.message
    assert failure_reason(response.error) == "REJECTED"
    gate.set()
    await asyncio.gather(first, *queued)
    assert all(t.result().error is None for t in queued)
    assert ["extra"] not in rec.batches


async def run_two_concurrent_batches(preserve: bool) -> list[str]:
    """Batch "slow" then batch "fast" run at once; returns the order responses arrived."""
    rec = Recorder(hold={"slow": 0.05})
    batcher = DynamicBatcher(config(preserve_ordering=preserve), 1, INPUTS, rec, max_concurrent_batches=2)
    arrived: list[str] = []

    async def call(rid: str) -> None:
        response = await batcher.submit(request(rid))
        assert response.error is None and response.id == rid
        arrived.append(rid)

    await asyncio.gather(call("slow"), call("fast"))
    assert rec.max_active == 2
    return arrived


async def test_preserve_ordering_holds_with_concurrent_batches() -> None:
    assert await run_two_concurrent_batches(preserve=False) == ["fast", "slow"]
    assert await run_two_concurrent_batches(preserve=True) == ["slow", "fast"]


async def test_preserve_ordering_survives_a_cancelled_earlier_request() -> None:
    batcher, rec, gate, first = await blocked_batcher(
        config(preserve_ordering=True, priority_levels=2, default_priority_level=2)
    )
    gone = asyncio.ensure_future(batcher.submit(request("gone")))
    later = asyncio.ensure_future(batcher.submit(request("later", priority=1)))
    await asyncio.sleep(0)
    gone.cancel()
    gate.set()
    response = await asyncio.wait_for(later, 5)
    assert response.error is None
    await first
    assert "gone" not in rec.completed
