"""Measuring a model on a running server: windows until stable, one ``Point`` per load level.

``sweep`` is the tool's main entry: it reads the model's metadata and config, encodes a pool of
requests, and for each load level runs the load, cuts windows of ``window_s`` seconds, and stops when
the stability rule of ``bench.stats`` holds (or after ``max_windows``), taking server statistics at
every window edge.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from bench import server_stats
from bench.client import HttpError, get_json, split_url
from bench.inputs import parse_shape_options, request_pool, tensor_specs
from bench.loadgen import LoadSource, Samples, client_loop_name
from bench.results import Point, Run
from bench.stats import WindowStats, is_stable, summarize, window_from_samples
from bench.workers import MultiProcessSource


@dataclass
class MeasureOptions:
    """How to measure: window length, the stability rule, warm-up, and the request form."""

    window_s: float = 2.0
    tolerance: float = 0.10
    stable_windows: int = 3
    max_windows: int = 10
    warmup_s: float = 1.0
    batch_size: int = 1
    binary: bool = True
    shapes: Sequence[str] = ()
    version: str = ""
    processes: int = 1
    poisson: bool = False
    variants: int = 16
    outputs: Sequence[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Source(Protocol):
    """What the controller needs of a load source (in-process or multi-process)."""

    async def start(self, level: float) -> None: ...
    async def collect(self, until: float) -> Samples: ...
    async def stop(self) -> None: ...


class Progress:
    """One status line on stderr, rewritten in place when stderr is a terminal."""

    def __init__(self, label: str, enabled: bool = True) -> None:
        self.label, self.enabled = label, enabled
        self.tty = sys.stderr.isatty()

    def update(self, text: str, final: bool = False) -> None:
        """Show ``text`` after the label (a new line when final or not on a terminal)."""
        if not self.enabled:
            return
        line = f"[{self.label}] {text}"
        if self.tty and not final:
            sys.stderr.write("\r\x1b[2K" + line)
        else:
            sys.stderr.write(("\r\x1b[2K" if self.tty else "") + line + "\n")
        sys.stderr.flush()


class _Records:
    """All completion records of one load level, as arrays for window cutting."""

    def __init__(self) -> None:
        self.samples = Samples()

    def add(self, s: Samples) -> None:
        self.samples.extend(s)

    def window(self, t0: float, t1: float, rows: int) -> WindowStats:
        ends = np.asarray(self.samples.ends)
        lat = np.asarray(self.samples.latencies_us)
        errs = np.asarray(self.samples.error_times)
        n_err = int(((errs >= t0) & (errs < t1)).sum()) if errs.size else 0
        return window_from_samples(t0, t1, ends, lat, n_err, rows)


async def _snapshot(url: str, model: str) -> dict[str, server_stats.ModelCounters]:
    """Cumulative statistics of all models (empty when the server has no statistics endpoint)."""
    try:
        return server_stats.parse_snapshot(await get_json(url, "/v2/models/stats"))
    except (HttpError, OSError, ValueError, asyncio.TimeoutError):
        try:
            return server_stats.parse_snapshot(await get_json(url, f"/v2/models/{model}/stats"))
        except (HttpError, OSError, ValueError, asyncio.TimeoutError):
            return {}


async def measure_level(
    source: Source, url: str, model: str, level: float, opts: MeasureOptions, progress: Progress
) -> tuple[list[WindowStats], dict[str, server_stats.ServerBreakdown], float]:
    """Windows at one load level until stable: the windows, the server breakdown of the last ones,
    and the CPU cores this client process used meanwhile (in-process load only)."""
    records = _Records()
    await source.start(level)
    try:
        await asyncio.sleep(opts.warmup_s)
        records.add(await source.collect(time.perf_counter()))
        t0, snaps = time.perf_counter(), [await _snapshot(url, model)]
        cpu0, wall0 = time.process_time(), t0
        windows: list[WindowStats] = []
        while len(windows) < opts.max_windows:
            await asyncio.sleep(max(0.0, t0 + opts.window_s - time.perf_counter()))
            t1 = time.perf_counter()
            snaps.append(await _snapshot(url, model))
            records.add(await source.collect(t1))
            windows.append(records.window(t0, t1, opts.batch_size))
            w = windows[-1]
            progress.update(
                f"level {level:g}: window {len(windows)} {w.infer_per_s:,.0f} infer/s, {w.latency_avg_us:,.0f} us"
            )
            t0 = t1
            if is_stable(windows, opts.stable_windows, opts.tolerance):
                break
        client_cores = (time.process_time() - cpu0) / max(1e-9, time.perf_counter() - wall0)
    finally:
        await source.stop()
    n = min(opts.stable_windows, len(windows))
    return windows, server_stats.breakdowns(snaps[-n - 1], snaps[-1]), client_cores


def point_from(
    level: float,
    mode: str,
    windows: list[WindowStats],
    server: dict[str, server_stats.ServerBreakdown],
    opts: MeasureOptions,
) -> Point:
    """The reported point: the last ``stable_windows`` windows merged."""
    stable = is_stable(windows, opts.stable_windows, opts.tolerance)
    s = summarize(windows[-opts.stable_windows :])
    return Point(
        concurrency=int(level) if mode == "concurrency" else None,
        request_rate=float(level) if mode != "concurrency" else None,
        infer_per_s=s.infer_per_s,
        requests_per_s=s.requests_per_s,
        latency_avg_us=s.latency_avg_us,
        p50_us=s.percentiles_us[50],
        p90_us=s.percentiles_us[90],
        p95_us=s.percentiles_us[95],
        p99_us=s.percentiles_us[99],
        requests=s.requests,
        errors=s.errors,
        stable=stable,
        windows=len(windows),
        server={m: b.to_dict() for m, b in server.items()},
    )


async def build_pool(url: str, model: str, opts: MeasureOptions) -> list[bytes]:
    """Encoded infer requests for ``model`` from its metadata and config."""
    vpath = f"/versions/{opts.version}" if opts.version else ""
    metadata = await get_json(url, f"/v2/models/{model}{vpath}")
    config = await get_json(url, f"/v2/models/{model}{vpath}/config")
    specs = tensor_specs(
        metadata, int(config.get("max_batch_size", 0)), opts.batch_size, parse_shape_options(opts.shapes)
    )
    outputs = opts.outputs if opts.outputs is not None else [o["name"] for o in metadata.get("outputs", [])]
    host, port = split_url(url)
    return request_pool(
        f"{host}:{port}",
        model,
        specs,
        outputs,
        binary=opts.binary,
        version=opts.version,
        variants=opts.variants,
    )


async def sweep(
    url: str,
    model: str,
    levels: Sequence[float],
    mode: str = "concurrency",
    *,
    label: str = "",
    opts: MeasureOptions | None = None,
    show_progress: bool = True,
) -> Run:
    """Measure ``model`` at each load level (concurrencies, or request rates when ``mode`` is ``request_rate``)."""
    opts = opts or MeasureOptions()
    pool = await build_pool(url, model, opts)
    host, port = split_url(url)
    source: Source
    if opts.processes > 1:
        source = MultiProcessSource(host, port, pool, mode, opts.processes, poisson=opts.poisson)
    else:
        source = LoadSource(host, port, pool, mode, poisson=opts.poisson)
    run = Run(label or model, "bench", model, url, mode, _options_dict(opts))
    progress = Progress(run.label, show_progress)
    for level in levels:
        windows, server, cores = await measure_level(source, url, model, level, opts, progress)
        point = point_from(level, mode, windows, server, opts)
        point.client_cores = cores if opts.processes <= 1 else None
        run.points.append(point)
        flag = "" if point.stable else " (unstable)"
        progress.update(
            f"level {level:g}: {point.infer_per_s:,.0f} infer/s, p50 {point.p50_us:,.0f} us, "
            f"p99 {point.p99_us:,.0f} us{flag}",
            final=True,
        )
    return run


def _options_dict(opts: MeasureOptions) -> dict[str, Any]:
    """The options worth recording next to the results."""
    keys = (
        "window_s",
        "tolerance",
        "stable_windows",
        "max_windows",
        "warmup_s",
        "batch_size",
        "binary",
        "processes",
        "poisson",
    )
    return {k: getattr(opts, k) for k in keys} | {
        "shapes": list(opts.shapes),
        "client_loop": client_loop_name(),
    }
