"""The change signal that the long-polled boards share: wakes waiters on their own loops."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

from deployments.runtime.broadcast import Broadcast
from deployments.serve.reloads import PREPARE, Order, ReloadBoard


def test_a_change_made_on_another_thread_wakes_the_waiter_on_its_loop() -> None:
    """The waiter's loop has nothing else to do: only a thread-safe wake-up ends its 30 s wait before
    the test's 10 s limit."""
    box = {"value": 0}
    signal = Broadcast()

    def change() -> None:
        box["value"] = 1
        signal.notify()

    async def scenario() -> bool:
        waiter = asyncio.create_task(signal.until(lambda: box["value"] == 1, 30.0))
        await asyncio.sleep(0.05)  # the waiter sleeps now
        other = threading.Thread(target=change)
        other.start()
        try:
            # the loop sleeps until a wake-up: a thread-unsafe one would come only with this
            # timeout, and then the waiter would still be behind it
            await asyncio.wait({waiter}, timeout=10.0)
            return waiter.done() and waiter.result()
        finally:
            other.join()

    assert asyncio.run(scenario()) is True


def test_until_answers_at_once_when_the_condition_holds_and_false_after_its_timeout() -> None:
    signal = Broadcast()

    async def scenario() -> tuple[bool, bool, bool]:
        held = await signal.until(lambda: True, 0.0)
        never = await signal.until(lambda: False, 0.05)
        woken_but_false = asyncio.create_task(signal.until(lambda: False, 0.2))
        await asyncio.sleep(0.01)
        signal.notify()  # a wake-up whose condition does not hold: it sleeps again
        return held, never, await woken_but_false

    assert asyncio.run(scenario()) == (True, False, False)


def test_every_waiter_wakes_and_none_is_left_registered() -> None:
    signal = Broadcast()
    box = {"go": False}

    async def scenario() -> list[bool]:
        waiters = [asyncio.create_task(signal.until(lambda: box["go"], 10.0)) for _ in range(5)]
        await asyncio.sleep(0.01)
        box["go"] = True
        signal.notify()
        return list(await asyncio.gather(*waiters))

    assert asyncio.run(scenario()) == [True] * 5
    assert not signal._waiters


def test_a_reload_order_posted_from_another_thread_reaches_a_replica_waiting_on_its_loop() -> None:
    """A reload ordered by a call answered on another thread (a gRPC load) reaches the replicas'
    long polls at once, not after their poll timeout."""
    board = ReloadBoard()
    model = SimpleNamespace(name="m")

    async def post() -> None:
        await board._post(Order(1, PREPARE, model))  # type: ignore[arg-type]

    async def scenario() -> Order | None:
        waiter = asyncio.create_task(board.wait("m", (0, ""), 30.0))
        await asyncio.sleep(0.05)
        other = threading.Thread(target=lambda: asyncio.run(post()))
        other.start()
        try:
            await asyncio.wait({waiter}, timeout=10.0)  # as above
            return waiter.result() if waiter.done() else None
        finally:
            other.join()

    order = asyncio.run(scenario())
    assert order is not None and order.key == (1, PREPARE)
