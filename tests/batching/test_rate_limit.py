"""Triton's rate limiter without Ray: the pools' sizes, who waits, who goes next, what a gone
instance gives back, the load-time check against ``--rate-limit-resource``, and a model runtime
whose executions hold the resources (docs/rate_limiter.md)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import numpy as np
import pytest

from deployments.runtime.model import ModelRuntime
from deployments.runtime.rate_limit import (
    GLOBAL,
    Needs,
    ResourcePools,
    check_limits,
    instance_needs,
)
from deployments.settings import ResourceLimit, ServerSettings, SettingsError
from repository_loader.errors import InvalidArgument
from repository_loader.model import InstanceGroup, InstanceKind, RateLimiter, RateLimitResource
from tests.backends.helpers import describe, request, spec

R1 = ("R1", "node:0")


def _needs(count: int, priority: int = 1, key: tuple[str, str] = R1) -> Needs:
    return Needs(((key, count),), priority)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_by_default_a_pool_holds_what_the_neediest_instance_needs_so_two_such_take_turns() -> None:
    pools = ResourcePools()
    pools.register("a", _needs(2))
    pools.register("b", _needs(2))
    assert pools.capacity(R1) == 2
    first = await pools.acquire("a", _needs(2))
    second = asyncio.ensure_future(pools.acquire("b", _needs(2)))
    await _settle()
    assert not second.done() and pools.in_use(R1) == 2
    pools.release(first)
    await asyncio.wait_for(second, 1)
    assert pools.in_use(R1) == 2


async def test_an_explicit_count_lets_instances_run_together() -> None:
    pools = ResourcePools((ResourceLimit("R1", 4),))
    grants = [await asyncio.wait_for(pools.acquire(h, _needs(2)), 1) for h in ("a", "b")]
    assert pools.in_use(R1) == 4 and len(set(grants)) == 2
    waiting = asyncio.ensure_future(pools.acquire("c", _needs(1)))
    await _settle()
    assert not waiting.done()
    pools.release(grants[0])
    await asyncio.wait_for(waiting, 1)


async def test_a_device_count_applies_to_that_device_before_the_every_device_one() -> None:
    limits = (ResourceLimit("R1", 10), ResourceLimit("R1", 3, device=1))
    pools = ResourcePools(limits)
    assert pools.capacity(("R1", "n:0")) == 10 and pools.capacity(("R1", "n:1")) == 3
    assert pools.capacity(("R2", GLOBAL)) == 0  # nobody needs it


async def test_pools_of_different_devices_are_apart_and_a_global_one_is_shared() -> None:
    pools = ResourcePools()
    on0 = _needs(1, key=("R", "n:0"))
    on1 = _needs(1, key=("R", "n:1"))
    await asyncio.wait_for(pools.acquire("a", on0), 1)
    await asyncio.wait_for(pools.acquire("b", on1), 1)  # another device: its own pool
    shared = _needs(1, key=("G", GLOBAL))
    await asyncio.wait_for(pools.acquire("c", shared), 1)
    waiting = asyncio.ensure_future(pools.acquire("d", shared))
    await _settle()
    assert not waiting.done()
    waiting.cancel()


async def test_under_contention_priority_two_runs_half_as_often_as_priority_one() -> None:
    """Three instances for one copy: whenever it comes back two wait, and the weights choose."""
    pools = ResourcePools()
    priorities = {"a": 1, "b": 2, "c": 1}
    counts = dict.fromkeys(priorities, 0)
    for holder, priority in priorities.items():
        pools.register(holder, _needs(1, priority))

    async def instance(holder: str) -> None:
        while sum(counts.values()) < 200:
            grant = await pools.acquire(holder, _needs(1, priorities[holder]))
            counts[holder] += 1
            await asyncio.sleep(0)
            pools.release(grant)

    tasks = [asyncio.ensure_future(instance(h)) for h in priorities]
    await asyncio.wait(tasks, timeout=5, return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:
        task.cancel()
    assert sum(counts.values()) >= 200, counts
    assert 1.6 <= counts["a"] / counts["b"] <= 2.5 and 1.6 <= counts["c"] / counts["b"] <= 2.5, counts


async def test_the_first_in_line_is_not_passed_by_a_smaller_request() -> None:
    pools = ResourcePools((ResourceLimit("R1", 4),))
    held = await pools.acquire("a", _needs(3))
    big = asyncio.ensure_future(pools.acquire("b", _needs(4)))
    await _settle()
    small = asyncio.ensure_future(pools.acquire("c", _needs(1)))  # would fit, but b is first
    await _settle()
    assert not big.done() and not small.done()
    pools.release(held)
    big_grant = await asyncio.wait_for(big, 1)
    await _settle()
    assert not small.done()
    pools.release(big_grant)
    await asyncio.wait_for(small, 1)


async def test_a_gone_instance_gives_its_resources_back_and_stops_waiting() -> None:
    pools = ResourcePools()
    await pools.acquire("dead", _needs(2))
    also = asyncio.ensure_future(pools.acquire("dead", _needs(2)))
    other = asyncio.ensure_future(pools.acquire("live", _needs(2)))
    await _settle()
    assert not other.done()
    pools.forget("dead")
    await asyncio.wait_for(other, 1)
    with pytest.raises(asyncio.CancelledError):
        await also
    assert pools.in_use(R1) == 2  # the live one's alone


async def test_the_actor_forgets_a_gone_idle_instance_so_its_pool_shrinks(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """L0_model_update's resource decrease: a group needing 4 of R1 is replaced by one needing 3. The
    old replica is gone without holding anything; the actor's watch must still forget it, or the pool
    stays at 4 (and after an earlier model needing 8, at 8) and never logs Triton's ``Count: 3``."""
    from deployments.serve import rate_limiter

    alive = {"old": False, "new": True}

    async def gone(handle: str, timeout_s: float) -> bool:
        return not alive[handle]

    monkeypatch.setattr(rate_limiter.hooks, "actor_gone", gone)
    monkeypatch.setattr(rate_limiter, "WATCH_S", 0.01)
    actor = rate_limiter.RateLimiterActor([], rate_limiter.LogSettings(verbose_level=1))
    caplog.set_level("INFO", logger=rate_limiter.logger.name)
    actor.register("old", _needs(4), "old")
    actor.register("new", _needs(3), "new")
    assert actor.state() == {"R1@node:0": [0, 4]}
    try:
        for _ in range(200):
            if actor.state() == {"R1@node:0": [0, 3]}:
                break
            await asyncio.sleep(0.01)
        assert actor.state() == {"R1@node:0": [0, 3]}  # the live instance's need alone
        assert actor.pools.registered() == {"new"}
        assert any("Resource: R1\t Count: 3" in r.getMessage() for r in caplog.records)
    finally:
        assert actor._watch is not None
        actor._watch.cancel()
        _remove_log_handlers()


