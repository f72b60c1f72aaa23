"""The process-local registry of the metrics Python models create (``pb_utils.MetricFamily``).

A model registers metric families (counter, gauge or histogram) and metrics
(one per label set) in this process. An exporter reads them either as
Prometheus text in the form tritonserver prints custom metrics
(:func:`render_prometheus`), or as a plain-data :func:`snapshot` that can be
sent between processes, summed across replicas (:func:`merge_snapshots`) and
rendered there (``render_prometheus(merged)``).

The text follows the Prometheus text format 0.0.4 as prometheus-cpp (the
library tritonserver uses) writes it: ``# HELP`` and ``# TYPE`` lines per
family; labels sorted by name; values printed like C's ``%.16g``; histograms
as ``_count``, ``_sum`` then cumulative ``_bucket`` lines ending with
``le="+Inf"``. Families without metrics are not printed. Counters come first,
then gauges, then histograms, each in registration order.

A family or metric disappears when the last model object that holds it is
released (a model's metrics go away with the model, as in Triton).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

COUNTER = "counter"
GAUGE = "gauge"
HISTOGRAM = "histogram"
KINDS = (COUNTER, GAUGE, HISTOGRAM)

LabelKey = tuple[tuple[str, str], ...]


def label_key(labels: Mapping[str, Any] | None) -> LabelKey:
    """Labels as a sorted, hashable tuple of ``(name, value)`` strings."""
    return tuple(sorted((str(k), str(v)) for k, v in (labels or {}).items()))


@dataclass
class MetricCell:
    """The value of one metric (one label set of a family)."""

    labels: LabelKey
    value: float = 0.0
    buckets: tuple[float, ...] = ()  # histograms: upper bounds, ascending, without +Inf
    counts: list[int] = field(default_factory=list)  # histograms: per bucket (not cumulative), then +Inf
    total: float = 0.0  # histograms: sum of observations
    holders: int = 0

    def observe(self, value: float) -> None:
        index = next((i for i, bound in enumerate(self.buckets) if value <= bound), len(self.buckets))
        self.counts[index] += 1
        self.total += value


@dataclass
class FamilyState:
    name: str
    description: str
    kind: str
    order: int
    metrics: dict[LabelKey, MetricCell] = field(default_factory=dict)
    holders: int = 0


class Registry:
    """Metric families by name, thread-safe (models update metrics from any thread)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._families: dict[str, FamilyState] = {}
        self._order = 0

    def family(self, name: str, description: str, kind: str) -> FamilyState:
        """The family ``name``, created if new; a second holder must ask for the same kind and gets the
        family as it is (its first description stays, as in tritonserver)."""
        if kind not in KINDS:
            raise ValueError(f"metric family '{name}': kind must be one of {', '.join(KINDS)}, not {kind!r}")
        if not name or not _valid_name(name):
            raise ValueError(f"metric family name {name!r} is not a valid Prometheus metric name")
        with self.lock:
            state = self._families.get(name)
            if state is None:
                self._order += 1
                state = self._families[name] = FamilyState(name, description, kind, self._order)
            elif state.kind != kind:
                raise ValueError(
                    f"metric family '{name}' already exists as a {state.kind}; a family of that name "
                    f"cannot be a {kind} too"
                )
            state.holders += 1
            return state

    def holds(self, state: FamilyState) -> bool:
        """Whether the family ``state`` is still registered (a model still holds a MetricFamily of it)."""
        with self.lock:
            return self._families.get(state.name) is state

    def release_family(self, state: FamilyState) -> None:
        with self.lock:
            state.holders -= 1
            if state.holders <= 0 and self._families.get(state.name) is state:
                del self._families[state.name]

    def metric(
        self, state: FamilyState, labels: Mapping[str, Any] | None, buckets: Sequence[float] | None
    ) -> MetricCell:
        """The metric of ``state`` with ``labels`` (shared by every holder of the same labels)."""
        key = label_key(labels)
        for name, _ in key:
            if not _valid_name(name) or (name == "le" and state.kind == HISTOGRAM):
                raise ValueError(f"metric family '{state.name}': {name!r} is not a valid label name")
        bounds = self._buckets(state, buckets)
        with self.lock:
            cell = state.metrics.get(key)
            if cell is None:
                cell = state.metrics[key] = MetricCell(key, buckets=bounds, counts=[0] * (len(bounds) + 1))
            elif cell.buckets != bounds:
                raise ValueError(
                    f"metric family '{state.name}': a histogram with labels {dict(key)} already exists "
                    f"with buckets {list(cell.buckets)}"
                )
            cell.holders += 1
            return cell

    @staticmethod
    def _buckets(state: FamilyState, buckets: Sequence[float] | None) -> tuple[float, ...]:
        if state.kind != HISTOGRAM:
            if buckets is not None:
                raise ValueError(f"metric family '{state.name}': only histograms have buckets")
            return ()
        if buckets is None:
            raise ValueError(f"histogram '{state.name}': buckets are required")
        bounds = tuple(float(b) for b in buckets)
        if any(b >= c for b, c in zip(bounds, bounds[1:], strict=False)):
            raise ValueError(
                f"histogram '{state.name}': buckets must be strictly increasing, got {list(bounds)}"
            )
        return tuple(b for b in bounds if not math.isinf(b) or b < 0)

    def release_metric(self, state: FamilyState, cell: MetricCell) -> None:
        with self.lock:
            cell.holders -= 1
            if cell.holders <= 0 and state.metrics.get(cell.labels) is cell:
                del state.metrics[cell.labels]

    def snapshot(self) -> list[dict[str, Any]]:
        """Every family with its metrics as plain data (JSON- and pickle-ready), in print order."""
        with self.lock:
            families = sorted(self._families.values(), key=lambda f: (KINDS.index(f.kind), f.order))
            return [_family_data(f) for f in families if f.metrics]

    def clear(self) -> None:
        with self.lock:
            self._families.clear()


