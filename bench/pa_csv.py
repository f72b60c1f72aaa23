"""perf_analyzer's CSV output (``-f file.csv``) read into this tool's result schema (pure).

perf_analyzer writes one row per load level; times are in microseconds. With ``--verbose-csv`` it adds
``Avg latency``. Columns are matched by name, so extra columns (cache hits, ...) are ignored.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from bench.results import Point

_SERVER_COLUMNS = {
    "Server Queue": "queue_us",
    "Server Compute Input": "compute_input_us",
    "Server Compute Infer": "compute_infer_us",
    "Server Compute Output": "compute_output_us",
}


class PerfAnalyzerCsvError(ValueError):
    """A perf_analyzer CSV file lacks the columns this reader needs."""


def _float(row: dict[str, str], column: str) -> float:
    """A numeric cell, NaN when missing or empty."""
    value = (row.get(column) or "").strip()
    return float(value) if value else math.nan


def parse_perf_analyzer_csv(text: str, model: str, batch_size: int = 1) -> list[Point]:
    """The points of a perf_analyzer CSV; ``batch_size`` is its ``-b`` (rows per request)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return []
    reader = csv.DictReader(io.StringIO("\n".join(lines)))
    columns = set(reader.fieldnames or [])
    if "Inferences/Second" not in columns or not columns & {"Concurrency", "Request Rate"}:
        raise PerfAnalyzerCsvError(
            f"not a perf_analyzer CSV: needs 'Inferences/Second' and 'Concurrency' or 'Request Rate', got {sorted(columns)}"
        )
    points = []
    for row in reader:
        points.append(_point(row, model, batch_size))
    return points


def _point(row: dict[str, str], model: str, batch_size: int) -> Point:
    """One CSV row as a point, with the server's phases under ``server[model]``."""
    infer = _float(row, "Inferences/Second")
    server: dict[str, Any] = {key: _float(row, col) for col, key in _SERVER_COLUMNS.items() if col in row}
    concurrency = row.get("Concurrency")
    rate = row.get("Request Rate")
    return Point(
        concurrency=int(float(concurrency)) if concurrency else None,
        request_rate=float(rate) if rate else None,
        infer_per_s=infer,
        requests_per_s=infer / batch_size,
        latency_avg_us=_float(row, "Avg latency"),
        p50_us=_float(row, "p50 latency"),
        p90_us=_float(row, "p90 latency"),
        p95_us=_float(row, "p95 latency"),
        p99_us=_float(row, "p99 latency"),
        server={model: server} if server else {},
    )


def read_perf_analyzer_csv(path: str | Path, model: str, batch_size: int = 1) -> list[Point]:
    """``parse_perf_analyzer_csv`` on a file (an absent file gives no points)."""
    path = Path(path)
    if not path.exists():
        return []
    return parse_perf_analyzer_csv(path.read_text(), model, batch_size)
