"""A load source spread over several client processes, for when one Python process cannot keep up.

Each worker runs the same load loop as ``LoadSource`` on its own event loop and ships its completion
records to the parent every ``flush_s`` seconds through a pipe, stamped with its clock. The parent waits
until every worker's stamp has passed the end of a window before it cuts that window.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection as Pipe

from bench.loadgen import Samples, closed_loop, open_loop, run_client, split_level

_FLUSH_S = 0.1


def _worker_main(
    pipe: Pipe,
    host: str,
    port: int,
    pool: Sequence[bytes],
    mode: str,
    level: float,
    poisson: bool,
    offset: int,
) -> None:
    """Entry point of a worker process: run the loop until the parent says stop."""
    run_client(_worker(pipe, host, port, pool, mode, level, poisson, offset))


async def _worker(
    pipe: Pipe,
    host: str,
    port: int,
    pool: Sequence[bytes],
    mode: str,
    level: float,
    poisson: bool,
    offset: int,
) -> None:
    samples, stop = Samples(), asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_message() -> None:
        pipe.recv()
        stop.set()

    loop.add_reader(pipe.fileno(), on_message)
    if mode == "concurrency":
        task = asyncio.ensure_future(closed_loop(host, port, pool, int(level), samples, stop, offset))
    else:
        task = asyncio.ensure_future(
            open_loop(host, port, pool, level, samples, stop, poisson=poisson, seed=offset)
        )
    pipe.send(("ready", time.perf_counter(), None))
    while not stop.is_set():
        await asyncio.sleep(_FLUSH_S)
        pipe.send(("data", time.perf_counter(), samples.take()))
    await task
    loop.remove_reader(pipe.fileno())
    pipe.send(("done", time.perf_counter(), samples.take()))


class MultiProcessSource:
    """``LoadSource``'s interface with the load split over ``processes`` worker processes."""

    def __init__(
        self, host: str, port: int, pool: Sequence[bytes], mode: str, processes: int, *, poisson: bool = False
    ) -> None:
        self.host, self.port, self.pool, self.mode = host, port, list(pool), mode
        self.processes, self.poisson = processes, poisson
        self._ctx = mp.get_context("spawn")
        self._procs: list[tuple[mp.process.BaseProcess, Pipe]] = []
        self._stamps: list[float] = []
        self._buffer = Samples()

    async def start(self, level: float) -> None:
        """Start one worker per share of ``level`` and wait until each is running."""
        self._procs, self._buffer = [], Samples()
        for i, share in enumerate(split_level(level, self.processes)):
            parent, child = self._ctx.Pipe()
            args = (child, self.host, self.port, self.pool, self.mode, share, self.poisson, i * 7919)
            proc = self._ctx.Process(target=_worker_main, args=args, daemon=True)
            proc.start()
            self._procs.append((proc, parent))
        self._stamps = [0.0] * len(self._procs)
        await self._wait_for(lambda: all(s > 0 for s in self._stamps), timeout=60.0)

    def _drain(self) -> None:
        """Read every pending message from the workers."""
        for i, (_, pipe) in enumerate(self._procs):
            while not pipe.closed and pipe.poll():
                try:
                    _kind, stamp, samples = pipe.recv()
                except (EOFError, OSError):
                    pipe.close()
                    break
                self._stamps[i] = stamp
                if samples is not None:
                    self._buffer.extend(samples)

    async def _wait_for(self, ready: object, timeout: float) -> None:
        deadline = time.perf_counter() + timeout
        while True:
            self._drain()
            if ready():  # type: ignore[operator]
                return
            if any(not p.is_alive() for p, _ in self._procs):
                raise RuntimeError("a client worker process exited unexpectedly")
            if time.perf_counter() > deadline:
                raise TimeoutError("client workers did not report in time")
            await asyncio.sleep(0.01)

    async def collect(self, until: float) -> Samples:
        """All records up to at least ``until`` from every worker."""
        await self._wait_for(lambda: all(s >= until for s in self._stamps), timeout=30.0)
        return self._buffer.take()

    async def stop(self) -> None:
        """Tell the workers to stop, read their last records and join them."""
        for _, pipe in self._procs:
            pipe.send("stop")
        deadline = time.perf_counter() + 60.0
        while any(p.is_alive() for p, _ in self._procs) and time.perf_counter() < deadline:
            self._drain()
            await asyncio.sleep(0.01)
        self._drain()
        for proc, _ in self._procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
        for _, pipe in self._procs:
            pipe.close()
        self._procs = []
