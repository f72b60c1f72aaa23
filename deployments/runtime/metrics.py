"""Triton's metric names through Ray's metrics API.

They are exported by Ray next to Serve's own metrics (Prometheus and the Ray
dashboard; Ray prefixes exported names with ``ray_``), labelled by model and
version as Triton labels them.

Each Ray metric update costs about as much as a trivial model's whole request
(it crosses into Ray's core worker), so a replica sums its updates in plain
Python and hands the sums to Ray at most once per ``FLUSH_INTERVAL_S``: one
increment per counter and label set per second, whatever the request rate.
Like Triton's defaults, durations are cumulative counters (no histograms).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Protocol

logger = logging.getLogger(__name__)

TAG_KEYS = ("model", "version")
FLUSH_INTERVAL_S = 1.0

COUNTERS: dict[str, str] = {
    "nv_inference_request_success": "Successful inference requests",
    "nv_inference_request_failure": "Failed inference requests",
    "nv_inference_count": "Inferences performed (rows)",
    "nv_inference_exec_count": "Model executions (batches)",
    "nv_inference_request_duration_us": "Cumulative inference request duration (us)",
    "nv_inference_queue_duration_us": "Cumulative queue duration (us)",
    "nv_inference_compute_input_duration_us": "Cumulative compute input duration (us)",
    "nv_inference_compute_infer_duration_us": "Cumulative compute inference duration (us)",
    "nv_inference_compute_output_duration_us": "Cumulative compute output duration (us)",
}


class Counter(Protocol):
    def inc(self, value: float = ..., tags: dict[str, str] = ...) -> Any: ...


CounterFactory = Callable[[str, str, tuple[str, ...]], Counter]
Tags = tuple[tuple[str, str], ...]


def ray_counters() -> CounterFactory | None:
    """Ray's counter constructor, or None where Ray is not running (then metrics are off)."""
    try:
        import ray
        from ray.util import metrics
    except ImportError:
        return None
    if not ray.is_initialized():
        return None

    def make(name: str, description: str, tag_keys: tuple[str, ...]) -> Counter:
        return metrics.Counter(name, description, tag_keys)

    return make


class TritonMetrics:
    """Triton's counters of one replica, summed locally and flushed to Ray periodically.

    ``counters`` builds the exported counters (Ray's by default); without one,
    and where Ray is not running, every call is a no-op.
    """

    def __init__(
        self, counters: CounterFactory | None = None, flush_interval_s: float = FLUSH_INTERVAL_S
    ) -> None:
        factory = counters if counters is not None else ray_counters()
        self._counters: dict[str, Counter] = {}
        self._pending: defaultdict[tuple[str, Tags], float] = defaultdict(float)
        self._flush_interval_s = flush_interval_s
        self._flush_scheduled = False
        if factory is None:
            return
        try:
            self._counters = {name: factory(name, text, TAG_KEYS) for name, text in COUNTERS.items()}
        except Exception as exc:  # metrics must never stop a model from serving
            logger.warning("Triton metrics disabled: %s", exc)
            self._counters = {}

    @property
    def enabled(self) -> bool:
        return bool(self._counters)

    def batch(
        self,
        tags: Tags,
        rows: int,
        queue_ns: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
        n: int,
    ) -> None:
        """One model execution of ``n`` requests and ``rows`` rows (durations as Triton counts them)."""
        if not self._counters:
            return
        pending = self._pending
        pending["nv_inference_exec_count", tags] += 1
        pending["nv_inference_count", tags] += rows
        pending["nv_inference_queue_duration_us", tags] += queue_ns / 1000
        pending["nv_inference_compute_input_duration_us", tags] += input_ns * n / 1000
        pending["nv_inference_compute_infer_duration_us", tags] += infer_ns * n / 1000
        pending["nv_inference_compute_output_duration_us", tags] += output_ns * n / 1000
        self._schedule_flush()

    def request(self, tags: Tags, ok: bool, duration_ns: int) -> None:
        """One finished request."""
        if not self._counters:
            return
        pending = self._pending
        pending["nv_inference_request_success" if ok else "nv_inference_request_failure", tags] += 1
        pending["nv_inference_request_duration_us", tags] += duration_ns / 1000
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if self._flush_scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        self._flush_scheduled = True
        loop.call_later(self._flush_interval_s, self.flush)

    def flush(self) -> None:
        """Hand the sums gathered since the last flush to the exported counters."""
        self._flush_scheduled = False
        pending, self._pending = self._pending, defaultdict(float)
        for (name, tags), value in pending.items():
            if value > 0:  # Ray counters take positive increments only
                try:
                    self._counters[name].inc(value, dict(tags))
                except Exception as exc:  # a failed export must not fail requests
                    logger.debug("metric %s not exported: %s", name, exc)


def tags_for(model: str, version: Any) -> Tags:
    """The label set of one model version."""
    return (("model", model), ("version", str(version)))
