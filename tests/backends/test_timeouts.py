"""A wait with a time limit keeps its caller's cancellation, even one that arrives on the turn the
awaited thing completes (where ``asyncio.wait_for`` of Python 3.11 returns the result and drops it)."""

from __future__ import annotations

import asyncio

import pytest

from deployments.timeouts import within


async def _cancel_as_it_completes(wait: object) -> asyncio.Task[None]:
    """A task that waits on an event with ``wait`` in a loop, cancelled on the turn the event is set."""
    event = asyncio.Event()
    rounds = 0

    async def follower() -> None:
        nonlocal rounds
        while True:
            rounds += 1
            await wait(event.wait(), 30)  # type: ignore[operator]
            event.clear()

    task = asyncio.get_running_loop().create_task(follower())
    await asyncio.sleep(0)  # the follower waits
    event.set()  # the wait completes on the next turn ...
    task.cancel()  # ... and the cancel arrives on the same one
    await asyncio.sleep(0.05)
    assert rounds >= 1
    return task


async def test_a_cancel_that_arrives_as_the_wait_completes_ends_the_waiting_task():
    task = await _cancel_as_it_completes(within)
    assert task.cancelled()


async def test_the_standard_wait_for_drops_such_a_cancel_on_this_python():
    # the reason for within(): were this to start failing (a Python whose wait_for keeps the cancel),
    # within() could go back to asyncio.wait_for
    import sys

    task = await _cancel_as_it_completes(asyncio.wait_for)
    try:
        if sys.version_info < (3, 12):
            assert not task.done()  # waits again, cancelled in name only
        else:
            assert task.cancelled()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_within_times_out_and_returns_results():
    assert await within(asyncio.sleep(0, "done"), 1) == "done"
    with pytest.raises(TimeoutError):
        await within(asyncio.Event().wait(), 0.01)
    assert await within(asyncio.sleep(0, 3), None) == 3
