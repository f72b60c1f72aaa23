"""Triton's sequence batcher on asyncio: one replica's slots, backlog, idle reaper and strategies.

Every request of a sequence (one correlation ID, from a START request to an
END request) goes to the same batch slot of the same model instance for the
sequence's life. Sequences beyond the free slots wait in a backlog, in
arrival order, and take a slot when one frees. The control inputs
(``CONTROL_SEQUENCE_START`` / ``_END`` / ``_READY`` / ``_CORRID``) and the
implicit state inputs are added to each request before the backend sees it;
the output state is taken back from the response (clients never see it).
A replica holds the slots of every instance of the model, since the replica
owning a sequence's ID runs it (``SequenceBatcher``).

Two strategies, as ``sequence_batching`` picks:

- ``direct``: ``max_batch_size`` slots per instance; a batch holds at most
  one request per slot, and slots up to the highest ready one, so a model
  can keep its state by row. A slot with nothing ready below that is padded
  with a request whose READY control is false. ``max_queue_delay_microseconds``
  with ``minimum_slot_utilization`` lets a batch wait to fill.
- ``oldest``: ``max_candidate_sequences`` slots per instance; each slot hands
  its next request, once the previous one finished, to a dynamic batcher
  (preferred sizes, queue delay), so a batch holds requests of several
  sequences, at most one of each, in order within a sequence.

Plain asyncio, no Ray; see ``docs/sequence.md``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from deployments.inference import InferRequest, InferResponse, RequestedOutput
from deployments.runtime.batch_execute import (
    HOLD_POLL_NS,
    BatchCallback,
    ExecuteFn,
    FirstBatchHold,
    HoldGate,
    first_batch_hold,
    run_batch,
)
from deployments.runtime.sequence_config import CORRID, SequenceSettings, backend_model
from repository_loader.errors import (
    InternalError,
    InvalidArgument,
    SequenceCancelled,
    ServerError,
    Unavailable,
)
from repository_loader.model import DynamicBatching, ModelDescription

logger = logging.getLogger(__name__)

BatcherClass = Callable[..., Any]
"""``deployments.runtime.batching.DynamicBatcher``, passed in by ``make_scheduler`` (which imports this module)."""

NEVER = 1 << 62
_ITERATIVE_IDS = itertools.count(1 << 63)  # the sequence IDs of iterative requests sent without one
_RELEASE = object()  # queued by the idle reaper: the slot's sequence is over once this is reached


@dataclasses.dataclass(eq=False)
class _Item:
    request: InferRequest
    future: asyncio.Future
    enqueue_ns: int


class _Slot:
    """One batch slot of one instance; its queue holds the requests of the sequence(s) it serves, in order."""

    __slots__ = ("busy", "index", "instance", "queue", "states")

    def __init__(self, instance: Any, index: int) -> None:
        self.instance = instance
        self.index = index
        self.queue: deque[Any] = deque()  # _Item or _RELEASE
        self.states: dict[str, Any] | None = None  # implicit state inputs of the sequence in the slot
        self.busy = False  # a request of this slot is in the dynamic batcher (oldest) or a running batch


@dataclasses.dataclass(eq=False)
class _Backlog:
    correlation_id: int | str
    items: deque[_Item]
    expires_ns: int = NEVER


class SequenceBatcher:
    """The sequence batcher of one model in one replica.

    It holds the slots of ``SequenceSettings.instances`` instances (``replica_instances``: this
    replica's own one where the backend keeps the sequences' state, every instance of the model where
    the scheduler does, with at least ``max_concurrent_batches`` then). At most
    ``max_concurrent_batches`` batches run at once, one per instance, and a new sequence fills the
    slots of the instances that run at once before it takes another's, so batches stay full.
    """

    def __init__(
        self,
        model: ModelDescription,
        execute: ExecuteFn,
        *,
        max_concurrent_batches: int = 1,
        on_batch: BatchCallback | None = None,
        dynamic_batcher: BatcherClass | None = None,
    ) -> None:
        self.settings = settings = SequenceSettings.from_model(model)
        self.model_name = model.name
        # state outputs the configuration lists among the model's outputs: a client may ask for them
        self._listed_states = frozenset(settings.state_outputs) & {t.name for t in model.outputs}
        self._execute = execute
        self._on_batch = on_batch
        self._concurrent = max(max_concurrent_batches, 1)
        self._gate = asyncio.Semaphore(self._concurrent)  # batches running through ``execute``
        # a backend keeping sequence state sees one instance's slots, one batch at a time (Triton's contract)
        count = max(self._concurrent, settings.instances) if settings.states else settings.instances
        self.instances: list[_DirectInstance | _OldestInstance]
        if settings.strategy == "oldest":
            if dynamic_batcher is None:
                raise ValueError("the oldest strategy needs the dynamic batcher class (dynamic_batcher=)")
            self.instances = [_OldestInstance(self, i, model, dynamic_batcher) for i in range(count)]
        else:
            self.instances = [_DirectInstance(self, i) for i in range(count)]
        self._free = [self._free_key(slot) for inst in self.instances for slot in inst.slots]
        heapq.heapify(self._free)
        self._bound: dict[int | str, _Slot] = {}  # sequences holding a slot (until their END is queued)
        self._reserved: set[int | str] = set()  # ... of which lent sequences whose START is on its way
        # when each last had nothing queued (its last request's arrival or answer), for the idle reaper
        self._last_ns: dict[int | str, int] = {}
        self._backlog: deque[_Backlog] = deque()
        self._backlog_open: dict[int | str, _Backlog] = {}  # backlogged sequences whose END has not come
        self._reaper: asyncio.TimerHandle | None = None
        self._reaper_at = NEVER
        self._changed: asyncio.Future | None = None
        self._closing = False
        self._closed = False
        # a testing hook (TRITONSERVER_DELAY_SCHEDULER), counted over the model's replicas where shared
        self._hold = HoldGate(first_batch_hold(), model.name)

    async def holding(self) -> bool:
        """Whether the first batch still waits for the requests and backlog the hold asks for."""
        if not self._hold.active:
            return False
        queued = sum(len(slot.queue) for inst in self.instances for slot in getattr(inst, "slots", ()))
        backlogged = sum(len(b.items) for b in self._backlog)  # requests, as Triton counts its backlog
        return await self._hold.holds(queued, backlogged, self._closing)

    def _free_key(self, slot: _Slot) -> tuple[int, int, int]:
        """Free slots by this key: the lowest index over the instances that run at once, then the next."""
        number = slot.instance.number
        return number // self._concurrent, slot.index, number

    async def _execute_gated(self, requests: list[InferRequest]) -> list[InferResponse]:
        async with self._gate:
            return await self._execute(requests)

    @property
    def active_sequences(self) -> int:
        return len(self._bound)

    @property
    def backlog_size(self) -> int:
        return len(self._backlog)

    def holds(self, correlation_id: int | str) -> bool:
        """Whether sequence ``correlation_id`` is live here: it holds a slot or waits in the backlog."""
        return correlation_id in self._bound or correlation_id in self._backlog_open

    def has_free_slot(self) -> bool:
        """Whether a new sequence would take a slot here now rather than wait in the backlog."""
        return bool(self._free) and not self._closing and not self._closed

    def reserve(self, correlation_id: int | str) -> bool:
        """Bind a free slot to a new sequence whose START is on its way (a full owner's loan,
        docs/sequence.md): True where one was free. Until the START comes the slot is held as by a
        sequence with nothing queued (the idle limit releases it), and only a START may use it."""
        cid = correlation_id
        if cid in self._bound or cid in self._backlog_open or not self.has_free_slot():
            return False
        self._take_free_slot(cid)
        self._reserved.add(cid)
        now = time.monotonic_ns()
        self._last_ns[cid] = now
        self._arm_reaper(now + self.settings.idle_ns)
        return True

    @property
    def idle_ns(self) -> int:
        """How long a sequence may go without a request before it loses its slot (0: no limit)."""
        return self.settings.idle_ns

    # -- admission -------------------------------------------------------------

    async def submit(self, request: InferRequest) -> InferResponse:
        """Queue ``request`` in its sequence's slot (or the backlog); return its own response."""
        if self.settings.iterative:
            self._own_sequence(request)
        error = self._admission_error(request)
        if error is not None:
            return InferResponse.failed(request, error)
        item = _Item(request, asyncio.get_running_loop().create_future(), time.monotonic_ns())
        self._enqueue(item)
        try:
            return await item.future
        except asyncio.CancelledError:
            if item.future.cancelled():  # still pending: it never reached the model
                self._cancel_sequence(item)
            raise

    def _own_sequence(self, request: InferRequest) -> None:
        """An iterative sequence (``iterative_sequence: true``): the one request is the whole sequence, its
        control inputs filled here, as Triton's scheduler does; the model runs it again each time it
        releases it with ``RESCHEDULE``. A request without a sequence ID gets one of the server's own,
        apart from any a client sends (above 2**63)."""
        if request.correlation_id == 0 or request.correlation_id == "":
            request.correlation_id = next(_ITERATIVE_IDS)
        request.sequence_start = request.sequence_end = True

    def _admission_error(self, request: InferRequest) -> ServerError | None:
        cid = request.correlation_id
        if self._closed or (self._closing and request.sequence_start):
            return Unavailable(
                f"model '{self.model_name}' is shutting down and accepts no new sequences "
                f"(request '{request.id}')"
            )
        if cid == 0 or cid == "":
            return InvalidArgument(
                f"inference request to model '{self.model_name}' must specify a non-zero or non-empty "
                "correlation ID"
            )
        if self.settings.batched and request.batch_rows() != 1:
            return InvalidArgument(
                f"inference request to model '{self.model_name}' must specify batch-size 1 due to "
                "requirements of sequence batcher"
            )
        if not request.sequence_start and (
            (cid not in self._bound and cid not in self._backlog_open) or cid in self._reserved
        ):
            return InvalidArgument(
                f"inference request for sequence {cid} to model '{self.model_name}' must specify the "
                "START flag on the first request of the sequence"
            )
        if CORRID in self.settings.controls:
            try:
                self.settings.control_tensors(False, False, True, cid)
            except InvalidArgument as bad_id:
                return bad_id
        return None

    def _enqueue(self, item: _Item) -> None:
        request, now = item.request, item.enqueue_ns
        cid = request.correlation_id
        slot = self._bound.get(cid)
        backlog = self._backlog_open.get(cid)
        if cid in self._reserved:  # the START of a lent sequence, into the slot kept for it
            self._reserved.discard(cid)
        elif request.sequence_start and (slot is not None or backlog is not None):
            logger.warning(
                "sequence %s for model '%s' started again before it ended; the earlier one ends here",
                cid,
                self.model_name,
            )
        if slot is None and backlog is None and self._free:
            slot = self._take_free_slot(cid)
        if slot is not None:
            self._last_ns[cid] = now
            if request.sequence_end:
                del self._bound[cid]
                del self._last_ns[cid]
            else:
                self._arm_reaper(now + self.settings.idle_ns)
            slot.queue.append(item)
            slot.instance.wake(slot)
            return
        if backlog is None:
            backlog = _Backlog(cid, deque())
            self._backlog.append(backlog)
            self._backlog_open[cid] = backlog
        backlog.items.append(item)
        if request.timeout_us > 0:
            backlog.expires_ns = min(backlog.expires_ns, now + request.timeout_us * 1000)
            self._arm_reaper(backlog.expires_ns)
        if request.sequence_end:
            del self._backlog_open[cid]

    def _take_free_slot(self, cid: int | str) -> _Slot:
        """Bind the first free slot (:meth:`_free_key` order) to sequence ``cid``."""
        _, index, number = heapq.heappop(self._free)
        slot = self.instances[number].slots[index]
        self._bound[cid] = slot
        return slot

    def _cancel_sequence(self, item: _Item) -> None:
        """A pending request of a sequence was cancelled: as in Triton, every other pending request of
        the sequence is answered CANCELLED and the sequence ends (its slot goes to the backlog's next
        sequence once a request of it that already runs is answered). A request that runs goes on."""
        cid = item.request.correlation_id
        error = SequenceCancelled(
            f"request '{item.request.id}' of sequence {cid} to model '{self.model_name}' was cancelled; "
            "the sequence's other pending requests are cancelled with it"
        )
        for backlog in self._backlog:
            if item in backlog.items:
                self._drop_backlog(backlog, error)
                return
        for instance in self.instances:
            for slot in instance.slots:
                if item in slot.queue:
                    self._end_in_slot(slot, cid, error)
                    return

    def _end_in_slot(self, slot: _Slot, cid: int | str, error: ServerError) -> None:
        """Answer ``error`` to the pending requests of sequence ``cid`` in ``slot`` and end the sequence
        there: a release mark takes their place in the slot's queue."""
        kept: deque[Any] = deque()
        marked = False
        for queued in slot.queue:
            if queued is not _RELEASE and queued.request.correlation_id == cid:
                _resolve(queued.future, InferResponse.failed(queued.request, error))
                if not marked:
                    kept.append(_RELEASE)
                    marked = True
                continue
            kept.append(queued)
        slot.queue = kept
        if self._bound.get(cid) is slot:
            del self._bound[cid]
            self._last_ns.pop(cid, None)
        slot.instance.wake(slot)

    # -- slots -----------------------------------------------------------------

    def settle(self, slot: _Slot) -> _Item | None:
        """The slot's next live request, after releasing for reaper marks and skipping cancelled requests."""
        queue = slot.queue
        while queue:
            front = queue[0]
            if front is _RELEASE:
                queue.popleft()
                self.release(slot)
                continue
            if not front.future.done():
                return front
            queue.popleft()  # the client went away: its flags still count
            if front.request.sequence_start:
                slot.states = None
            if front.request.sequence_end:
                self.release(slot)
        return None

    def release(self, slot: _Slot) -> None:
        """The slot's sequence ended: hand the slot to the oldest backlogged sequence, or free it."""
        slot.states = None
        self._notify()
        if self._backlog:
            backlog = self._backlog.popleft()
            cid = backlog.correlation_id
            if self._backlog_open.get(cid) is backlog:
                del self._backlog_open[cid]
                self._bound[cid] = slot
                now = time.monotonic_ns()
                self._last_ns[cid] = now
                self._arm_reaper(now + self.settings.idle_ns)
            slot.queue.extend(backlog.items)
            return
        heapq.heappush(self._free, self._free_key(slot))

    def prepare(self, slot: _Slot, item: _Item) -> InferRequest:
        """The request as the backend sees it: control inputs and the sequence's state added."""
        request = item.request
        if request.sequence_start or slot.states is None:
            slot.states = self.settings.initial_states()
        controls = self.settings.control_tensors(
            request.sequence_start, request.sequence_end, True, request.correlation_id
        )
        return self._with_inputs(request, {**controls, **slot.states})

    def padding(self, like: InferRequest) -> InferRequest:
        """A not-ready request for an empty slot below the batch's highest: ``like``'s inputs, READY false."""
        controls = self.settings.control_tensors(False, False, False, 0)
        padded = self._with_inputs(like, {**controls, **self.settings.initial_states()})
        return dataclasses.replace(padded, id="", correlation_id=0, sequence_start=False, sequence_end=False)

    def _with_inputs(self, request: InferRequest, added: dict[str, Any]) -> InferRequest:
        requested = request.requested_outputs
        if requested is not None and self.settings.states:
            names = {o.name for o in requested}
            requested = requested + [
                RequestedOutput(name) for name in self.settings.state_outputs if name not in names
            ]
        return dataclasses.replace(request, inputs={**request.inputs, **added}, requested_outputs=requested)

    def _shown_states(self, request: InferRequest) -> frozenset[str]:
        if not self._listed_states or request.requested_outputs is None:
            return self._listed_states
        return self._listed_states & {o.name for o in request.requested_outputs}

    def finish(self, slot: _Slot, item: _Item, response: InferResponse) -> None:
        """Keep the output state of a sequence that goes on; answer the client without it, unless the
        configuration lists it as an output and the client asked for it (or for every output)."""
        if self.settings.states and response.outputs:
            shown = self._shown_states(item.request)
            taken = {
                self.settings.state_outputs[name]: (
                    response.outputs[name] if name in shown else response.outputs.pop(name)
                )
                for name in list(response.outputs)
                if name in self.settings.state_outputs
            }
            if taken and response.error is None and not item.request.sequence_end and slot.states is not None:
                slot.states.update(taken)
        _resolve(item.future, response)
        cid = item.request.correlation_id
        if self._bound.get(cid) is slot:  # the sequence goes on: its idle clock starts again now
            now = time.monotonic_ns()
            self._last_ns[cid] = now
            self._arm_reaper(now + self.settings.idle_ns)
        self._notify()

    def record(self, rows: int, queue_ns: list[int]) -> None:
        """Report a Direct batch: ``rows`` counts padding, ``queue_ns`` the real requests."""
        if self._on_batch is not None:
            try:
                self._on_batch(rows, len(queue_ns), queue_ns)
            except Exception:
                logger.exception("batch callback of model '%s' failed", self.model_name)

    # -- idle sequences and backlog timeouts -----------------------------------

    def _arm_reaper(self, at_ns: int) -> None:
        if self._reaper is not None and self._reaper_at <= at_ns:
            return
        if self._reaper is not None:
            self._reaper.cancel()
        self._reaper_at = at_ns
        delay = max(at_ns - time.monotonic_ns(), 0) / 1e9
        self._reaper = asyncio.get_running_loop().call_later(delay, self._reap)

    def _reap(self) -> None:
        """Release the slots of idle sequences and fail backlogged sequences whose timeout expired.

        A sequence is idle, as Triton's ``max_sequence_idle_microseconds`` defines it, when it has no
        request queued: one with a request waiting in its slot, in the dynamic batcher or in a running
        batch is not reaped, and its clock starts again when that request is answered (``finish``).
        """
        self._reaper, self._reaper_at = None, NEVER
        now = time.monotonic_ns()
        next_at = NEVER
        for cid, last in list(self._last_ns.items()):
            deadline = last + self.settings.idle_ns
            if deadline > now:
                next_at = min(next_at, deadline)
                continue
            slot = self._bound[cid]
            if slot.busy or slot.queue:  # not idle: ``finish`` restarts its clock; looked at again meanwhile
                next_at = min(next_at, now + self.settings.idle_ns)
                continue
            logger.info("sequence %s of model '%s' idle too long; its slot is released", cid, self.model_name)
            del self._last_ns[cid]
            del self._bound[cid]
            self._reserved.discard(cid)
            slot.queue.append(_RELEASE)
            slot.instance.wake(slot)
        for backlog in list(self._backlog):
            if backlog.expires_ns > now:
                next_at = min(next_at, backlog.expires_ns)
                continue
            self._drop_backlog(backlog, Unavailable("timeout of the corresponding sequence has been expired"))
        if next_at < NEVER:
            self._arm_reaper(next_at)

    def _drop_backlog(self, backlog: _Backlog, error: ServerError) -> None:
        self._backlog.remove(backlog)
        if self._backlog_open.get(backlog.correlation_id) is backlog:
            del self._backlog_open[backlog.correlation_id]
        for item in backlog.items:
            _resolve(item.future, InferResponse.failed(item.request, error))
        self._notify()

    # -- closing ---------------------------------------------------------------

    def _idle(self) -> bool:
        return not self._backlog and all(inst.idle for inst in self.instances)

    def _notify(self) -> None:
        if self._changed is not None:
            _resolve(self._changed)

    async def close(self, drain: bool = True) -> None:
        """Take no new sequences; run what is queued (``drain``) or reject it; wait for running batches."""
        self._closing = True
        if not drain:
            error = Unavailable(f"model '{self.model_name}' is shutting down")
            for backlog in list(self._backlog):
                self._drop_backlog(backlog, error)
            for instance in self.instances:
                for slot in instance.slots:
                    while slot.queue:
                        item = slot.queue.popleft()
                        if item is not _RELEASE:
                            _resolve(item.future, InferResponse.failed(item.request, error))
        for instance in self.instances:
            for slot in instance.slots:
                instance.wake(slot)
        while not self._idle():
            self._changed = asyncio.get_running_loop().create_future()
            await self._changed
            self._changed = None
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        for instance in self.instances:
            await instance.close()
        await self._hold.close()


