"""Triton's metrics exported through Ray's metrics API, for the replicas of a Ray Serve application.

The runtime sums its counters without knowing Ray (``deployments.runtime.metrics``); a
model replica calls :func:`export_to_ray` as it starts, so that the counters of every model
its process runs (an ensemble's hosted models included) go to Ray.

Gauges and the custom metric families of ``pb_utils.MetricFamily`` are read, not summed: each
replica runs :func:`export_gauges`, which sets them in Ray every ``GAUGE_INTERVAL_S``
(:class:`RayGauges`): ``nv_inference_pending_request_count`` per model and version, each custom
gauge as a Ray gauge and each custom counter as a Ray counter (raised by what it grew since the
last export). Ray has no way to take a histogram's bucket counts as they are, so custom histograms
stay on Triton's ``/metrics`` only. Ray's export prefixes every name with ``ray_``; each replica's
process reports its own series (Ray labels them by worker), as for the counters.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from deployments import custom_metrics
from deployments.runtime import metrics

logger = logging.getLogger("ray.serve")

GAUGE_INTERVAL_S = 2.0


def _ray_metrics() -> Any:
    """``ray.util.metrics``, or None where Ray is not running (then nothing is exported)."""
    try:
        import ray
        from ray.util import metrics as ray_metrics
    except ImportError:
        return None
    return ray_metrics if ray.is_initialized() else None


def ray_counters() -> metrics.CounterFactory | None:
    """Ray's counter constructor, or None where Ray is not running (then metrics are off)."""
    ray_metrics = _ray_metrics()
    if ray_metrics is None:
        return None

    def make(name: str, description: str, tag_keys: tuple[str, ...]) -> metrics.Counter:
        return ray_metrics.Counter(name, description, tag_keys)

    return make


def export_to_ray() -> None:
    """Make the ``TritonMetrics`` this process builds from now on export through Ray."""
    metrics.use_counters(ray_counters)


class Gauge(Protocol):
    def set(self, value: float, tags: dict[str, str] = ...) -> Any: ...


GaugeFactory = Callable[[str, str, tuple[str, ...]], Gauge]
Pending = Mapping[tuple[str, str], int]
"""Pending requests now by (model, version)."""


def ray_gauges() -> GaugeFactory | None:
    """Ray's gauge constructor, or None where Ray is not running."""
    ray_metrics = _ray_metrics()
    if ray_metrics is None:
        return None

    def make(name: str, description: str, tag_keys: tuple[str, ...]) -> Gauge:
        return ray_metrics.Gauge(name, description, tag_keys)

    return make


class RayGauges:
    """One process's gauges and custom metric families, handed to Ray's metrics on each
    :meth:`export`. A family keeps the label names it was first exported with (Ray fixes them when a
    metric is made); a metric of the family with other label names is not exported."""

    def __init__(self, gauges: GaugeFactory, counters: metrics.CounterFactory) -> None:
        self._make_gauge = gauges
        self._make_counter = counters
        self._metrics: dict[str, tuple[Any, tuple[str, ...]]] = {}  # name -> (Ray metric, its tag keys)
        self._counted: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}  # counter values sent
        self._skipped: set[str] = set()

    def export(self, pending: Pending, custom: list[dict[str, Any]]) -> None:
        if pending:
            gauge = self._metric(metrics.PENDING, metrics.PENDING_HELP, metrics.TAG_KEYS, self._make_gauge)
            for (model, version), count in pending.items():
                self._set(gauge, metrics.PENDING, {"model": model, "version": version}, float(count))
        for family in custom:
            kind = family.get("kind")
            if kind not in (custom_metrics.GAUGE, custom_metrics.COUNTER) or not family.get("metrics"):
                continue
            name, keys = family["name"], tuple(sorted(family["metrics"][0]["labels"]))
            make = self._make_gauge if kind == custom_metrics.GAUGE else self._make_counter
            held = self._metric(name, family.get("description") or name, keys, make)
            for entry in family["metrics"]:
                labels = {str(k): str(v) for k, v in entry["labels"].items()}
                if held is None or tuple(sorted(labels)) != held[1]:
                    self._skip(name, "its metrics have other label names than its first")
                    continue
                value = float(entry["value"])
                if kind == custom_metrics.GAUGE:
                    self._set(held, name, labels, value)
                else:
                    self._count(held, name, labels, value)

    def _metric(
        self, name: str, description: str, keys: tuple[str, ...], make: Callable[..., Any]
    ) -> tuple[Any, tuple[str, ...]] | None:
        if name not in self._metrics:
            try:
                self._metrics[name] = (make(name, description, keys), keys)
            except Exception as exc:  # a name Ray refuses: that family is not exported
                self._skip(name, str(exc))
                return None
        return self._metrics[name]

    def _set(
        self, held: tuple[Any, tuple[str, ...]] | None, name: str, labels: dict[str, str], value: float
    ) -> None:
        if held is None:
            return
        try:
            held[0].set(value, tags=labels)
        except Exception as exc:
            self._skip(name, str(exc))

    def _count(
        self, held: tuple[Any, tuple[str, ...]], name: str, labels: dict[str, str], value: float
    ) -> None:
        key = (name, tuple(sorted(labels.items())))
        grown = value - self._counted.get(key, 0.0)
        if grown <= 0:  # unchanged (or a metric made again from zero: it counts on from its new value)
            self._counted[key] = min(value, self._counted.get(key, value))
            return
        try:
            held[0].inc(grown, tags=labels)
            self._counted[key] = value
        except Exception as exc:
            self._skip(name, str(exc))

    def _skip(self, name: str, why: str) -> None:
        if name not in self._skipped:
            self._skipped.add(name)
            logger.warning("metric '%s' is not exported to Ray: %s", name, why)


async def export_gauges(pending: Callable[[], Pending], interval_s: float = GAUGE_INTERVAL_S) -> None:
    """A replica's loop: its gauges and this process's custom families into Ray, every ``interval_s``
    (returns at once where Ray is not running)."""
    gauges, counters = ray_gauges(), ray_counters()
    if gauges is None or counters is None:
        return
    exporter = RayGauges(gauges, counters)
    while True:
        await asyncio.sleep(interval_s)
        try:
            exporter.export(pending(), custom_metrics.snapshot())
        except Exception as exc:  # metrics must never stop a model from serving
            logger.debug("gauges not exported to Ray: %s", exc)
