"""Triton's metric names through Ray's metrics API.

They are exported by Ray next to Serve's own metrics (Prometheus and the Ray
dashboard; Ray prefixes exported names with ``ray_``), labelled by model and
version as Triton labels them.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

_TAGS = ("model", "version")
_LATENCY_BOUNDARIES_US = [100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 1000000]


class TritonMetrics:
    """Counters and histograms of one replica. A no-op where Ray is not running."""

    def __init__(self) -> None:
        self._enabled = False
        try:
            import ray
            from ray.util import metrics

            if not ray.is_initialized():
                return
            c, h = metrics.Counter, metrics.Histogram
            self.request_success = c("nv_inference_request_success", "Successful inference requests", _TAGS)
            self.request_failure = c("nv_inference_request_failure", "Failed inference requests", _TAGS)
            self.inference_count = c("nv_inference_count", "Inferences performed (rows)", _TAGS)
            self.exec_count = c("nv_inference_exec_count", "Model executions (batches)", _TAGS)
            self.request_duration = c(
                "nv_inference_request_duration_us", "Cumulative inference request duration (us)", _TAGS
            )
            self.queue_duration = c("nv_inference_queue_duration_us", "Cumulative queue duration (us)", _TAGS)
            self.compute_input = c(
                "nv_inference_compute_input_duration_us", "Cumulative compute input duration (us)", _TAGS
            )
            self.compute_infer = c(
                "nv_inference_compute_infer_duration_us", "Cumulative compute inference duration (us)", _TAGS
            )
            self.compute_output = c(
                "nv_inference_compute_output_duration_us", "Cumulative compute output duration (us)", _TAGS
            )
            self.request_latency = h(
                "nv_inference_request_latency_us",
                "Request latency histogram (us)",
                boundaries=_LATENCY_BOUNDARIES_US,
                tag_keys=_TAGS,
            )
            self._enabled = True
        except Exception as exc:  # metrics must never stop a model from serving
            logger.warning("Triton metrics disabled: %s", exc)

    def batch(
        self,
        tags: dict[str, str],
        rows: int,
        queue_ns: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
        n: int,
    ) -> None:
        if not self._enabled:
            return
        self.exec_count.inc(1, tags)
        for counter, value in (
            (self.inference_count, rows),
            (self.queue_duration, queue_ns / 1000),
            (self.compute_input, input_ns * n / 1000),
            (self.compute_infer, infer_ns * n / 1000),
            (self.compute_output, output_ns * n / 1000),
        ):
            if value > 0:  # Ray counters take positive increments only
                counter.inc(value, tags)

    def request(self, tags: dict[str, str], ok: bool, duration_ns: int) -> None:
        if not self._enabled:
            return
        (self.request_success if ok else self.request_failure).inc(1, tags)
        if duration_ns > 0:
            self.request_duration.inc(duration_ns / 1000, tags)
        self.request_latency.observe(duration_ns / 1000, tags)

    @property
    def enabled(self) -> bool:
        return self._enabled


def tags_for(model: str, version: Any) -> dict[str, str]:
    return {"model": model, "version": str(version)}