def _family_data(state: FamilyState) -> dict[str, Any]:
    metrics = []
    for cell in state.metrics.values():
        entry: dict[str, Any] = {"labels": dict(cell.labels)}
        if state.kind == HISTOGRAM:
            entry.update(buckets=list(cell.buckets), counts=list(cell.counts), sum=cell.total)
        else:
            entry["value"] = cell.value
        metrics.append(entry)
    return {"name": state.name, "description": state.description, "kind": state.kind, "metrics": metrics}


def _valid_name(name: str) -> bool:
    return (
        bool(name)
        and not name[0].isdigit()
        and all(c == "_" or c == ":" or (c.isascii() and c.isalnum()) for c in name)
    )


REGISTRY = Registry()


def snapshot() -> list[dict[str, Any]]:
    """This process's custom metrics as plain data; see :func:`merge_snapshots` and :func:`render_prometheus`."""
    return REGISTRY.snapshot()


def merge_snapshots(snapshots: Iterable[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Sum snapshots of several processes: counters, gauges and histograms with equal labels add up.

    A family keeps the description and kind of its first occurrence; a histogram
    whose buckets differ from the first one of its labels is left out.
    """
    merged: dict[str, dict[str, Any]] = {}
    for families in snapshots:
        for family in families:
            into = merged.setdefault(
                family["name"], {**{k: v for k, v in family.items() if k != "metrics"}, "metrics": {}}
            )
            if into["kind"] != family["kind"]:
                continue
            for metric in family["metrics"]:
                _add_metric(into["metrics"], label_key(metric["labels"]), metric)
    ordered = sorted(merged.values(), key=lambda f: KINDS.index(f["kind"]) if f["kind"] in KINDS else 3)
    return [{**f, "metrics": list(f["metrics"].values())} for f in ordered]


def _add_metric(metrics: dict[LabelKey, dict[str, Any]], key: LabelKey, metric: dict[str, Any]) -> None:
    current = metrics.get(key)
    if current is None:
        metrics[key] = {**metric, "labels": dict(metric["labels"])}
        if "counts" in metric:
            metrics[key]["counts"] = list(metric["counts"])
        return
    if "counts" in metric:
        if list(current.get("buckets", [])) != list(metric.get("buckets", [])):
            return
        current["counts"] = [a + b for a, b in zip(current["counts"], metric["counts"], strict=True)]
        current["sum"] += metric["sum"]
    else:
        current["value"] += metric["value"]


def render_prometheus(families: list[dict[str, Any]] | None = None) -> str:
    """Prometheus text of ``families`` (a snapshot, maybe merged), this process's own by default."""
    if families is None:
        families = snapshot()
    lines: list[str] = []
    for family in families:
        if not family["metrics"]:
            continue
        name = family["name"]
        lines.append(f"# HELP {name} {_escape_help(family['description'])}")
        lines.append(f"# TYPE {name} {family['kind']}")
        for metric in family["metrics"]:
            labels = label_key(metric["labels"])
            if family["kind"] == HISTOGRAM:
                lines.extend(_histogram_lines(name, labels, metric))
            else:
                lines.append(f"{name}{_labels(labels)} {format_value(metric['value'])}")
    return "".join(line + "\n" for line in lines)


def _histogram_lines(name: str, labels: LabelKey, metric: dict[str, Any]) -> list[str]:
    counts = metric["counts"]
    total = sum(counts)
    lines = [
        f"{name}_count{_labels(labels)} {total}",
        f"{name}_sum{_labels(labels)} {format_value(metric['sum'])}",
    ]
    cumulative = 0
    for bound, count in zip(metric["buckets"], counts, strict=False):
        cumulative += count
        lines.append(f"{name}_bucket{_labels(labels, ('le', format_value(bound)))} {cumulative}")
    lines.append(f"{name}_bucket{_labels(labels, ('le', '+Inf'))} {total}")
    return lines


def _labels(labels: LabelKey, extra: tuple[str, str] | None = None) -> str:
    pairs = list(labels) + ([extra] if extra else [])
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape_label(v)}"' for k, v in pairs) + "}"


def format_value(value: float) -> str:
    """A sample value as prometheus-cpp prints it (``%.16g``, ``Nan``, ``+Inf``, ``-Inf``)."""
    value = float(value)
    if math.isnan(value):
        return "Nan"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:.16g}"


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")
