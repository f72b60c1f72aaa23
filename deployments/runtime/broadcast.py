"""A change that wakes every waiter on its own event loop, whichever thread makes it.

A replica answers on more than one loop: Serve's HTTP and gRPC servers, its handle calls and the
deployment's own code may each run on a thread of their own. An ``asyncio.Event`` set from another
thread than its waiters' does not wake their loop (the waiter sleeps until something else wakes it,
or its timeout), so the boards that replicas long-poll (reload orders, log settings, trace settings)
use this instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable

from deployments.timeouts import within


class Broadcast:
    """Waiters ask :meth:`until` a condition holds; whoever changes what the condition reads calls
    :meth:`notify` after the change. A change between a waiter's check and its sleep is never missed:
    the check and the registration happen under the lock that :meth:`notify` takes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = set()

    def notify(self) -> None:
        """Wake every waiter (each checks its condition again)."""
        with self._lock:
            waiters, self._waiters = self._waiters, set()
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):  # that loop has closed: nobody waits there any more
                loop.call_soon_threadsafe(_wake, future)

    async def until(self, check: Callable[[], bool], timeout_s: float) -> bool:
        """Whether ``check()`` holds, waiting up to ``timeout_s`` for a change that makes it."""
        deadline = time.monotonic() + timeout_s
        loop = asyncio.get_running_loop()
        while True:
            waiter = (loop, loop.create_future())
            with self._lock:
                if check():
                    return True
                self._waiters.add(waiter)
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    return False
                await within(waiter[1], left)
            except TimeoutError:
                return check()
            finally:
                with self._lock:
                    self._waiters.discard(waiter)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


__all__ = ["Broadcast"]
