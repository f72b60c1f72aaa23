"""The batch-planning rule on its own: rows, preferred sizes, delay, shapes."""

from __future__ import annotations

import asyncio

from deployments.runtime.batch_queue import NEVER, Entry, plan_batch
from tests.batching.fakes import request


def entries(rows: list[int], enqueue_ns: int = 0, keys: list[object] | None = None) -> list[Entry]:
    loop = asyncio.new_event_loop()
    try:
        return [
            Entry(
                request(str(i)),
                loop.create_future(),
                r,
                (keys or [None] * len(rows))[i],
                i,
                enqueue_ns,
                NEVER,
            )
            for i, r in enumerate(rows)
        ]
    finally:
        loop.close()


def plan(
    rows: list[int],
    max_rows: int = 8,
    preferred: tuple[int, ...] = (),
    delay_ns: int = 10**9,
    now_ns: int = 0,
    keys=None,
):
    return plan_batch(iter(entries(rows, keys=keys)), max_rows, frozenset(preferred), delay_ns, now_ns)


def test_rows_not_requests_fill_a_batch() -> None:
    assert plan([3, 3, 2]).count == 3  # 8 rows: full
    assert plan([3, 3, 3]).count == 2  # the third would overflow max_batch_size


def test_waits_for_the_delay_while_the_batch_can_grow() -> None:
    result = plan([1, 1], delay_ns=5_000, now_ns=1_000)
    assert result.count == 0 and result.wake_ns == 5_000


def test_delay_exceeded_sends_what_is_pending() -> None:
    assert plan([1, 2], delay_ns=5_000, now_ns=5_000).count == 2


def test_largest_attainable_preferred_size_goes_at_once() -> None:
    assert plan([1] * 7, preferred=(2, 4, 6)).count == 6
    assert plan([1] * 3, preferred=(2, 4)).count == 2


def test_preferred_sizes_give_way_once_the_delay_is_exceeded() -> None:
    assert plan([1] * 7, preferred=(2, 4), delay_ns=0).count == 7


def test_batch_that_cannot_reach_a_preferred_size_goes_without_waiting() -> None:
    # 3 + 3 > 4: adding the next request overshoots the largest preferred size
    assert plan([3, 3], preferred=(4,)).count == 1


def test_oversized_first_request_forms_its_own_batch() -> None:
    assert plan([20, 1], max_rows=8).count == 1


def test_shape_change_closes_the_batch() -> None:
    assert plan([1, 1, 1], keys=["a", "a", "b"]).count == 2


def test_empty_queue_plans_nothing() -> None:
    assert plan([]).count == 0 and plan([]).wake_ns == NEVER


def test_batch_key_ignores_batch_dim_and_ragged_inputs() -> None:
    none: frozenset[str] = frozenset()
    assert request("a", rows=1, width=3).batch_key(none, none) == request("b", rows=5, width=3).batch_key(
        none, none
    )
    assert request("a", width=3).batch_key(none, none) != request("b", width=4).batch_key(none, none)
    ragged = frozenset({"IN"})
    assert request("a", width=3).batch_key(ragged, none) == request("b", width=4).batch_key(ragged, none)
