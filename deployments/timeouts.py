"""Waiting with a time limit, where the caller's own cancellation is never lost.

``asyncio.wait_for`` of Python 3.10 and 3.11 returns the awaited result when that completes on the
same turn of the loop as a cancellation of the waiting task, and the cancellation is gone: a loop
that waits again (a follower of the shared-memory table, a sequence's ordering) then runs on after
it was cancelled. :func:`within` waits in the caller's own task under ``asyncio.timeout`` (3.11),
which delivers both.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], timeout_s: float | None) -> T:
    """``await awaitable``; ``TimeoutError`` once ``timeout_s`` passed (None: no limit)."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout_s):
            return await awaitable
    return await asyncio.wait_for(awaitable, timeout_s)  # pragma: no cover - Python 3.10


__all__ = ["within"]
