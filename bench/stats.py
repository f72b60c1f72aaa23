"""Latency and throughput statistics of measurement windows, and the stability rule (pure, no I/O).

A *window* is a span of wall-clock time in which completed requests are counted. A load level is
measured by repeating windows until the last ``count`` of them agree: each window's throughput and
average latency lie within ``tolerance`` (a fraction, 0.10 = 10 %) of the mean over those windows.
This follows perf_analyzer's ``--stability-percentage`` rule. The reported figures then merge the
stable windows: total requests over total time, and percentiles over all their latencies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float:
    """The ``q``-th percentile (0..100) by the nearest-rank rule; NaN for no values.

    Nearest rank (the smallest value with at least ``q`` % of values at or below it) is what
    perf_analyzer reports, so the two tools agree on the same samples.
    """
    arr = np.sort(np.asarray(values, dtype=np.float64))
    if arr.size == 0:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    rank = max(1, math.ceil(q / 100.0 * arr.size))
    return float(arr[rank - 1])


@dataclass(frozen=True)
class WindowStats:
    """What one measurement window saw: requests completed, errors, and their latencies (µs)."""

    start_s: float
    end_s: float
    latencies_us: np.ndarray = field(repr=False)
    errors: int = 0
    rows_per_request: int = 1

    @property
    def duration_s(self) -> float:
        """Length of the window in seconds."""
        return self.end_s - self.start_s

    @property
    def count(self) -> int:
        """Requests that completed successfully in the window."""
        return int(self.latencies_us.size)

    @property
    def requests_per_s(self) -> float:
        """Successful requests per second."""
        return self.count / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def infer_per_s(self) -> float:
        """Inferences (rows) per second: requests per second times rows per request."""
        return self.requests_per_s * self.rows_per_request

    @property
    def latency_avg_us(self) -> float:
        """Mean latency in microseconds (NaN when nothing completed)."""
        return float(self.latencies_us.mean()) if self.count else math.nan


def window_from_samples(
    start_s: float,
    end_s: float,
    end_times_s: np.ndarray,
    latencies_us: np.ndarray,
    errors: int = 0,
    rows_per_request: int = 1,
) -> WindowStats:
    """The window ``[start_s, end_s)`` built from completion records (end time, latency) of a run."""
    mask = (end_times_s >= start_s) & (end_times_s < end_s)
    return WindowStats(start_s, end_s, np.asarray(latencies_us)[mask], errors, rows_per_request)


def is_stable(windows: Sequence[WindowStats], count: int = 3, tolerance: float = 0.10) -> bool:
    """Whether the last ``count`` windows agree within ``tolerance`` on throughput and mean latency."""
    if len(windows) < count:
        return False
    last = windows[-count:]
    if any(w.count == 0 for w in last):
        return False
    return _within([w.requests_per_s for w in last], tolerance) and _within(
        [w.latency_avg_us for w in last], tolerance
    )


def _within(values: Sequence[float], tolerance: float) -> bool:
    """Every value lies within ``tolerance`` (relative) of the mean of ``values``."""
    mean = sum(values) / len(values)
    if mean <= 0:
        return False
    return all(abs(v - mean) <= tolerance * mean for v in values)


@dataclass(frozen=True)
class Summary:
    """The merged figures of the windows a load level is reported from."""

    requests: int
    errors: int
    duration_s: float
    requests_per_s: float
    infer_per_s: float
    latency_avg_us: float
    latency_std_us: float
    percentiles_us: dict[int, float]


def summarize(windows: Sequence[WindowStats]) -> Summary:
    """Merge windows: rates over their total time, latency statistics over all their samples."""
    if not windows:
        raise ValueError("no measurement windows to summarize")
    lat = np.concatenate([w.latencies_us for w in windows]) if windows else np.empty(0)
    duration = sum(w.duration_s for w in windows)
    rows = windows[-1].rows_per_request
    rps = lat.size / duration if duration > 0 else 0.0
    return Summary(
        requests=int(lat.size),
        errors=sum(w.errors for w in windows),
        duration_s=duration,
        requests_per_s=rps,
        infer_per_s=rps * rows,
        latency_avg_us=float(lat.mean()) if lat.size else math.nan,
        latency_std_us=float(lat.std()) if lat.size else math.nan,
        percentiles_us={q: percentile(lat, q) for q in PERCENTILES},
    )
