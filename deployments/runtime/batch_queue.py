"""The dynamic batcher's queue: priority levels, queue policies and batch planning.

Framework-free and synchronous; :mod:`deployments.runtime.batching` drives it from
asyncio. The rules follow Triton's dynamic batcher:

* requests wait in one queue per priority level (1 is the highest); each level
  has a ``QueuePolicy`` (timeout with REJECT or DELAY, ``max_queue_size``) and
  keeps requests whose timeout expired under DELAY in a second, "delayed"
  queue served after its regular one;
* a batch is planned by scanning the levels highest first, counting rows (the
  first dimension of a request's inputs), stopping at the first request that
  would overflow ``max_batch_size`` or whose shapes differ from the batch's;
* it executes at once when a preferred size is reached (the largest reachable
  wins), when it cannot grow further, or when its oldest request has waited
  ``max_queue_delay_microseconds``; otherwise the batcher waits.
"""

from __future__ import annotations

import asyncio
from bisect import insort
from collections import deque
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass

from deployments.inference import InferRequest
from repository_loader.errors import Rejected
from repository_loader.model import DynamicBatching, QueuePolicy, TensorSpec

NEVER = 1 << 62  # a deadline that never comes, in monotonic nanoseconds


class Entry:
    """One queued request: its future, rows, shape key, order and deadlines."""

    __slots__ = ("request", "future", "rows", "key", "seq", "enqueue_ns", "deadline_ns")

    def __init__(
        self,
        request: InferRequest,
        future: asyncio.Future,
        rows: int,
        key: Hashable,
        seq: int,
        enqueue_ns: int,
        deadline_ns: int,
    ) -> None:
        self.request = request
        self.future = future
        self.rows = rows
        self.key = key
        self.seq = seq
        self.enqueue_ns = enqueue_ns
        self.deadline_ns = deadline_ns

    @property
    def abandoned(self) -> bool:
        """The waiter went away (client disconnected or the call was cancelled)."""
        return self.future.done()


def grouping_inputs(inputs: Sequence[TensorSpec]) -> tuple[frozenset[str], frozenset[str]]:
    """Names of the ragged inputs and of the shape-tensor inputs of a model, for :meth:`InferRequest.batch_key`."""
    ragged = frozenset(t.name for t in inputs if t.allow_ragged_batch)
    shape_tensors = frozenset(t.name for t in inputs if t.is_shape_tensor)
    return ragged, shape_tensors


@dataclass(frozen=True)
class BatchPlan:
    """What to do now: take ``count`` entries, or wait until ``wake_ns`` (``count`` 0)."""

    count: int
    wake_ns: int = NEVER


def plan_batch(
    entries: Iterator[Entry],
    max_rows: int,
    preferred: frozenset[int],
    delay_ns: int,
    now_ns: int,
) -> BatchPlan:
    """Decide the next batch from the queued entries, in scheduling order.

    ``max_rows`` is ``max_batch_size``; ``preferred`` the preferred batch
    sizes. A first entry larger than ``max_rows`` forms a batch of its own
    rather than blocking the queue.
    """
    target = max(preferred) if preferred else max_rows
    total = count = best = 0
    key: Hashable = None
    oldest = NEVER
    blocked = False
    for entry in entries:
        if count == 0:
            key = entry.key
        else:
            if total + entry.rows > target and best == 0:
                best = count  # cannot reach a preferred size by growing in order
            if total + entry.rows > max_rows or entry.key != key:
                blocked = True
                break
        total += entry.rows
        count += 1
        oldest = min(oldest, entry.enqueue_ns)
        if total in preferred:
            best = count
    if count == 0:
        return BatchPlan(0)
    delay_exceeded = now_ns - oldest >= delay_ns
    if best and not delay_exceeded:
        return BatchPlan(best)
    if delay_exceeded or blocked or total >= target:
        return BatchPlan(count)
    return BatchPlan(0, oldest + delay_ns)


class LevelQueue:
    """The queue of one priority level, with its policy and its delayed requests."""

    __slots__ = ("level", "policy", "main", "delayed")

    def __init__(self, level: int, policy: QueuePolicy) -> None:
        self.level = level
        self.policy = policy
        self.main: deque[Entry] = deque()
        self.delayed: deque[Entry] = deque()

    def __len__(self) -> int:
        return len(self.main) + len(self.delayed)

    def timeout_us(self, request: InferRequest) -> int:
        """The request's timeout: the policy's, or the request's own when it may override (only lower)."""
        default = self.policy.default_timeout_microseconds
        own = request.timeout_us
        if self.policy.allow_timeout_override and own > 0 and (default == 0 or own < default):
            return own
        return default