def _remove_log_handlers() -> None:
    """What the actor's ``log_to_stderr`` added to this process's loggers, taken out again."""
    import logging

    for name in ("triton_python_backend", "deployments"):
        logger = logging.getLogger(name)
        for handler in [h for h in logger.handlers if getattr(h, "_triton_stderr", False)]:
            logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
    logging.getLogger("triton_python_backend").propagate = True


async def test_a_waiter_that_leaves_takes_nothing_with_it() -> None:
    pools = ResourcePools()
    held = await pools.acquire("a", _needs(2))
    left = asyncio.ensure_future(pools.acquire("b", _needs(2)))
    await _settle()
    left.cancel()
    await _settle()
    pools.release(held)
    assert pools.in_use(R1) == 0
    await asyncio.wait_for(pools.acquire("c", _needs(2)), 1)


def test_needs_are_per_device_of_the_node_or_global_and_priority_zero_counts_as_one() -> None:
    limiter = RateLimiter(
        (RateLimitResource("R1", 2), RateLimitResource("G", 1, global_=True), RateLimitResource("Z", 0)), 0
    )
    needs = instance_needs(limiter, "node-a", 1)
    assert needs == Needs(((("R1", "node-a:1"), 2), (("G", GLOBAL), 1)), 1)


def _model_needing(count: int, global_: bool = False, kind: InstanceKind = InstanceKind.CPU, gpus=()):
    group = InstanceGroup(
        "g", kind, 1, gpus=gpus, rate_limiter=RateLimiter((RateLimitResource("R1", count, global_),))
    )
    return describe("m", Path("/m"), "python", [], [], instance_groups=(group,))