class _DirectInstance:
    """One model instance of the Direct strategy: ``max_batch_size`` slots, one batch at a time."""

    def __init__(self, owner: SequenceBatcher, number: int) -> None:
        self.owner = owner
        self.number = number
        self.slots = [_Slot(self, i) for i in range(max(owner.settings.max_batch_size, 1))]
        self._task: asyncio.Task | None = None
        self._wakeup: asyncio.Future | None = None

    @property
    def idle(self) -> bool:
        return self._task is None and not any(s.queue for s in self.slots)

    def wake(self, slot: _Slot) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        elif self._wakeup is not None:
            _resolve(self._wakeup)

    async def close(self) -> None:
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        try:
            await self._schedule()
        except Exception:
            logger.exception("sequence batcher of model '%s' failed", self.owner.model_name)
            self._fail_queued()
        finally:
            self._task = None
            self.owner._notify()

    def _ready(self) -> list[tuple[_Slot, _Item]]:
        return [(slot, item) for slot in self.slots if (item := self.owner.settle(slot)) is not None]

    async def _schedule(self) -> None:
        settings = self.owner.settings
        while True:
            ready = self._ready()
            if not ready:
                return
            if await self.owner.holding():
                await self._sleep(HOLD_POLL_NS)  # the hold is looked at again every 10 ms, as in Triton
                continue
            if settings.delay_ns > 0 and settings.minimum_slot_utilization > 0 and not self.owner._closing:
                oldest = min(item.enqueue_ns for _, item in ready)
                wait_ns = oldest + settings.delay_ns - time.monotonic_ns()
                utilization = len(ready) / len(self.slots)
                if wait_ns > 0 and utilization < settings.minimum_slot_utilization:
                    await self._sleep(wait_ns)
                    continue
            async with self.owner._gate:  # requests that come while another instance runs join this batch
                ready = self._ready()
                if ready:
                    await self._execute(ready)

    async def _execute(self, ready: list[tuple[_Slot, _Item]]) -> None:
        owner = self.owner
        by_index = {slot.index: (slot, item) for slot, item in ready}
        like = ready[0][1].request
        requests: list[InferRequest] = []
        taken: list[tuple[_Slot, _Item] | None] = []
        now = time.monotonic_ns()
        for index in range(max(by_index) + 1):
            if index not in by_index:
                requests.append(owner.padding(like))
                taken.append(None)
                continue
            slot, item = by_index[index]
            slot.queue.popleft()
            slot.busy = True
            requests.append(owner.prepare(slot, item))
            taken.append((slot, item))
            if item.request.sequence_end:
                owner.release(slot)
        owner.record(len(requests), [now - e[1].enqueue_ns for e in taken if e is not None])
        try:
            responses = await run_batch(owner._execute, requests, owner.model_name)
        finally:
            for entry in taken:
                if entry is not None:
                    entry[0].busy = False
        for entry, response in zip(taken, responses, strict=True):
            if entry is not None:
                owner.finish(entry[0], entry[1], response)

    async def _sleep(self, wait_ns: int) -> None:
        loop = asyncio.get_running_loop()
        waiter = self._wakeup = loop.create_future()
        handle = loop.call_later(wait_ns / 1e9, _resolve, waiter)
        try:
            await waiter
        finally:
            self._wakeup = None
            handle.cancel()

    def _fail_queued(self) -> None:
        error = InternalError(f"the sequence batcher of model '{self.owner.model_name}' failed")
        for slot in self.slots:
            while slot.queue:
                item = slot.queue.popleft()
                if item is not _RELEASE:
                    _resolve(item.future, InferResponse.failed(item.request, error))


