"""``pb_utils.MetricFamily`` and ``pb_utils.Metric``: the custom metrics a model defines.

They are handles on the process's :mod:`deployments.custom_metrics` registry,
which the replica exports next to Triton's own metrics. A family or metric is
released with the last model object that holds it.
"""

from __future__ import annotations

import weakref
from enum import IntEnum

from deployments import custom_metrics
from deployments.backends.python_api.errors import TritonModelException


class _MetricKind(IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


_KIND_NAMES = {
    _MetricKind.COUNTER: custom_metrics.COUNTER,
    _MetricKind.GAUGE: custom_metrics.GAUGE,
    _MetricKind.HISTOGRAM: custom_metrics.HISTOGRAM,
}


class MetricFamily:
    """``pb_utils.MetricFamily``: a named counter, gauge or histogram family of this process.

    ``buckets`` here is a default for the family's histograms; Triton's own
    form gives them per metric (``family.Metric(labels, buckets)``).
    """

    MetricKind = _MetricKind
    COUNTER = _MetricKind.COUNTER
    GAUGE = _MetricKind.GAUGE
    HISTOGRAM = _MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: int, buckets: list[float] | None = None) -> None:
        try:
            kind_name = _KIND_NAMES[_MetricKind(int(kind))]
            self._state = custom_metrics.REGISTRY.family(str(name), str(description), kind_name)
        except ValueError as error:
            raise TritonModelException(str(error)) from None
        self._buckets = buckets
        weakref.finalize(self, custom_metrics.REGISTRY.release_family, self._state)

    def Metric(  # noqa: N802 - Triton's method name
        self, labels: dict[str, str] | None = None, buckets: list[float] | None = None
    ) -> Metric:
        """The metric of this family with ``labels`` (histograms: with ``buckets``)."""
        return Metric(self, labels, buckets if buckets is not None else self._buckets)


_FAMILY_DELETED = (
    "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The 'MetricFamily' "
    "object should be deleted AFTER its corresponding 'Metric' objects have been deleted."
)


class Metric:
    """One metric (one label set) of a :class:`MetricFamily`."""

    def __init__(
        self, family: MetricFamily, labels: dict[str, str] | None = None, buckets: list[float] | None = None
    ) -> None:
        # No reference to the family, as in tritonserver 2.51 (checked against the peer): once the model
        # drops its MetricFamily object the family is deleted, stops printing, and its metrics refuse use.
        state = family._state
        try:
            self._cell = custom_metrics.REGISTRY.metric(state, labels, buckets)
        except ValueError as error:
            raise TritonModelException(str(error)) from None
        self._kind = state.kind
        self._state = state
        weakref.finalize(self, custom_metrics.REGISTRY.release_metric, state, self._cell)

    def _check_family(self, operation: str) -> None:
        if not custom_metrics.REGISTRY.holds(self._state):
            raise TritonModelException(f"Failed to {operation} metric value: {_FAMILY_DELETED}")

    def increment(self, value: float) -> None:
        """Add ``value`` (counters: never negative)."""
        self._check_family("increment")
        if self._kind == custom_metrics.HISTOGRAM:
            raise TritonModelException("increment() is not supported on a histogram: use observe()")
        if self._kind == custom_metrics.COUNTER and value < 0:
            raise TritonModelException("a counter cannot be incremented by a negative value")
        with custom_metrics.REGISTRY.lock:
            self._cell.value += float(value)

    def set(self, value: float) -> None:
        """Set a gauge to ``value``."""
        self._check_family("set")
        if self._kind != custom_metrics.GAUGE:
            raise TritonModelException(f"set() is only supported on a gauge, not on a {self._kind}")
        with custom_metrics.REGISTRY.lock:
            self._cell.value = float(value)

    def observe(self, value: float) -> None:
        """Record one observation in a histogram."""
        self._check_family("observe")
        if self._kind != custom_metrics.HISTOGRAM:
            raise TritonModelException(f"observe() is only supported on a histogram, not on a {self._kind}")
        with custom_metrics.REGISTRY.lock:
            self._cell.observe(float(value))

    def value(self) -> float:
        """The current value of a counter or gauge."""
        self._check_family("get")
        if self._kind == custom_metrics.HISTOGRAM:
            raise TritonModelException("value() is not supported on a histogram")
        return self._cell.value
