"""Inference statistics in the form of Triton's statistics extension.

``/v2/models/<m>/stats`` returns, per model version: inference_count (rows),
execution_count (batches), success/fail/queue/compute_input/compute_infer/
compute_output as {count, ns}, and batch_stats per executed batch size.
Snapshots from several replicas add up with :func:`merge_snapshots`.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

DURATION_KEYS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)
BATCH_KEYS = ("compute_input", "compute_infer", "compute_output")
# Triton's latency summaries (``--metrics-config summary_latencies=true``): the duration each observes
SUMMARY_KEYS = tuple(key for key in DURATION_KEYS if key != "fail")  # a failed request has no latency
SUMMARY_WINDOW_S = 60.0  # the sliding window the quantiles cover (a Prometheus summary's default max age)
SUMMARY_CAPACITY = 8192  # durations one replica keeps per series and version (the most recent)
SUMMARY_SAMPLES = 1024  # of which a snapshot carries at most this many, evenly spread

_summaries = False


def keep_latency_windows(on: bool) -> None:
    """Whether the model versions this process loads from now on keep their recent durations
    (:class:`LatencyWindow`, for the latency summaries of ``/metrics``)."""
    global _summaries
    _summaries = on


class LatencyWindow:
    """The durations (µs) one model version observed in the last :data:`SUMMARY_WINDOW_S`, by
    :data:`SUMMARY_KEYS` series: what the summaries' quantiles are computed from, over every replica."""

    def __init__(self, window_s: float = SUMMARY_WINDOW_S, capacity: int = SUMMARY_CAPACITY) -> None:
        self.window_s = window_s
        self._series: dict[str, deque[tuple[float, float]]] = {
            key: deque(maxlen=capacity) for key in SUMMARY_KEYS
        }

    def observe(self, key: str, ns: int, times: int = 1) -> None:
        now = time.monotonic()
        series = self._series[key]
        for _ in range(times):
            series.append((now, ns / 1000))

    def samples(self, now: float | None = None, limit: int = SUMMARY_SAMPLES) -> dict[str, list[float]]:
        """Each series' durations still in the window (at most ``limit``, evenly spread), none empty."""
        cutoff = (time.monotonic() if now is None else now) - self.window_s
        out: dict[str, list[float]] = {}
        for key, series in self._series.items():
            while series and series[0][0] < cutoff:
                series.popleft()
            if series:
                values = [value for _, value in series]
                step = len(values) / limit
                out[key] = values if step <= 1 else [values[int(i * step)] for i in range(limit)]
        return out


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class ModelStats:
    """Cumulative statistics of one model version in one replica."""

    name: str
    version: str
    last_inference_ms: int = 0
    inference_count: int = 0
    execution_count: int = 0
    durations: dict[str, Duration] = field(default_factory=lambda: {k: Duration() for k in DURATION_KEYS})
    batches: dict[int, dict[str, Duration]] = field(default_factory=dict)
    window: LatencyWindow | None = field(default_factory=lambda: LatencyWindow() if _summaries else None)

    def record_batch(
        self,
        rows: int,
        requests: int,
        queue_ns: list[int],
        input_ns: int,
        infer_ns: int,
        output_ns: int,
        inferences: int | None = None,
    ) -> None:
        """One executed batch of ``rows`` (its batch-size statistics): every request of it is charged
        the batch's compute time; ``inferences`` (default ``rows``) counts the real ones, without a
        sequence batch's padding, as Triton's inference count does."""
        d = self.durations
        self.execution_count += 1
        self.inference_count += rows if inferences is None else inferences
        for q in queue_ns:
            d["queue"].add(q)
        d["compute_input"].add(input_ns * requests, requests)
        d["compute_infer"].add(infer_ns * requests, requests)
        d["compute_output"].add(output_ns * requests, requests)
        window = self.window
        if window is not None:
            for q in queue_ns:
                window.observe("queue", q)
            window.observe("compute_input", input_ns, requests)
            window.observe("compute_infer", infer_ns, requests)
            window.observe("compute_output", output_ns, requests)
        b = self.batches.get(rows)
        if b is None:
            b = self.batches[rows] = {k: Duration() for k in BATCH_KEYS}
        b["compute_input"].add(input_ns)
        b["compute_infer"].add(infer_ns)
        b["compute_output"].add(output_ns)
        self.last_inference_ms = int(time.time() * 1000)

    def record_request(self, ok: bool, duration_ns: int) -> None:
        self.durations["success" if ok else "fail"].add(duration_ns)
        if ok and self.window is not None:
            self.window.observe("success", duration_ns)

    def record_cache(self, hit: bool, duration_ns: int) -> None:
        """A response-cache lookup: a hit (looked up and read) or a miss (looked up, then inserted)."""
        key = "cache_hit" if hit else "cache_miss"
        self.durations[key].add(duration_ns)
        if self.window is not None:
            self.window.observe(key, duration_ns)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {k: v.to_json() for k, v in self.durations.items()},
            "response_stats": {},
            "batch_stats": [
                {"batch_size": size, **{k: v.to_json() for k, v in ds.items()}}
                for size, ds in sorted(self.batches.items())
            ],
            "memory_usage": [],
        }


def _add_duration(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {"count": a.get("count", 0) + b.get("count", 0), "ns": a.get("ns", 0) + b.get("ns", 0)}


def merge_model_stats(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Sum two JSON snapshots of the same model version (from two replicas)."""
    out = dict(a)
    out["last_inference"] = max(a.get("last_inference", 0), b.get("last_inference", 0))
    out["inference_count"] = a.get("inference_count", 0) + b.get("inference_count", 0)
    out["execution_count"] = a.get("execution_count", 0) + b.get("execution_count", 0)
    ia, ib = a.get("inference_stats", {}), b.get("inference_stats", {})
    out["inference_stats"] = {k: _add_duration(ia.get(k, {}), ib.get(k, {})) for k in DURATION_KEYS}
    batches: dict[int, dict[str, Any]] = {}
    for entry in [*a.get("batch_stats", []), *b.get("batch_stats", [])]:
        size = entry["batch_size"]
        cur = batches.setdefault(size, {"batch_size": size})
        for k in BATCH_KEYS:
            cur[k] = _add_duration(cur.get(k, {}), entry.get(k, {}))
    out["batch_stats"] = [batches[s] for s in sorted(batches)]
    return out


def merge_snapshots(snapshots: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Sum per-version statistics from several replicas of one model."""
    by_version: dict[str, dict[str, Any]] = {}
    for snapshot in snapshots:
        for entry in snapshot:
            v = entry["version"]
            by_version[v] = merge_model_stats(by_version[v], entry) if v in by_version else entry
    return [by_version[v] for v in sorted(by_version, key=lambda x: int(x) if x.isdigit() else x)]


@dataclass
class PushGate:
    """When a replica's periodic report is worth sending: when it differs from the last one sent, or
    ``heartbeat_s`` after it (the receiver counts a silent replica as gone after a few heartbeats)."""

    heartbeat_s: float
    _sent: Any = None
    _sent_at: float | None = None

    def due(self, report: Any, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return self._sent_at is None or report != self._sent or now - self._sent_at >= self.heartbeat_s

    def sent(self, report: Any, now: float | None = None) -> None:
        self._sent, self._sent_at = report, time.monotonic() if now is None else now
