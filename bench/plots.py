"""PNG plots of benchmark results: throughput and latency percentiles against the load level.

One line per run (configuration and tool), drawn with matplotlib's non-interactive backend.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench.results import Point, Run  # noqa: E402

_PERCENTILES = (("p50_us", "p50", "-"), ("p90_us", "p90", "--"), ("p99_us", "p99", ":"))


def _x(run: Run, p: Point) -> float:
    """The load level of a point: its concurrency, or its request rate."""
    return float(
        p.concurrency if run.mode == "concurrency" and p.concurrency is not None else p.request_rate or 0
    )


def _xlabel(runs: Sequence[Run]) -> str:
    return "concurrency" if all(r.mode == "concurrency" for r in runs) else "request rate (req/s)"


def _name(run: Run) -> str:
    return run.label if run.tool in run.label else f"{run.label} [{run.tool}]"


def plot_throughput(runs: Sequence[Run], path: str | Path, title: str = "") -> Path:
    """Throughput (infer/s) against load, one line per run; returns the PNG path."""
    fig, ax = plt.subplots(figsize=(8, 5))
    for run in runs:
        pts = sorted(run.points, key=lambda p: _x(run, p))
        ax.plot([_x(run, p) for p in pts], [p.infer_per_s for p in pts], marker="o", label=_name(run))
    ax.set_xlabel(_xlabel(runs))
    ax.set_ylabel("throughput (infer/s)")
    ax.set_ylim(bottom=0)
    return _finish(fig, ax, path, title or "Throughput")


def plot_latency(runs: Sequence[Run], path: str | Path, title: str = "") -> Path:
    """Latency percentiles (p50 solid, p90 dashed, p99 dotted; ms) against load; returns the PNG path."""
    fig, ax = plt.subplots(figsize=(8, 5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, run in enumerate(runs):
        pts = sorted(run.points, key=lambda p: _x(run, p))
        for key, name, style in _PERCENTILES:
            ys = [getattr(p, key) / 1000.0 for p in pts]
            if all(math.isnan(y) for y in ys):
                continue
            ax.plot(
                [_x(run, p) for p in pts],
                ys,
                linestyle=style,
                marker=".",
                color=colors[i % len(colors)],
                label=f"{_name(run)} {name}",
            )
    ax.set_xlabel(_xlabel(runs))
    ax.set_ylabel("latency (ms)")
    ax.set_ylim(bottom=0)
    return _finish(fig, ax, path, title or "Latency percentiles")


def _finish(fig: plt.Figure, ax: plt.Axes, path: str | Path, title: str) -> Path:
    """Title, grid, legend, save, close."""
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_report(runs: Sequence[Run], out_dir: str | Path, title: str = "") -> list[Path]:
    """Both plots into ``out_dir`` (``throughput.png``, ``latency.png``)."""
    out = Path(out_dir)
    prefix = f"{title}: " if title else ""
    return [
        plot_throughput(runs, out / "throughput.png", prefix + "throughput"),
        plot_latency(runs, out / "latency.png", prefix + "latency percentiles"),
    ]