class PriorityQueues:
    """Per-priority queues served highest first, with Triton's queue policies.

    A level's queue exists while it has requests (or a policy of its own): ``priority_levels`` may be
    as large as a uint64 (Triton's own tests set it so), and only the levels in use cost anything."""

    def __init__(self, config: DynamicBatching, model_name: str = "") -> None:
        self.model_name = model_name
        self.level_count = max(config.priority_levels, 1)
        self.default_level = config.default_priority_level if config.priority_levels else 1
        self.default_policy = config.default_queue_policy
        self.policies = dict(config.priority_queue_policy) if config.priority_levels else {}
        self.levels: list[LevelQueue] = []  # the levels in use, highest (lowest number) first
        self._by_level: dict[int, LevelQueue] = {}
        for level in sorted({self.default_level, *self.policies}):
            self._open(level)
        self.has_timeouts = any(
            p.default_timeout_microseconds > 0 or p.allow_timeout_override
            for p in (self.default_policy, *self.policies.values())
        )
        self.next_deadline_ns = NEVER
        self.size = 0

    def _open(self, level: int) -> LevelQueue:
        queue = LevelQueue(level, self.policies.get(level, self.default_policy))
        self._by_level[level] = queue
        insort(self.levels, queue, key=lambda q: q.level)
        return queue

    def level_of(self, request: InferRequest) -> LevelQueue:
        """The request's level: its priority, or the default when 0 or out of range (as Triton does)."""
        priority = request.priority
        if priority <= 0 or priority > self.level_count:
            priority = self.default_level
        queue = self._by_level.get(priority)
        return queue if queue is not None else self._open(priority)

    def _close_empty(self) -> None:
        """Forget the levels left empty that have no policy of their own (and are not the default)."""
        if len(self.levels) > len(self.policies) + 1:
            keep = {self.default_level, *self.policies}
            for queue in [q for q in self.levels if not q.main and not q.delayed and q.level not in keep]:
                self.levels.remove(queue)
                del self._by_level[queue.level]

    def admit_error(self, level: LevelQueue, request: InferRequest) -> Rejected | None:
        """The rejection of a new request when its level's queue is full, else None."""
        limit = level.policy.max_queue_size
        if limit > 0 and len(level) >= limit:
            return Rejected(
                f"Exceeds maximum queue size: model '{self.model_name or request.model_name}' "
                f"already holds {limit} queued requests at priority level {level.level} "
                f"(max_queue_size {limit}); request '{request.id}' rejected"
            )
        return None

    def push(self, level: LevelQueue, entry: Entry) -> None:
        level.main.append(entry)
        self.size += 1
        self.next_deadline_ns = min(self.next_deadline_ns, entry.deadline_ns)

    def __iter__(self) -> Iterator[Entry]:
        """Live entries in scheduling order: level 1 first, each level's regular queue before its delayed one."""
        for level in self.levels:
            for queue in (level.main, level.delayed):
                for entry in queue:
                    if not entry.abandoned:
                        yield entry

    def take(self, count: int, dropped: list[Entry]) -> list[Entry]:
        """Remove the first ``count`` live entries; abandoned ones met on the way go to ``dropped``."""
        taken: list[Entry] = []
        for level in self.levels:
            for queue in (level.main, level.delayed):
                while queue and len(taken) < count:
                    entry = queue.popleft()
                    self.size -= 1
                    (dropped if entry.abandoned else taken).append(entry)
                if len(taken) == count:
                    self._close_empty()
                    return taken
        self._close_empty()
        return taken

    def purge_abandoned(self) -> list[Entry]:
        """Remove and return the entries whose waiter went away."""
        gone: list[Entry] = []
        for level in self.levels:
            for attr in ("main", "delayed"):
                queue: deque[Entry] = getattr(level, attr)
                if any(e.abandoned for e in queue):
                    gone.extend(e for e in queue if e.abandoned)
                    setattr(level, attr, deque(e for e in queue if not e.abandoned))
        self.size -= len(gone)
        self._close_empty()
        return gone

    def drain(self) -> list[Entry]:
        """Remove and return every entry, abandoned ones included."""
        dropped: list[Entry] = []
        taken = self.take(self.size + 1, dropped)
        return taken + dropped

    def expire(self, now_ns: int, rejected: list[tuple[Entry, Rejected]]) -> None:
        """Apply timeouts that passed: REJECT entries go to ``rejected`` with their error, DELAY ones move behind."""
        if now_ns < self.next_deadline_ns:
            return
        next_deadline = NEVER
        for level in self.levels:
            keep: deque[Entry] = deque()
            for entry in level.main:
                if entry.deadline_ns > now_ns:
                    keep.append(entry)
                    next_deadline = min(next_deadline, entry.deadline_ns)
                elif level.policy.timeout_action == "DELAY":
                    entry.deadline_ns = NEVER
                    level.delayed.append(entry)
                else:
                    rejected.append((entry, timeout_error(entry, self.model_name, level)))
                    self.size -= 1
            level.main = keep
        self.next_deadline_ns = next_deadline
        self._close_empty()

    def deadline_for(self, level: LevelQueue, request: InferRequest, now_ns: int) -> int:
        timeout = level.timeout_us(request)
        return now_ns + timeout * 1000 if timeout > 0 else NEVER


def timeout_error(entry: Entry, model_name: str, level: LevelQueue) -> Rejected:
    """The error a request gets when its queue timeout expires under REJECT."""
    request = entry.request
    return Rejected(
        f"Request timeout expired: request '{request.id}' waited more than "
        f"{level.timeout_us(request)} us in the queue of model '{model_name or request.model_name}' "
        f"(priority level {level.level}, timeout_action REJECT)"
    )


__all__ = [
    "NEVER",
    "BatchPlan",
    "Entry",
    "LevelQueue",
    "PriorityQueues",
    "grouping_inputs",
    "plan_batch",
    "timeout_error",
]
