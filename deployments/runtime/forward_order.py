"""A sequence's requests, sent on to its owner on calls of their own, queued there in the order they came.

A replica that receives a request of a sequence another replica owns sends it on at once, on an HTTP
call of its own, without waiting for the answers of the sequence's earlier requests (Triton queues
every request a client streams; its delayed qa tests hold the first batch until several are queued).
Calls can overtake each other on the way, so each carries its place in the sequence's order
(:data:`SEQUENCE_ORDER`): the sending process's ``origin``, the request's number ``n`` there, and
``after``, the number of the sequence's previous request sent from there while that one has no
answer yet. The owner queues a request once the one it comes ``after`` is queued
(:class:`ArrivalGate`). Numbers grow for the life of the sending process, so they never repeat.

A request whose predecessor never arrives (its caller left before it was sent, or the owner
restarted and forgot it) waits :data:`GAP_S` at most, then is queued anyway.

While an owner asks other replicas to take a sequence's START (docs/sequence.md, "A full owner lends"),
the sequence's later requests wait for it in a :class:`PlacingLine` and go on one at a time in the order
they came; one that comes once the START went on waits behind those still waiting, never overtaking them.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from deployments.timeouts import within

SEQUENCE_ORDER = b"x-triton-sequence-order"
"""Set beside ``FORWARDED`` on a request sent on to a sequence's owner: ``<origin> <n> [<after>]``."""

GAP_S = 5.0
"""How long the owner keeps a request waiting for the one it comes after."""

KEEP_S = 600.0
"""How long the owner remembers a sender's sequence after its last request there."""

log = logging.getLogger(__name__)

Key = tuple[str, int | str]  # (origin, correlation ID)


@dataclass(frozen=True)
class Order:
    """A forwarded request's place: ``n`` from ``origin``, queued only after ``after`` (if any)."""

    origin: str
    n: int
    after: int | None = None

    def header(self) -> str:
        return f"{self.origin} {self.n}" if self.after is None else f"{self.origin} {self.n} {self.after}"

    @classmethod
    def parse(cls, value: bytes | str) -> Order | None:
        """The order a header carries; None where it is not one (the request is then queued as it comes)."""
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        parts = text.split()
        try:
            if len(parts) == 2:
                return cls(parts[0], int(parts[1]))
            if len(parts) == 3:
                return cls(parts[0], int(parts[1]), int(parts[2]))
        except ValueError:
            pass
        return None


class SendOrder:
    """The sending side: numbers each request sent on, in the order :meth:`next` is called."""

    def __init__(self) -> None:
        self.origin = uuid.uuid4().hex[:16]
        self._numbers = itertools.count(1)
        # each sequence's latest request sent on that has no answer yet
        self._latest: dict[int | str, int] = {}

    def next(self, correlation_id: int | str) -> Order:
        """The order of the sequence's next request; call :meth:`answered` once it has its answer."""
        n = next(self._numbers)
        after = self._latest.get(correlation_id)
        self._latest[correlation_id] = n
        return Order(self.origin, n, after)

    def answered(self, correlation_id: int | str, order: Order) -> None:
        """``order``'s request has its answer (or failed): later ones need not wait for it."""
        if self._latest.get(correlation_id) == order.n:
            del self._latest[correlation_id]

    @property
    def waiting(self) -> int:
        """Sequences with a request on its way."""
        return len(self._latest)


