"""One batch through a backend's ``execute``, as every scheduler of a replica runs it.

The dynamic batcher, the pass-through scheduler and the sequence batcher all hand a
list of requests to ``execute`` and give each request its response; a failing or
miscounting ``execute`` becomes the error of every request of the batch, never an
exception in the scheduler's loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from deployments.inference import InferRequest, InferResponse
from repository_loader.errors import InternalError, ServerError

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


__all__ = ["BatchCallback", "ExecuteFn", "run_batch"]


@dataclass(frozen=True)
class FirstBatchHold:
    """How long the schedulers made in this process hold their first batch: until ``requests`` are
    queued and ``backlog`` requests of sequences wait for a slot (0: not held)."""

    requests: int = 0
    backlog: int = 0


_hold = FirstBatchHold()


def hold_first_batches(requests: int, backlog: int = 0) -> None:
    """Triton's ``TRITONSERVER_DELAY_SCHEDULER`` and ``TRITONSERVER_BACKLOG_DELAY_SCHEDULER``
    (``ServerSettings.delay_scheduler``, ``backlog_delay_scheduler``) for the schedulers this process
    makes from now on: each forms no batch until that many requests are queued (and, for the
    sequence batcher, that many requests of sequences without a slot wait in its backlog), once. A testing hook, as in
    tritonserver: Triton's qa tests queue requests this way before the scheduler may cut them."""
    global _hold
    _hold = FirstBatchHold(max(int(requests), 0), max(int(backlog), 0))


def first_batch_hold() -> FirstBatchHold:
    return _hold
