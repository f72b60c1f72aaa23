"""Driving the real ``perf_analyzer`` and reading its results into this tool's schema.

Each load level is its own perf_analyzer invocation, so a level that never stabilises does not end
the sweep: it is measured again with the stability check relaxed and reported as unstable. Server
statistics are snapshotted around each invocation, which gives the batch sizes the server formed,
and so is every process's CPU time (``bench.cpu_split``), which gives the CPU per request by role.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from bench import cpu_split, peers, server_stats
from bench.pa_csv import read_perf_analyzer_csv
from bench.results import Point, Run


def _snapshot(url: str) -> dict[str, server_stats.ModelCounters]:
    """Cumulative statistics of all models, empty if the server has none."""
    try:
        with urllib.request.urlopen(f"http://{url}/v2/models/stats", timeout=10) as resp:
            return server_stats.parse_snapshot(json.loads(resp.read()))
    except (OSError, ValueError):
        return {}


def _children_cpu() -> float:
    """CPU seconds used so far by finished child processes (perf_analyzer runs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run_once(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run perf_analyzer, returning its output even when it fails or runs past ``timeout`` (killed)."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:

        def text(value: bytes | str | None) -> str:
            return value.decode(errors="replace") if isinstance(value, bytes) else value or ""

        output = text(expired.stdout) + f"\nperf_analyzer killed after {timeout:.0f}s\n"
        return subprocess.CompletedProcess(cmd, -9, output, text(expired.stderr))


def run_level(
    url: str,
    model: str,
    level: float,
    mode: str,
    *,
    batch_size: int = 1,
    shapes: Sequence[str] = (),
    measurement_interval_ms: int = 2000,
    stability: int = 10,
    max_trials: int = 10,
    timeout: float | None = None,
    extra: Sequence[str] = (),
    protocol: str = "http",
) -> Point | None:
    """One load level measured by perf_analyzer (None if it produced no result at all)."""
    if timeout is None:  # every trial's window, plus start-up: a hung run must not eat the scenario
        timeout = 30.0 + 3 * max_trials * measurement_interval_ms / 1000
    conc = [int(level)] if mode == "concurrency" else None
    rate = [level] if mode != "concurrency" else None
    with tempfile.TemporaryDirectory() as tmp:
        csv_path = Path(tmp) / "pa.csv"

        def cmd(stability_percentage: int) -> list[str]:
            return peers.perf_analyzer_cmd(
                model,
                url,
                conc,
                request_rate=rate,
                csv_path=csv_path,
                stability_percentage=stability_percentage,
                measurement_interval_ms=measurement_interval_ms,
                shapes=shapes,
                batch_size=batch_size,
                max_trials=max_trials,
                extra=extra,
                protocol=protocol,
            )

        before = _snapshot(url) if protocol == "http" else {}  # statistics are read over HTTP
        machine0 = cpu_split.take_snapshot()
        cpu0, wall0 = _children_cpu(), time.perf_counter()
        proc = _run_once(cmd(stability), timeout)
        points = read_perf_analyzer_csv(csv_path, model, batch_size)
        stable = bool(points)
        if not points:
            proc = _run_once(cmd(1000), timeout)
            points = read_perf_analyzer_csv(csv_path, model, batch_size)
        cores = (_children_cpu() - cpu0) / max(1e-9, time.perf_counter() - wall0)
        machine1 = cpu_split.take_snapshot()
        after = _snapshot(url) if protocol == "http" else {}
    if not points:
        print(f"perf_analyzer failed at {level:g}: {(proc.stdout + proc.stderr)[-800:]}", file=sys.stderr)
        return None
    point = points[-1]
    point.stable = stable
    point.client_cores = cores
    # every trial of the run held the same load, so its average cores over the measured rate give the
    # CPU per request of each role; perf_analyzer has ended, so the client's share is read apart
    by_role = cpu_split.cores_by_role(machine0, machine1, client_pids=())
    by_role[cpu_split.CLIENT] = cores
    point.cpu_ms = cpu_split.per_request_ms(by_role, point.infer_per_s / max(batch_size, 1))
    for name, b in server_stats.breakdowns(before, after).items():
        entry = point.server.setdefault(name, {})
        entry["batch_sizes"] = {str(k): v for k, v in b.batch_sizes.items()}
        entry["avg_batch_size"] = b.avg_batch_size
    return point


def run_perf_analyzer(
    url: str,
    model: str,
    levels: Sequence[float],
    mode: str = "concurrency",
    *,
    label: str = "",
    batch_size: int = 1,
    shapes: Sequence[str] = (),
    measurement_interval_ms: int = 2000,
    stability: int = 10,
    max_trials: int = 10,
    extra: Sequence[str] = (),
    show_progress: bool = True,
    protocol: str = "http",
) -> Run:
    """A sweep of ``levels`` with perf_analyzer; installs it first if needed."""
    if not peers.perf_analyzer_path().exists():
        peers.install_perf_analyzer()
    options = {
        "batch_size": batch_size,
        "shapes": list(shapes),
        "stability": stability,
        "measurement_interval_ms": measurement_interval_ms,
        "max_trials": max_trials,
        "protocol": protocol,
        "extra": list(extra),
    }
    run = Run(label or f"{model} (perf_analyzer)", "perf_analyzer", model, url, mode, options)
    for level in levels:
        point = run_level(
            url,
            model,
            level,
            mode,
            batch_size=batch_size,
            shapes=shapes,
            measurement_interval_ms=measurement_interval_ms,
            stability=stability,
            max_trials=max_trials,
            extra=extra,
            protocol=protocol,
        )
        if point is None:
            continue
        run.points.append(point)
        if show_progress:
            flag = "" if point.stable else " (unstable)"
            print(
                f"[{run.label}] level {level:g}: {point.infer_per_s:,.0f} infer/s, "
                f"p50 {point.p50_us:,.0f} us, p99 {point.p99_us:,.0f} us{flag}",
                file=sys.stderr,
            )
    return run