def test_a_model_that_needs_more_than_the_server_gives_is_refused_at_load() -> None:
    limits = (ResourceLimit("R1", 10),)
    check_limits(_model_needing(10), limits)
    check_limits(_model_needing(32), ())  # no explicit count: the pool grows to what is needed
    with pytest.raises(InvalidArgument, match="'R1' is limited to 10 .* minimum required count is 32"):
        check_limits(_model_needing(32), limits)
    with pytest.raises(InvalidArgument, match="limited to 2"):
        check_limits(
            _model_needing(3, kind=InstanceKind.GPU, gpus=(1,)), (*limits, ResourceLimit("R1", 2, 1))
        )
    check_limits(_model_needing(3, kind=InstanceKind.GPU, gpus=(0,)), (*limits, ResourceLimit("R1", 2, 1)))
    check_limits(_model_needing(10, global_=True), limits)


def test_the_flags_parse_into_typed_limits() -> None:
    settings = ServerSettings.from_args(
        {
            "model_repository": "/m",
            "rate_limit": "execution_count",
            "rate_limit_resource": ["R1:10", "R2:5:1"],
        }
    )
    assert settings.rate_limit_resources == (ResourceLimit("R1", 10), ResourceLimit("R2", 5, 1))
    assert ServerSettings.from_args(settings.to_args()) == settings
    for bad in ("R1", "R1:x", ":3", "R1:-1", "R1:1:2:3"):
        with pytest.raises(SettingsError, match="rate_limit_resource"):
            ResourceLimit.parse(bad)
    with pytest.raises(SettingsError, match="rate_limit must be one of off, execution_count"):
        ServerSettings.from_args({"model_repository": "/m", "rate_limit": "sometimes"})


SLEEPY_PY = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        started = time.time()
        time.sleep(0.2)
        span = np.array([started, time.time()], dtype=np.float64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SPAN", span)]) for _ in requests]
"""


def _gate(
    pools: ResourcePools, holder: str, needs: Needs
) -> Callable[[], contextlib.AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def execution() -> AsyncIterator[None]:
        grant = await pools.acquire(holder, needs)
        try:
            yield
        finally:
            pools.release(grant)

    return execution


async def _two_instances(tmp_path: Path, pools: ResourcePools | None) -> list[tuple[float, float]]:
    (tmp_path / "sleepy" / "1").mkdir(parents=True)
    (tmp_path / "sleepy" / "1" / "model.py").write_text(SLEEPY_PY)
    model = describe(
        "sleepy", tmp_path / "sleepy", "python", [spec("X", "FP32", [1])], [spec("SPAN", "FP64", [2])]
    )
    runtimes = [
        ModelRuntime(model, gate=None if pools is None else _gate(pools, f"sleepy_{i}", _needs(2)))
        for i in range(2)
    ]
    for runtime in runtimes:
        await runtime.load()
    try:
        x = np.zeros(1, np.float32)
        answers = await asyncio.gather(*(r.infer(request("sleepy", X=x)) for r in runtimes))
    finally:
        for runtime in runtimes:
            await runtime.close()
    assert all(a.error is None for a in answers), [a.error for a in answers]
    return sorted((float(a.outputs["SPAN"][0]), float(a.outputs["SPAN"][1])) for a in answers)


async def test_two_instances_that_share_a_resource_execute_one_after_the_other(tmp_path: Path) -> None:
    began = time.time()
    first, second = await _two_instances(tmp_path / "limited", ResourcePools())
    assert first[0] >= began and second[0] >= first[1], (first, second)
    # the same two without the limiter run side by side (each its own thread)
    first, second = await _two_instances(tmp_path / "free", None)
    assert second[0] < first[1], (first, second)
