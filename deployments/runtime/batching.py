"""Request schedulers of a model replica: Triton's dynamic batcher, and one request at a time.

Both take requests one by one (``submit``) and hand the backend's ``execute``
a list of requests, exactly as Triton hands a batch to a backend. Each
``submit`` returns that request's own ``InferResponse``; every error, including
rejections by the queue policy and a failing ``execute``, comes back in
``response.error`` (built by ``InferResponse.failed``, never raised: the rule
of :mod:`deployments.inference`). Statistics are the caller's, through the
``on_batch`` callback. Plain asyncio, no Ray: the replica owns one scheduler per model
version and calls it from its event loop. See ``docs/batching.md``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Protocol

from deployments.inference import InferRequest, InferResponse
from deployments.runtime.batch_execute import (
    HOLD_POLL_NS,
    BatchCallback,
    ExecuteFn,
    FirstBatchHold,
    HoldGate,
    first_batch_hold,
    run_batch,
)
from deployments.runtime.batch_queue import (
    NEVER,
    Entry,
    LevelQueue,
    PriorityQueues,
    grouping_inputs,
    plan_batch,
)
from deployments.timeouts import within
from repository_loader.errors import InternalError, Rejected, Unavailable
from repository_loader.model import DynamicBatching, ModelDescription, TensorSpec

logger = logging.getLogger(__name__)


class Scheduler(Protocol):
    """What the model replica calls: submit requests, close."""

    async def submit(self, request: InferRequest) -> InferResponse: ...

    async def close(self, drain: bool = True) -> None: ...


def _closed_error(request: InferRequest, model_name: str) -> Unavailable:
    return Unavailable(
        f"model '{model_name or request.model_name}' is shutting down and accepts no new requests "
        f"(request '{request.id}')"
    )


class DynamicBatcher:
    """Triton's dynamic batcher on asyncio.

    Batches count rows (first dimension of a request's inputs) up to
    ``max_batch_size``; only requests whose non-ragged inputs have equal
    non-batch dimensions share a batch; preferred batch sizes, the queue
    delay, priority levels, queue policies and ``preserve_ordering`` follow
    ``config``. One long-lived task forms batches; each request waits on a
    future. ``max_concurrent_batches`` batches may execute at once (one per
    model instance); while all are busy, the next batch keeps growing.
    """

    def __init__(
        self,
        config: DynamicBatching,
        max_batch_size: int,
        inputs: Sequence[TensorSpec],
        execute: ExecuteFn,
        *,
        max_concurrent_batches: int = 1,
        on_batch: BatchCallback | None = None,
        model_name: str = "",
        hold: FirstBatchHold | None = None,
    ) -> None:
        self.config = config
        self.model_name = model_name
        self._count_rows = max_batch_size > 0  # max_batch_size 0: every request is a batch of its own
        self._max_rows = max(max_batch_size, 1)
        self._preferred = frozenset(p for p in config.preferred_batch_size if 0 < p <= self._max_rows)
        self._delay_ns = max(config.max_queue_delay_microseconds, 0) * 1000
        self._ragged, self._shape_tensors = grouping_inputs(inputs)
        self._queues = PriorityQueues(config, model_name)
        self._execute = execute
        self._on_batch = on_batch
        self._max_concurrent = max(max_concurrent_batches, 1)
        self._in_flight = 0
        self._tasks: set[asyncio.Task] = set()
        self._wakeup: asyncio.Future | None = None
        self._loop_task: asyncio.Task | None = None
        self._closing = False
        self._abandoned = False
        self._next_seq = 0
        self._next_delivery = 0
        self._held: dict[int, tuple[Entry, InferResponse | None]] = {}
        # requests to wait for before the first batch (testing): ``hold``, or the process's
        self._hold = HoldGate(first_batch_hold() if hold is None else hold, model_name)

    @property
    def queued(self) -> int:
        """Requests waiting in the queues (not yet in a batch)."""
        return self._queues.size

    @property
    def in_flight(self) -> int:
        """Batches executing now."""
        return self._in_flight

    async def submit(self, request: InferRequest) -> InferResponse:
        """Queue ``request`` and return its own response once its batch ran."""
        if self._closing:
            return InferResponse.failed(request, _closed_error(request, self.model_name))
        level = self._queues.level_of(request)
        rejection = self._queues.admit_error(level, request)
        if rejection is not None:
            return InferResponse.failed(request, rejection)
        loop = asyncio.get_running_loop()
        entry = self._new_entry(request, level, loop.create_future())
        self._queues.push(level, entry)
        entry.future.add_done_callback(self._on_future_done)
        if self._loop_task is None:
            self._loop_task = loop.create_task(self._run())
        else:
            self._wake()
        return await entry.future

    def _new_entry(self, request: InferRequest, level: LevelQueue, future: asyncio.Future) -> Entry:
        now = time.monotonic_ns()
        rows = request.batch_rows() if self._count_rows else 1
        key = request.batch_key(self._ragged, self._shape_tensors) if self._count_rows else None
        deadline = self._queues.deadline_for(level, request, now)
        entry = Entry(request, future, rows, key, self._next_seq, now, deadline)
        self._next_seq += 1
        return entry

    async def close(self, drain: bool = True) -> None:
        """Stop accepting requests; run what is queued (``drain``) or reject it, and wait for running batches."""
        self._closing = True
        if not drain:
            for entry in self._queues.drain():
                error = _closed_error(entry.request, self.model_name)
                self._deliver(entry, InferResponse.failed(entry.request, error))
        self._wake()
        if self._loop_task is not None:
            await self._loop_task
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self._hold.close()

    # -- the scheduling loop -------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._schedule()
        except Exception:
            logger.exception(
                "dynamic batcher of model '%s' failed; failing its queued requests", self.model_name
            )
            error = InternalError(f"the dynamic batcher of model '{self.model_name}' failed")
            for entry in self._queues.drain():
                self._deliver(entry, InferResponse.failed(entry.request, error))
        finally:
            self._loop_task = None

    async def _schedule(self) -> None:
        while True:
            if self._hold.active and await self._hold.holds(self._queues.size, closing=self._closing):
                # a count of its own changes only with a new request; a shared one is looked at every 10 ms
                await self._sleep(time.monotonic_ns() + HOLD_POLL_NS if self._hold.shared else NEVER)
                continue
            now = time.monotonic_ns()
            self._expire(now)
            if self._in_flight >= self._max_concurrent:
                await self._sleep(self._queues.next_deadline_ns)
                continue
            plan = plan_batch(
                iter(self._queues),
                self._max_rows,
                self._preferred,
                0 if self._closing else self._delay_ns,
                now,
            )
            if plan.count:
                await self._launch(plan.count)
                continue
            if plan.wake_ns == NEVER:  # nothing live is queued
                self._drop_abandoned(self._queues.drain())
                if self._closing:
                    return
            await self._sleep(min(plan.wake_ns, self._queues.next_deadline_ns))

    def _expire(self, now: int) -> None:
        if self._abandoned:
            self._abandoned = False
            self._drop_abandoned(self._queues.purge_abandoned())
        if not self._queues.has_timeouts:
            return
        rejected: list = []
        self._queues.expire(now, rejected)
        for entry, error in rejected:
            self._deliver(entry, InferResponse.failed(entry.request, error))

    async def _launch(self, count: int) -> None:
        dropped: list[Entry] = []
        entries = self._queues.take(count, dropped)
        self._drop_abandoned(dropped)
        now = time.monotonic_ns()
        rows = sum(e.rows for e in entries)
        queue_ns = [now - e.enqueue_ns for e in entries]
        if self._on_batch is not None:
            try:
                self._on_batch(rows, len(entries), queue_ns)
            except Exception:
                logger.exception("batch callback of model '%s' failed", self.model_name)
        self._in_flight += 1
        if self._max_concurrent == 1 and not self._queues.has_timeouts:
            # nothing else can start meanwhile and no timeout needs watching: no task needed
            await self._execute_batch(entries)
            return
        task = asyncio.get_running_loop().create_task(self._execute_batch(entries))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _execute_batch(self, entries: list[Entry]) -> None:
        try:
            responses = await run_batch(self._execute, [e.request for e in entries], self.model_name)
            for entry, response in zip(entries, responses, strict=True):
                self._deliver(entry, response)
        finally:
            self._in_flight -= 1
            self._wake()

    # -- waking and delivering -------------------------------------------------

    async def _sleep(self, wake_ns: int) -> None:
        """Wait for a new request, a finished batch, or ``wake_ns`` (a single timer, only when needed)."""
        loop = asyncio.get_running_loop()
        waiter = self._wakeup = loop.create_future()
        handle = None
        if wake_ns < NEVER:
            handle = loop.call_later(max(wake_ns - time.monotonic_ns(), 0) / 1e9, _resolve, waiter)
        try:
            await waiter
        finally:
            self._wakeup = None
            if handle is not None:
                handle.cancel()

    def _wake(self) -> None:
        if self._wakeup is not None:
            _resolve(self._wakeup)

    def _on_future_done(self, future: asyncio.Future) -> None:
        if future.cancelled():  # the client went away while queued or executing
            self._abandoned = True
            self._wake()

    def _drop_abandoned(self, entries: list[Entry]) -> None:
        for entry in entries:
            self._deliver(entry, None)

    def _deliver(self, entry: Entry, response: InferResponse | None) -> None:
        """Resolve the entry's future, in arrival order when ``preserve_ordering`` asks for it."""
        if not self.config.preserve_ordering:
            _resolve(entry.future, response)
            return
        self._held[entry.seq] = (entry, response)
        while self._next_delivery in self._held:
            held, held_response = self._held.pop(self._next_delivery)
            self._next_delivery += 1
            _resolve(held.future, held_response)


def _resolve(future: asyncio.Future, result: object = None) -> None:
    if not future.done():
        future.set_result(result)


class PassThroughScheduler:
    """Without dynamic batching: each request executes alone, at most ``max_concurrent`` at a time.

    As Triton's default scheduler, one request per model instance at a time;
    requests beyond that wait in arrival order.
    """

    def __init__(
        self,
        max_batch_size: int,
        execute: ExecuteFn,
        *,
        max_concurrent: int = 1,
        on_batch: BatchCallback | None = None,
        model_name: str = "",
    ) -> None:
        self.model_name = model_name
        self._count_rows = max_batch_size > 0
        self._execute = execute
        self._on_batch = on_batch
        self._slots = asyncio.Semaphore(max(max_concurrent, 1))
        self._active = 0
        self._closing = False
        self._idle: asyncio.Event | None = None

    async def submit(self, request: InferRequest) -> InferResponse:
        """Execute ``request`` alone once an instance is free; return its response."""
        if self._closing:
            return InferResponse.failed(request, _closed_error(request, self.model_name))
        enqueued = time.monotonic_ns()
        self._active += 1
        try:
            # the request's own ``timeout`` bounds its wait for a free instance, as in Triton's queue
            try:
                if request.timeout_us > 0:
                    await within(self._slots.acquire(), request.timeout_us / 1e6)
                else:
                    await self._slots.acquire()
            except asyncio.TimeoutError:
                error = Rejected(
                    f"Request timeout expired: request '{request.id}' waited more than {request.timeout_us} us "
                    f"in the queue of model '{self.model_name or request.model_name}'"
                )
                return InferResponse.failed(request, error)
            try:
                queue_ns = [time.monotonic_ns() - enqueued]
                rows = request.batch_rows() if self._count_rows else 1
                if self._on_batch is not None:
                    self._on_batch(rows, 1, queue_ns)
                return (await run_batch(self._execute, [request], self.model_name))[0]
            finally:
                self._slots.release()
        finally:
            self._active -= 1
            if self._active == 0 and self._idle is not None:
                self._idle.set()

    async def close(self, drain: bool = True) -> None:
        """Stop accepting requests and wait for those already submitted."""
        self._closing = True
        if self._active:
            self._idle = asyncio.Event()
            await self._idle.wait()


def make_scheduler(
    model: ModelDescription,
    execute: ExecuteFn,
    *,
    max_concurrent_batches: int = 1,
    on_batch: BatchCallback | None = None,
) -> Scheduler:
    """The scheduler ``model``'s config asks for: the sequence batcher, the dynamic batcher, or one at a time."""
    if model.sequence_batching is not None:  # docs/sequence.md
        from deployments.runtime.sequence import SequenceBatcher

        return SequenceBatcher(
            model,
            execute,
            max_concurrent_batches=max_concurrent_batches,
            on_batch=on_batch,
            dynamic_batcher=DynamicBatcher,
        )
    if model.dynamic_batching is None:
        return PassThroughScheduler(
            model.max_batch_size,
            execute,
            max_concurrent=max_concurrent_batches,
            on_batch=on_batch,
            model_name=model.name,
        )
    return DynamicBatcher(
        model.dynamic_batching,
        model.max_batch_size,
        model.inputs,
        execute,
        max_concurrent_batches=max_concurrent_batches,
        on_batch=on_batch,
        model_name=model.name,
    )


__all__ = [
    "BatchCallback",
    "DynamicBatcher",
    "ExecuteFn",
    "PassThroughScheduler",
    "Scheduler",
    "make_scheduler",
    "run_batch",
]
