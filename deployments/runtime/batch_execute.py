"""One batch through a backend's ``execute``, as every scheduler of a replica runs it.

The dynamic batcher, the pass-through scheduler and the sequence batcher all hand a
list of requests to ``execute`` and give each request its response; a failing or
miscounting ``execute`` becomes the error of every request of the batch, never an
exception in the scheduler's loop. The first-batch hold of Triton's testing variables
(``HoldGate``) is here too: every scheduler holds the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from deployments.inference import InferRequest, InferResponse
from repository_loader.errors import InternalError, ServerError

logger = logging.getLogger(__name__)

ExecuteFn = Callable[[list[InferRequest]], Awaitable[list[InferResponse]]]
"""A backend's ``execute``: one batch of requests in, one response per request out, in order."""

BatchCallback = Callable[[int, int, list[int]], None]
"""Called as each batch starts: ``(rows, requests, queue_ns_per_request)``."""


async def run_batch(execute: ExecuteFn, requests: list[InferRequest], model_name: str) -> list[InferResponse]:
    """Run ``execute``; if it fails or miscounts, every request of the batch gets the error."""
    try:
        responses = list(await execute(requests))
    except ServerError as exc:
        return [InferResponse.failed(r, exc) for r in requests]
    except Exception as exc:  # a backend bug must not take the scheduler down
        error = InternalError(
            f"model '{model_name}' failed to execute a batch of {len(requests)} requests: "
            f"{type(exc).__name__}: {exc}"
        )
        return [InferResponse.failed(r, error) for r in requests]
    if len(responses) != len(requests):
        error = InternalError(
            f"model '{model_name}' returned {len(responses)} responses for a batch of "
            f"{len(requests)} requests; a backend must return exactly one response per request"
        )
        return [InferResponse.failed(r, error) for r in requests]
    return responses


__all__ = [
    "HOLD_POLL_NS",
    "BatchCallback",
    "ExecuteFn",
    "FirstBatchHold",
    "HeldCount",
    "HeldCounts",
    "HoldBoard",
    "HoldGate",
    "first_batch_hold",
    "hold_first_batches",
    "run_batch",
]


HOLD_POLL_NS = 10_000_000
"""How often a held scheduler looks at its count again, as tritonserver's batcher threads do (10 ms)."""


class HeldCount(Protocol):
    """The count of one held scheduler, added to every replica's of its model: tritonserver counts the
    queues of every instance of a model, and here a model's instances are replicas."""

    async def reached(self, queued: int, backlogged: int) -> bool:
        """Report this scheduler's ``queued`` and ``backlogged`` requests; whether the model's totals
        reach the hold (the scheduler stops holding once they do)."""
        ...

    async def forget(self) -> None:
        """The scheduler closes: its count no longer adds to the model's."""
        ...


HeldCounts = Callable[[str, int, int], HeldCount]
"""``(model name, requests, backlog)`` -> the count of a new scheduler of that model (the serving
layer's: the model's replicas add their counts up in the server application)."""


@dataclass(frozen=True)
class FirstBatchHold:
    """How long the schedulers made in this process hold their first batch: until ``requests`` are
    queued and ``backlog`` requests of sequences wait for a slot (0: not held). With ``shared``, those
    are totals over every replica of the model; without it, this scheduler's own."""

    requests: int = 0
    backlog: int = 0
    shared: HeldCounts | None = None

    def __bool__(self) -> bool:
        return bool(self.requests or self.backlog)

    def count(self, model_name: str) -> HeldCount | None:
        """A new scheduler's shared count, or None where it counts only its own queue."""
        return self.shared(model_name, self.requests, self.backlog) if self and self.shared else None


_hold = FirstBatchHold()