class ArrivalGate:
    """The owner's side: a request passes :meth:`turn` once the request it comes after passed."""

    def __init__(self, gap_s: float = GAP_S, keep_s: float = KEEP_S) -> None:
        self.gap_s = gap_s
        self.keep_s = keep_s
        self.gaps = 0  # requests queued without their predecessor, after waiting gap_s
        self._passed: OrderedDict[Key, tuple[int, float]] = OrderedDict()  # highest n passed, when
        self._waiting: dict[Key, list[tuple[int, asyncio.Future[None]]]] = {}

    async def turn(self, correlation_id: int | str, order: Order) -> None:
        """Return once ``order``'s predecessor passed (or after ``gap_s``); then mark it passed.

        The caller queues its request before its next suspension point: :meth:`passed` wakes the
        waiters only on the loop's next turn."""
        key = (order.origin, correlation_id)
        if order.after is not None and not self._has_passed(key, order.after):
            ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(key, []).append((order.after, ready))
            try:
                await within(asyncio.shield(ready), self.gap_s)
            except TimeoutError:
                self.gaps += 1
                log.warning(
                    "sequence %s: request %d from %s queued without request %d, which did not arrive "
                    "within %.1f s",
                    correlation_id, order.n, order.origin, order.after, self.gap_s,
                )  # fmt: skip
            finally:
                waiters = self._waiting.get(key)
                if waiters is not None:
                    waiters[:] = [w for w in waiters if w[1] is not ready]
                    if not waiters:
                        del self._waiting[key]
        self._passed_now(key, order.n)

    def _has_passed(self, key: Key, n: int) -> bool:
        found = self._passed.get(key)
        return found is not None and found[0] >= n

    def _passed_now(self, key: Key, n: int) -> None:
        now = time.monotonic()
        found = self._passed.get(key)
        highest = n if found is None else max(found[0], n)
        self._passed[key] = (highest, now)
        self._passed.move_to_end(key)
        for after, ready in self._waiting.get(key, ()):
            if after <= highest and not ready.done():
                ready.set_result(None)
        while self._passed:  # forget senders' sequences idle for keep_s
            oldest, (_, when) = next(iter(self._passed.items()))
            if oldest == key or now - when < self.keep_s or oldest in self._waiting:
                break
            del self._passed[oldest]

    @property
    def remembered(self) -> int:
        return len(self._passed)


@dataclass
class _Line:
    held: bool = True  # its START has not gone on yet
    waiting: deque[asyncio.Future[None]] = field(default_factory=deque)


class PlacingLine:
    """The requests of a sequence that come while its START is held, let on in the order they came.

    :meth:`hold` and :meth:`release` bracket the START's wait; :meth:`wait` returns at a request's turn:
    at once where nothing of its sequence is held or waiting, else after the START went on and every
    request that came before it went on. A request let on reaches its queue (or its call) before its
    next suspension; the next one is woken on a later turn of the loop, so it cannot overtake it, and a
    START among the waiters that is held in its turn holds those behind it again."""

    def __init__(self) -> None:
        self._lines: dict[int | str, _Line] = {}

    def hold(self, correlation_id: int | str) -> None:
        """The sequence's START is asking where it can run: its later requests wait."""
        line = self._lines.get(correlation_id)
        if line is None:
            self._lines[correlation_id] = _Line()
        else:  # a START that waited in the line itself: those behind it wait for it now
            line.held = True

    def release(self, correlation_id: int | str) -> None:
        """The START went on (it was sent, or it is queued here): the first waiting request goes next."""
        line = self._lines.get(correlation_id)
        if line is not None:
            line.held = False
            self._advance(correlation_id, line)

    def holding(self, correlation_id: int | str) -> bool:
        """Whether a request of the sequence would wait now."""
        return correlation_id in self._lines

    async def wait(self, correlation_id: int | str) -> None:
        """Return at this request's turn (see the class)."""
        line = self._lines.get(correlation_id)
        if line is None:
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        line.waiting.append(turn)
        try:
            await turn
        finally:
            line.waiting.remove(turn)
            # the next one goes once this one went on (or left): on the loop's next turn, after this
            # request reached its queue, and only if a START let on here did not hold the line again
            asyncio.get_running_loop().call_soon(self._advance, correlation_id, line)

    def _advance(self, correlation_id: int | str, line: _Line) -> None:
        if line.held or self._lines.get(correlation_id) is not line:
            return
        if not line.waiting:
            del self._lines[correlation_id]
        elif not line.waiting[0].done():
            line.waiting[0].set_result(None)

    @property
    def lines(self) -> int:
        """Sequences with a START held or requests waiting (for tests and statistics)."""
        return len(self._lines)


__all__ = ["GAP_S", "SEQUENCE_ORDER", "ArrivalGate", "Order", "PlacingLine", "SendOrder"]
