"""Benchmark results: one schema for both tools, written as JSON and CSV (pure, no network).

A ``Report`` holds the environment and one ``Run`` per configuration (a label such as
``"tritonserver"`` or ``"dynamic batching, 2 instances"``); a run holds one ``Point`` per load level
(a concurrency or a request rate). CSV files carry one row per point with fixed columns
(``CSV_COLUMNS``); JSON files carry everything, including the per-model server breakdown.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1

CSV_COLUMNS: tuple[str, ...] = (
    "label",
    "tool",
    "model",
    "concurrency",
    "request_rate",
    "infer_per_s",
    "requests_per_s",
    "latency_avg_us",
    "p50_us",
    "p90_us",
    "p95_us",
    "p99_us",
    "requests",
    "errors",
    "stable",
    "windows",
    "server_queue_us",
    "server_compute_input_us",
    "server_compute_infer_us",
    "server_compute_output_us",
    "avg_batch_size",
    "batch_sizes",
    "client_cores",
)


@dataclass
class Point:
    """The figures of one load level: client-side rates and latencies, and the server's breakdown."""

    concurrency: int | None
    request_rate: float | None
    infer_per_s: float
    requests_per_s: float
    latency_avg_us: float
    p50_us: float
    p90_us: float
    p95_us: float
    p99_us: float
    requests: int = 0
    errors: int = 0
    stable: bool = True
    windows: int = 0
    server: dict[str, dict[str, Any]] = field(default_factory=dict)
    client_cores: float | None = None
    # CPU milliseconds per request by role (``bench.cpu_split``) over the level's run, where measured
    cpu_ms: dict[str, float] | None = None

    @property
    def level(self) -> float:
        """The load level: the concurrency, or the request rate of an open-loop run."""
        return float(self.concurrency or self.request_rate or 0)

    def main_server(self, model: str) -> dict[str, Any]:
        """The server breakdown of ``model`` (or of the only model seen), empty if none."""
        if model in self.server:
            return self.server[model]
        return next(iter(self.server.values())) if len(self.server) == 1 else {}


@dataclass
class Run:
    """One configuration measured over several load levels by one tool."""

    label: str
    tool: str
    model: str
    url: str
    mode: str = "concurrency"
    options: dict[str, Any] = field(default_factory=dict)
    points: list[Point] = field(default_factory=list)

    def throughput_by_level(self) -> dict[float, float]:
        """Inferences per second at each load level (concurrency, or request rate in open-loop runs)."""
        return {p.level: p.infer_per_s for p in self.points}


@dataclass
class Report:
    """A benchmark's full output: where and when it ran, and its runs."""

    name: str
    environment: dict[str, Any] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, with NaN written as null."""
        return _clean({"schema_version": SCHEMA_VERSION, **asdict(self)})


def _clean(value: Any) -> Any:
    """Replace NaN/inf floats by None, recursively, so the JSON is strict."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _nan(value: Any) -> float:
    """A float from JSON, with null read back as NaN."""
    return math.nan if value is None else float(value)


def report_from_dict(data: dict[str, Any]) -> Report:
    """Read back a report written by ``Report.to_dict``."""
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"unsupported results schema_version {data.get('schema_version')!r}")
    runs = []
    for r in data.get("runs", []):
        points = []
        for p in r.get("points", []):
            floats = {k: _nan(p.get(k)) for k in ("infer_per_s", "requests_per_s", "latency_avg_us")}
            floats |= {k: _nan(p.get(k)) for k in ("p50_us", "p90_us", "p95_us", "p99_us")}
            keys = ("requests", "errors", "stable", "windows", "server", "client_cores", "cpu_ms")
            rest = {k: p[k] for k in keys if k in p}
            points.append(Point(p.get("concurrency"), p.get("request_rate"), **floats, **rest))  # type: ignore[arg-type]
        fields = {k: r[k] for k in ("label", "tool", "model", "url", "mode", "options") if k in r}
        runs.append(Run(**fields, points=points))
    return Report(data["name"], data.get("environment", {}), runs, data.get("notes", {}))


def write_json(report: Report, path: str | Path) -> Path:
    """Write ``report`` as indented JSON; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.to_dict(), indent=2, allow_nan=False) + "\n")
    return path


def read_json(path: str | Path) -> Report:
    """Read a report JSON file."""
    return report_from_dict(json.loads(Path(path).read_text()))


def csv_rows(runs: Iterable[Run]) -> list[dict[str, Any]]:
    """One flat row per point, with the columns of ``CSV_COLUMNS``."""
    rows = []
    for run in runs:
        for p in run.points:
            srv = p.main_server(run.model)
            sizes = srv.get("batch_sizes", {})
            rows.append(
                {
                    "label": run.label,
                    "tool": run.tool,
                    "model": run.model,
                    "concurrency": "" if p.concurrency is None else p.concurrency,
                    "request_rate": "" if p.request_rate is None else p.request_rate,
                    "infer_per_s": _fmt(p.infer_per_s),
                    "requests_per_s": _fmt(p.requests_per_s),
                    "latency_avg_us": _fmt(p.latency_avg_us),
                    "p50_us": _fmt(p.p50_us),
                    "p90_us": _fmt(p.p90_us),
                    "p95_us": _fmt(p.p95_us),
                    "p99_us": _fmt(p.p99_us),
                    "requests": p.requests,
                    "errors": p.errors,
                    "stable": int(p.stable),
                    "windows": p.windows,
                    "server_queue_us": _fmt(srv.get("queue_us")),
                    "server_compute_input_us": _fmt(srv.get("compute_input_us")),
                    "server_compute_infer_us": _fmt(srv.get("compute_infer_us")),
                    "server_compute_output_us": _fmt(srv.get("compute_output_us")),
                    "avg_batch_size": _fmt(srv.get("avg_batch_size")),
                    "batch_sizes": ";".join(f"{k}:{v}" for k, v in sizes.items()),
                    "client_cores": _fmt(p.client_cores),
                }
            )
    return rows


def _fmt(value: Any) -> str:
    """A number rounded for CSV, or empty for missing/NaN."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return f"{float(value):.2f}"


def write_csv(runs: Sequence[Run], path: str | Path) -> Path:
    """Write the points of ``runs`` as CSV; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(CSV_COLUMNS))
        writer.writeheader()
        writer.writerows(csv_rows(runs))
    return path