def hold_first_batches(requests: int, backlog: int = 0, shared: HeldCounts | None = None) -> None:
    """Triton's ``TRITONSERVER_DELAY_SCHEDULER`` and ``TRITONSERVER_BACKLOG_DELAY_SCHEDULER``
    (``ServerSettings.delay_scheduler``, ``backlog_delay_scheduler``) for the schedulers this process
    makes from now on: each forms no batch until that many requests are queued (and, for the
    sequence batcher, that many requests of sequences without a slot wait in its backlog), once;
    counted over the model's replicas where ``shared`` is given. A testing hook, as in tritonserver:
    Triton's qa tests queue requests this way before the scheduler may cut them."""
    global _hold
    _hold = FirstBatchHold(max(int(requests), 0), max(int(backlog), 0), shared)


def first_batch_hold() -> FirstBatchHold:
    return _hold


class HoldGate:
    """One scheduler's first-batch hold: ``holds`` until the counts reach it (or the scheduler closes),
    then never again. A shared count is asked at most once per ``HOLD_POLL_NS`` (one call in flight);
    if asking fails, the scheduler's own counts decide that time."""

    def __init__(self, hold: FirstBatchHold, model_name: str) -> None:
        self._hold = hold
        self.model_name = model_name
        self._count = hold.count(model_name)
        self._reported = False
        self._asked: asyncio.Future[bool] | None = None
        self._asked_ns = 0
        self._failed = False
        self.active = bool(hold)  # still holding: a plain attribute, read on every pass of a scheduler

    @property
    def shared(self) -> bool:
        """Counted over the model's replicas: a holding scheduler must look again every ``HOLD_POLL_NS``."""
        return self._count is not None

    async def holds(self, queued: int, backlogged: int = 0, closing: bool = False) -> bool:
        """Whether the first batch still waits, given this scheduler's ``queued`` and ``backlogged`` requests."""
        hold = self._hold
        if not hold:
            return False
        if not closing:
            reached = queued >= hold.requests and backlogged >= hold.backlog
            if self._count is not None:
                reached = await self._ask(queued, backlogged, reached)
            if not reached:
                return True
        self._hold = FirstBatchHold()
        self.active = False
        return False

    async def _ask(self, queued: int, backlogged: int, own: bool) -> bool:
        now = time.monotonic_ns()
        if self._asked is None or (self._asked.done() and now - self._asked_ns >= HOLD_POLL_NS):
            assert self._count is not None
            self._asked_ns, self._reported = now, True
            self._asked = asyncio.ensure_future(self._count.reached(queued, backlogged))
        try:
            return await asyncio.shield(self._asked)
        except Exception:
            if not self._failed:  # once: it is asked again every 10 ms
                self._failed = True
                logger.exception(
                    "the shared hold count of model '%s' failed; its own count decides", self.model_name
                )
            return own

    async def close(self) -> None:
        """The scheduler closes: its last count no longer adds to its model's."""
        if self._count is not None and self._reported:
            self._reported = False
            try:
                await self._count.forget()
            except Exception:
                logger.exception("the shared hold count of model '%s' was not released", self.model_name)


class HoldBoard:
    """The last count each held scheduler of a model reported (the server application keeps one).

    As tritonserver's sequence batcher keeps each instance's last queue size: a scheduler that stopped
    holding reports no more, and its last count still adds to the others' until it closes.
    """

    def __init__(self) -> None:
        self._counts: dict[str, dict[str, tuple[int, int]]] = {}

    def report(
        self, model: str, reporter: str, queued: int, backlogged: int, requests: int, backlog: int
    ) -> bool:
        """Record ``reporter``'s counts; whether the model's totals reach ``requests`` and ``backlog``."""
        counts = self._counts.setdefault(model, {})
        counts[reporter] = (queued, backlogged)
        return (
            sum(q for q, _ in counts.values()) >= requests and sum(b for _, b in counts.values()) >= backlog
        )

    def forget(self, model: str, reporter: str) -> None:
        counts = self._counts.get(model, {})
        counts.pop(reporter, None)
        if not counts:
            self._counts.pop(model, None)