class _OldestInstance:
    """One model instance of the Oldest strategy: candidate slots feeding one dynamic batcher."""

    def __init__(
        self, owner: SequenceBatcher, number: int, model: ModelDescription, batcher_class: BatcherClass
    ) -> None:
        settings = owner.settings
        self.owner = owner
        self.number = number
        self.slots = [_Slot(self, i) for i in range(settings.max_candidate_sequences)]
        self._tasks: set[asyncio.Task] = set()
        config = DynamicBatching(
            preferred_batch_size=settings.preferred_batch_size,
            max_queue_delay_microseconds=settings.delay_ns // 1000,
            preserve_ordering=settings.preserve_ordering,
        )
        self.batcher = batcher_class(
            config,
            settings.max_batch_size,
            backend_model(model).inputs,
            owner._execute_gated,
            on_batch=owner._on_batch,
            model_name=model.name,
            # as tritonserver's per-instance batcher of this strategy: its own queue, never shared
            hold=FirstBatchHold(first_batch_hold().requests),
        )

    @property
    def idle(self) -> bool:
        return not self._tasks and not any(s.queue for s in self.slots)

    def wake(self, slot: _Slot) -> None:
        """Hand the slot's next request to the dynamic batcher, unless one of its requests is there."""
        if slot.busy:
            return
        item = self.owner.settle(slot)
        if item is None:
            return
        slot.queue.popleft()
        slot.busy = True
        request = self.owner.prepare(slot, item)
        task = asyncio.get_running_loop().create_task(self._issue(slot, item, request))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self.owner._notify()

    async def _issue(self, slot: _Slot, item: _Item, request: InferRequest) -> None:
        try:
            response = await self.batcher.submit(request)
        finally:
            slot.busy = False
        if response is None:  # the batcher dropped it (shutting down)
            response = InferResponse.failed(
                item.request, Unavailable(f"model '{self.owner.model_name}' is shutting down")
            )
        self.owner.finish(slot, item, response)
        if item.request.sequence_end:
            self.owner.release(slot)
        self.wake(slot)

    async def close(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self.batcher.close()


def _resolve(future: asyncio.Future, result: object = None) -> None:
    if not future.done():
        future.set_result(result)


__all__ = ["SequenceBatcher"]
