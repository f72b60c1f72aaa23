"""Load generation: closed-loop (fixed concurrency) and open-loop (fixed request rate) request loops.

A loop records each completion as (end time, latency) into a ``Samples`` buffer; the measurement
controller (``bench.measure``) cuts those records into windows. Times come from ``time.perf_counter``,
which on Linux is the system-wide monotonic clock, so records from several client processes line up.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from bench.client import Connection

T = TypeVar("T")


def client_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (it comes with uvicorn's standard extras), else None
    (asyncio's own). A cheaper loop leaves more of a small machine to the server and adds less of the
    client's own time to each round trip, which shows at concurrency 1 against a fast server."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def client_loop_name() -> str:
    return "uvloop" if client_loop_factory() is not None else "asyncio"


def run_client(main: Coroutine[Any, Any, T]) -> T:
    """Run a client coroutine to completion on the client event loop (see :func:`client_loop_factory`)."""
    with asyncio.Runner(loop_factory=client_loop_factory()) as runner:
        return runner.run(main)


@dataclass
class Samples:
    """Completion records of a load loop: end times (s), latencies (µs) and error times (s)."""

    ends: list[float] = field(default_factory=list)
    latencies_us: list[float] = field(default_factory=list)
    error_times: list[float] = field(default_factory=list)
    late_sends: int = 0

    def take(self) -> Samples:
        """Move the records out (the buffer is left empty)."""
        out = Samples(self.ends, self.latencies_us, self.error_times, self.late_sends)
        self.ends, self.latencies_us, self.error_times, self.late_sends = [], [], [], 0
        return out

    def extend(self, other: Samples) -> None:
        """Append another buffer's records."""
        self.ends.extend(other.ends)
        self.latencies_us.extend(other.latencies_us)
        self.error_times.extend(other.error_times)
        self.late_sends += other.late_sends


async def _send_one(conn: Connection, request: bytes, samples: Samples, start: float) -> None:
    """Send one request and record its outcome."""
    try:
        resp = await conn.send(request)
        ok = resp.status == 200
    except (OSError, asyncio.IncompleteReadError, ValueError):
        ok = False
    end = time.perf_counter()
    if ok:
        samples.ends.append(end)
        samples.latencies_us.append((end - start) * 1e6)
    else:
        samples.error_times.append(end)
        await asyncio.sleep(0.01)


async def closed_loop(
    host: str,
    port: int,
    pool: Sequence[bytes],
    concurrency: int,
    samples: Samples,
    stop: asyncio.Event,
    offset: int = 0,
) -> None:
    """``concurrency`` workers, each sending its next request as soon as the previous one returns."""

    async def worker(i: int) -> None:
        conn = Connection(host, port)
        k = offset + i
        try:
            while not stop.is_set():
                await _send_one(conn, pool[k % len(pool)], samples, time.perf_counter())
                k += concurrency
        finally:
            conn.close()

    await asyncio.gather(*(worker(i) for i in range(concurrency)))


async def open_loop(
    host: str,
    port: int,
    pool: Sequence[bytes],
    rate: float,
    samples: Samples,
    stop: asyncio.Event,
    *,
    poisson: bool = False,
    max_outstanding: int = 1024,
    seed: int = 0,
) -> None:
    """Send ``rate`` requests per second on a schedule (constant gaps, or Poisson arrivals).

    Each request uses an idle connection (opened on demand). When ``max_outstanding`` requests are
    already in flight, the scheduled request is counted in ``late_sends`` instead of being sent.
    """
    rng = random.Random(seed)
    idle: list[Connection] = []
    tasks: set[asyncio.Task[None]] = set()
    next_t = time.perf_counter()
    k = 0

    async def send(request: bytes) -> None:
        conn = idle.pop() if idle else Connection(host, port)
        await _send_one(conn, request, samples, time.perf_counter())
        idle.append(conn)

    while not stop.is_set():
        delay = next_t - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(tasks) >= max_outstanding:
            samples.late_sends += 1
        else:
            task = asyncio.ensure_future(send(pool[k % len(pool)]))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        k += 1
        next_t += rng.expovariate(rate) if poisson else 1.0 / rate
    if tasks:
        await asyncio.wait(tasks)
    for conn in idle:
        conn.close()


def split_level(total: float, parts: int) -> list[float]:
    """Share a concurrency or rate among client processes as evenly as possible (zeros dropped)."""
    if parts <= 1:
        return [total]
    if float(total).is_integer():
        base, extra = divmod(int(total), parts)
        shares = [float(base + (1 if i < extra else 0)) for i in range(parts)]
    else:
        shares = [total / parts] * parts
    return [s for s in shares if s > 0]


class LoadSource:
    """Runs a load loop in this process; ``collect`` hands out the records completed so far."""

    def __init__(self, host: str, port: int, pool: Sequence[bytes], mode: str, *, poisson: bool = False):
        self.host, self.port, self.pool, self.mode, self.poisson = host, port, pool, mode, poisson
        self._samples = Samples()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self, level: float) -> None:
        """Begin the loop at ``level`` (a concurrency or a rate)."""
        self._samples, self._stop = Samples(), asyncio.Event()
        if self.mode == "concurrency":
            coro = closed_loop(self.host, self.port, self.pool, int(level), self._samples, self._stop)
        else:
            coro = open_loop(
                self.host, self.port, self.pool, level, self._samples, self._stop, poisson=self.poisson
            )
        self._task = asyncio.ensure_future(coro)
        await asyncio.sleep(0)

    async def collect(self, until: float) -> Samples:
        """Records completed so far (all of them end before ``until`` once this returns)."""
        if self._task is not None and self._task.done():
            self._task.result()
        return self._samples.take()

    async def stop(self) -> None:
        """End the loop and wait for in-flight requests."""
        self._stop.set()
        if self._task is not None:
            await self._task
            self._task = None
