"""A fake backend ``execute`` that records every batch it receives."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from deployments.inference import InferRequest, InferResponse
from repository_loader.model import DynamicBatching, QueuePolicy, TensorSpec

INPUTS = (TensorSpec("IN", "FP32", (-1,)),)
RAGGED_INPUTS = (TensorSpec("IN", "FP32", (-1,), allow_ragged_batch=True),)


def request(rid: str, rows: int = 1, width: int = 2, value: float = 0.0, **kw: object) -> InferRequest:
    """A request of ``rows`` x ``width`` filled with ``value``."""
    data = np.full((rows, width), value, dtype=np.float32)
    return InferRequest(model_name="m", inputs={"IN": data}, id=rid, **kw)  # type: ignore[arg-type]


def config(**kw: object) -> DynamicBatching:
    policy_kw = {k: kw.pop(k) for k in list(kw) if k in QueuePolicy.__dataclass_fields__}
    if policy_kw:
        kw["default_queue_policy"] = QueuePolicy(**policy_kw)  # type: ignore[arg-type]
    return DynamicBatching(**kw)  # type: ignore[arg-type]


class Recorder:
    """Records batches (request ids, rows, shapes); answers each request with its input doubled.

    ``gate``: batches wait for it before answering. ``hold``: per-request-id
    extra seconds to sleep. ``fail``: a predicate on the batch's ids that makes
    ``execute`` raise ``error``.
    """

    def __init__(
        self,
        gate: asyncio.Event | None = None,
        hold: dict[str, float] | None = None,
        fail: Callable[[list[str]], bool] | None = None,
        error: Exception | None = None,
    ) -> None:
        self.batches: list[list[str]] = []
        self.rows: list[int] = []
        self.shapes: list[list[tuple[int, ...]]] = []
        self.completed: list[str] = []
        self.active = 0
        self.max_active = 0
        self.gate = gate
        self.hold = hold or {}
        self.fail = fail
        self.error = error or RuntimeError("boom")

    async def __call__(self, requests: Sequence[InferRequest]) -> list[InferResponse]:
        ids = [r.id for r in requests]
        self.batches.append(ids)
        self.rows.append(sum(r.batch_rows() for r in requests))
        self.shapes.append([tuple(r.inputs["IN"].shape) for r in requests])
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            if self.gate is not None:
                await self.gate.wait()
            wait = max((self.hold.get(i, 0.0) for i in ids), default=0.0)
            if wait:
                await asyncio.sleep(wait)
            if self.fail is not None and self.fail(ids):
                raise self.error
            self.completed.extend(ids)
            return [InferResponse(outputs={"OUT": r.inputs["IN"] * 2}, id=r.id) for r in requests]
        finally:
            self.active -= 1


@dataclass
class SchedulerStats:
    """What a scheduler did, counted through its ``on_batch`` callback (pass ``stats.record``)."""

    batch_counts: Counter[int] = field(default_factory=Counter)  # rows of a batch -> executions
    executed_batches: int = 0
    executed_requests: int = 0
    executed_rows: int = 0
    queue_ns: int = 0  # total time requests waited before their batch started

    def record(self, rows: int, requests: int, queue_ns: Sequence[int]) -> None:
        self.batch_counts[rows] += 1
        self.executed_batches += 1
        self.executed_requests += requests
        self.executed_rows += rows
        self.queue_ns += sum(queue_ns)


async def until(predicate: Callable[[], bool], steps: int = 2000) -> None:
    """Let the event loop run until ``predicate`` holds (fails after ``steps`` short sleeps)."""
    for _ in range(steps):
        if predicate():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition not reached")
