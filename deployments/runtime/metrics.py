"""Triton's metric names, summed per replica and handed to exported counters.

The counters come from the serving layer: a model replica on Ray exports them
through Ray's metrics API (``deployments.serve.ray_metrics``, registered with
:func:`use_counters`), next to Serve's own metrics (Prometheus and the Ray
dashboard; Ray prefixes exported names with ``ray_``), labelled by model and
version as Triton labels them. Where none are registered, metrics are off.

Each Ray metric update costs about as much as a trivial model's whole request
(it crosses into Ray's core worker), so a replica sums its updates in plain
Python and hands the sums to the counters at most once per ``FLUSH_INTERVAL_S``:
one increment per counter and label set per second, whatever the request rate.
Like Triton's defaults, durations are cumulative counters (no histograms).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from deployments.settings import MetricsConfig

logger = logging.getLogger(__name__)

TAG_KEYS = ("model", "version")
FLUSH_INTERVAL_S = 1.0

# Triton's counter families, with the help text tritonserver prints (checked against tritonserver 2.51)
COUNTERS: dict[str, str] = {
    "nv_inference_request_success": "Number of successful inference requests, all batch sizes",
    "nv_inference_request_failure": "Number of failed inference requests, all batch sizes",
    "nv_inference_count": "Number of inferences performed (does not include cached requests)",
    "nv_inference_exec_count": "Number of model executions performed (does not include cached requests)",
    "nv_inference_request_duration_us": (
        "Cumulative inference request duration in microseconds (includes cached requests)"
    ),
    "nv_inference_queue_duration_us": (
        "Cumulative inference queuing duration in microseconds (includes cached requests)"
    ),
    "nv_inference_compute_input_duration_us": (
        "Cumulative compute input duration in microseconds (does not include cached requests)"
    ),
    "nv_inference_compute_infer_duration_us": (
        "Cumulative compute inference duration in microseconds (does not include cached requests)"
    ),
    "nv_inference_compute_output_duration_us": (
        "Cumulative inference compute output duration in microseconds (does not include cached requests)"
    ),
}
# Triton's response-cache families, printed for the models that enable the cache
CACHE_COUNTERS: dict[str, tuple[str, str]] = {
    "nv_cache_num_hits_per_model": ("Number of response cache hits per model", "cache_hit"),
    "nv_cache_num_misses_per_model": ("Number of response cache misses per model", "cache_miss"),
    "nv_cache_hit_duration_per_model": (
        "Cumulative time requests spend retrieving a cached response per model (microseconds)",
        "cache_hit",
    ),
    "nv_cache_miss_duration_per_model": (
        "Cumulative time requests spend looking up and inserting responses into the cache on a cache miss "
        "(microseconds)",
        "cache_miss",
    ),
}
# Triton's latency summaries (``--metrics-config summary_latencies=true``), with the statistics
# duration each one observes; the request summary is left out for a model with a response cache
SUMMARIES: dict[str, tuple[str, str]] = {
    "nv_inference_request_summary_us": (
        "Summary of inference request duration in microseconds (includes cached requests)",
        "success",
    ),
    "nv_inference_queue_summary_us": (
        "Summary of inference queuing duration in microseconds (includes cached requests)",
        "queue",
    ),
    "nv_inference_compute_input_summary_us": (
        "Summary of compute input duration in microseconds (does not include cached requests)",
        "compute_input",
    ),
    "nv_inference_compute_infer_summary_us": (
        "Summary of compute inference duration in microseconds (does not include cached requests)",
        "compute_infer",
    ),
    "nv_inference_compute_output_summary_us": (
        "Summary of compute output duration in microseconds (does not include cached requests)",
        "compute_output",
    ),
}
CACHE_SUMMARIES: dict[str, tuple[str, str]] = {
    "nv_cache_hit_summary_us": ("Summary of response cache hit duration in microseconds", "cache_hit"),
    "nv_cache_miss_summary_us": ("Summary of response cache miss duration in microseconds", "cache_miss"),
}
LATENCY_COUNTERS = (
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
    "nv_cache_hit_duration_per_model",
    "nv_cache_miss_duration_per_model",
)
"""The counters ``--metrics-config counter_latencies=false`` leaves out."""
PENDING = "nv_inference_pending_request_count"
PENDING_HELP = "Instantaneous number of pending requests awaiting execution per-model."
FAILURE_REASONS = ("OTHER", "BACKEND", "CANCELED", "REJECTED")
# nv_* gauges of the host, as tritonserver prints them on a machine without GPUs
SYSTEM_GAUGES: dict[str, str] = {
    "nv_cpu_utilization": "CPU utilization rate [0.0 - 1.0]",
    "nv_cpu_memory_total_bytes": "CPU total memory (RAM), in bytes",
    "nv_cpu_memory_used_bytes": "CPU used memory (RAM), in bytes",
}


class Counter(Protocol):
    def inc(self, value: float = ..., tags: dict[str, str] = ...) -> Any: ...


CounterFactory = Callable[[str, str, tuple[str, ...]], Counter]
Tags = tuple[tuple[str, str], ...]
CounterSource = Callable[[], CounterFactory | None]
"""Gives the exported counters' constructor, or None where nothing exports them now."""


def no_counters() -> CounterFactory | None:
    """The source where the serving layer registered none: metrics are off."""
    return None


default_counters: CounterSource = no_counters


def use_counters(source: CounterSource | None) -> None:
    """Where each ``TritonMetrics`` built without ``counters`` gets them in this process, from now on
    (the serving layer registers Ray's as a replica starts); None: nowhere, metrics off."""
    global default_counters
    default_counters = source or no_counters


class TritonMetrics:
    """Triton's counters of one replica, summed locally and flushed to the exported counters periodically.

    ``counters`` builds the exported counters (by default, those :func:`use_counters` registered);
    without any, every call is a no-op.
    """

    def __init__(
        self, counters: CounterFactory | None = None, flush_interval_s: float = FLUSH_INTERVAL_S
    ) -> None:
        factory = counters if counters is not None else default_counters()
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
            if value > 0:  # Ray's counters take positive increments only
                try:
                    self._counters[name].inc(value, dict(tags))
                except Exception as exc:  # a failed export must not fail requests
                    logger.debug("metric %s not exported: %s", name, exc)


def tags_for(model: str, version: Any) -> Tags:
    """The label set of one model version."""
    return (("model", model), ("version", str(version)))


# --- Triton's metrics endpoint: Prometheus text as tritonserver prints it ---------------------------


def settled(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The last snapshot of a replica that is gone: its counters stand (Triton's counters never go
    back), while its gauge of pending requests falls to zero, since nothing waits on it any more."""
    return {**snapshot, "pending": {}}


def merge_model_metrics(snapshots: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum ``ModelRuntime.metrics_snapshot()`` entries of one model (several replicas, nodes)."""
    from deployments.runtime.stats import merge_snapshots

    pending: defaultdict[str, int] = defaultdict(int)
    failures: defaultdict[str, defaultdict[str, int]] = defaultdict(lambda: defaultdict(int))
    for snapshot in snapshots:
        for version, count in snapshot.get("pending", {}).items():
            pending[version] += count
        for version, reasons in snapshot.get("failures", {}).items():
            for reason, count in reasons.items():
                failures[version][reason] += count
    samples: defaultdict[str, defaultdict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for snapshot in snapshots:
        for version, series in snapshot.get("samples", {}).items():
            for key, values in series.items():
                samples[version][key].extend(values)
    return {
        "stats": merge_snapshots([s.get("stats", []) for s in snapshots]),
        "pending": dict(pending),
        "failures": {v: dict(r) for v, r in failures.items()},
        "response_cache": any(s.get("response_cache", False) for s in snapshots),
        "samples": {v: dict(series) for v, series in samples.items()},
    }


def render_triton(
    models: Mapping[str, dict[str, Any]],
    custom: list[dict[str, Any]] | None = None,
    system: Mapping[str, float] | None = None,
    config: MetricsConfig | None = None,
    hosts: Sequence[Mapping[str, Any]] = (),
) -> str:
    """The text of Triton's ``/metrics``: its counter families per model and version (``models``: merged
    snapshots by model name, see :func:`merge_model_metrics`), then the models' custom counters, the
    pending-request gauge, the host gauges (``system``, by name of :data:`SYSTEM_GAUGES`), the custom
    gauges and the custom histograms — the order tritonserver prints them in: counters, gauges,
    histograms. ``config`` (``--metrics-config``) leaves the latency counters out or adds the latency
    summaries. The model-host families (``hosts``: each host replica's status, :func:`render_model_hosts`)
    follow the counters and the gauges of their kind."""
    from deployments import custom_metrics

    config = config or MetricsConfig()

    rows = [(name, entry) for name, entry in sorted(models.items()) for entry in entry.get("stats", [])]
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for custom_family in custom or ():
        by_kind[custom_family["kind"]].append(custom_family)
    lines: list[str] = []
    for family, help_text in COUNTERS.items():
        if not config.counter_latencies and family in LATENCY_COUNTERS:
            continue
        lines += [f"# HELP {family} {help_text}", f"# TYPE {family} counter"]
        for name, stats in rows:
            version = stats["version"]
            if family == "nv_inference_request_failure":
                reasons = models[name].get("failures", {}).get(version, {})
                for reason in FAILURE_REASONS:
                    labels = f'model="{_escape(name)}",reason="{reason}",version="{version}"'
                    lines.append(f"{family}{{{labels}}} {reasons.get(reason, 0)}")
                continue
            labels = f'model="{_escape(name)}",version="{version}"'
            lines.append(f"{family}{{{labels}}} {_counter_value(family, stats)}")
    cached = [(name, stats) for name, stats in rows if models[name].get("response_cache")]
    for family, (help_text, key) in CACHE_COUNTERS.items() if cached else ():
        if not config.counter_latencies and family in LATENCY_COUNTERS:
            continue
        lines += [f"# HELP {family} {help_text}", f"# TYPE {family} counter"]
        for name, stats in cached:
            duration = stats.get("inference_stats", {}).get(key, {})
            value = duration.get("count", 0) if "num_" in family else duration.get("ns", 0) // 1000
            lines.append(f'{family}{{model="{_escape(name)}",version="{stats["version"]}"}} {int(value)}')
    if config.summary_latencies:
        lines += _summaries(models, rows, cached, config.summary_quantiles)
    text = "".join(line + "\n" for line in lines)
    text += custom_metrics.render_prometheus(by_kind[custom_metrics.COUNTER])
    host_counters, host_gauges = _model_host_lines(hosts)
    text += "".join(line + "\n" for line in host_counters)
    lines = [f"# HELP {PENDING} {PENDING_HELP}", f"# TYPE {PENDING} gauge"]
    for name, stats in rows:
        count = models[name].get("pending", {}).get(stats["version"], 0)
        lines.append(f'{PENDING}{{model="{_escape(name)}",version="{stats["version"]}"}} {count}')
    for gauge, help_text in SYSTEM_GAUGES.items():
        if system is not None and gauge in system:
            value = custom_metrics.format_value(system[gauge])
            lines += [f"# HELP {gauge} {help_text}", f"# TYPE {gauge} gauge", f"{gauge} {value}"]
    text += "".join(line + "\n" for line in lines + host_gauges)
    text += custom_metrics.render_prometheus(by_kind[custom_metrics.GAUGE])
    return text + custom_metrics.render_prometheus(by_kind[custom_metrics.HISTOGRAM])


# Model hosts (docs/hosts.md): families of this server's own (Triton has no model hosts), named in
# Triton's style with a ``model_host`` infix. Counters sum over host replicas; the gauges count them.
MODEL_HOST_COUNTERS = {
    "nv_model_host_load_total": ("loads", "Loads of a pooled model on a model host replica (cold starts)"),
    "nv_model_host_load_failure_total": ("load_failures", "Loads of a pooled model that failed"),
    "nv_model_host_eviction_total": (
        "evictions",
        "Unloads of a pooled model to keep a host within its budget",
    ),
    "nv_model_host_load_duration_us": ("cold_start_s", "Cumulative time pooled models took to load"),
}
MODEL_HOST_GAUGES = {
    "nv_model_host_resident": "Model host replicas where a pooled model is loaded now",
    "nv_model_host_resident_bytes": "Memory a pooled model takes on the host replicas where it is loaded",
    "nv_model_host_resident_gpu_bytes": "GPU memory a pooled model takes on the host replicas where it is loaded",
}
# Every family /metrics prints by default, custom families aside: what a dashboard may query (none is a
# histogram; the latency summaries of --metrics-config summary_latencies=true are opt-in, SUMMARIES)
FAMILIES: tuple[str, ...] = (
    *COUNTERS,
    *CACHE_COUNTERS,
    PENDING,
    *SYSTEM_GAUGES,
    *MODEL_HOST_COUNTERS,
    *MODEL_HOST_GAUGES,
)


def _summaries(
    models: Mapping[str, dict[str, Any]],
    rows: list[tuple[str, dict[str, Any]]],
    cached: list[tuple[str, dict[str, Any]]],
    quantiles: tuple[tuple[float, float], ...],
) -> list[str]:
    """The summary families: ``_count`` and ``_sum`` from the cumulative statistics, each quantile from
    the durations every replica observed in the window (``NaN`` where it observed none)."""
    lines: list[str] = []
    with_cache = {name for name, _ in cached}
    for family, (help_text, key) in [*SUMMARIES.items(), *(CACHE_SUMMARIES.items() if cached else ())]:
        shown = [
            (name, stats)
            for name, stats in (cached if key.startswith("cache_") else rows)
            if not (key == "success" and name in with_cache)
        ]
        if not shown:
            continue
        lines += [f"# HELP {family} {help_text}", f"# TYPE {family} summary"]
        for name, stats in shown:
            version = stats["version"]
            labels = f'model="{_escape(name)}",version="{version}"'
            duration = stats.get("inference_stats", {}).get(key, {})
            lines.append(f"{family}_count{{{labels}}} {int(duration.get('count', 0))}")
            lines.append(f"{family}_sum{{{labels}}} {int(duration.get('ns', 0)) // 1000}")
            values = sorted(models[name].get("samples", {}).get(version, {}).get(key, []))
            for quantile, _ in quantiles:
                lines.append(f'{family}{{{labels},quantile="{quantile!r}"}} {_quantile(values, quantile)}')
    return lines


def _quantile(ordered: list[float], quantile: float) -> str:
    """The nearest-rank ``quantile`` of ``ordered`` as Prometheus prints it (``NaN`` when empty)."""
    from deployments import custom_metrics

    if not ordered:
        return "NaN"
    rank = min(len(ordered) - 1, max(0, math.ceil(quantile * len(ordered)) - 1))
    return custom_metrics.format_value(ordered[rank])


def render_model_hosts(statuses: Sequence[Mapping[str, Any]]) -> str:
    """The model-host families of ``/metrics`` alone from each host replica's status (its ``counters``,
    and ``resident`` and ``resident_gpu`` footprints by model, ``ModelHostDeployment.host_status``);
    empty without hosts. :func:`render_triton` prints them among Triton's families."""
    counters, gauges = _model_host_lines(statuses)
    return "".join(line + "\n" for line in counters + gauges)


def _model_host_lines(statuses: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[str]]:
    """The model-host counter families' lines and gauge families' lines (none without hosts)."""
    counters: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    resident: dict[str, list[int]] = defaultdict(list)
    on_gpus: dict[str, int] = defaultdict(int)
    for status in statuses:
        for model, footprint in status.get("resident_gpu", {}).items():
            on_gpus[model] += int(footprint)
        for model, values in status.get("counters", {}).items():
            for key, value in values.items():
                counters[model][key] += float(value)
        for model, footprint in status.get("resident", {}).items():
            resident[model].append(int(footprint))
    models = sorted(set(counters) | set(resident))
    if not models:
        return [], []
    lines: list[str] = []
    for family, (key, help_text) in MODEL_HOST_COUNTERS.items():
        lines += [f"# HELP {family} {help_text}", f"# TYPE {family} counter"]
        for model in models:
            value = counters[model].get(key, 0.0)
            shown = int(value * 1e6) if key.endswith("_s") else int(value)
            lines.append(f'{family}{{model="{_escape(model)}"}} {shown}')
    gauges: list[str] = []
    for family, help_text in MODEL_HOST_GAUGES.items():
        gauges += [f"# HELP {family} {help_text}", f"# TYPE {family} gauge"]
        for model in models:
            if family.endswith("gpu_bytes"):
                value = on_gpus[model]
            else:
                value = len(resident[model]) if family.endswith("resident") else sum(resident[model])
            gauges.append(f'{family}{{model="{_escape(model)}"}} {value}')
    return lines, gauges


def _counter_value(family: str, stats: Mapping[str, Any]) -> int:
    durations = stats.get("inference_stats", {})

    def us(*keys: str) -> int:
        return sum(int(durations.get(k, {}).get("ns", 0)) for k in keys) // 1000

    if family == "nv_inference_request_success":
        return int(durations.get("success", {}).get("count", 0))
    if family == "nv_inference_count":
        return int(stats.get("inference_count", 0))
    if family == "nv_inference_exec_count":
        return int(stats.get("execution_count", 0))
    if family == "nv_inference_request_duration_us":
        return us("success", "fail")
    key = family.removeprefix("nv_inference_").removesuffix("_duration_us")
    return us(key)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class HostGauges:
    """``nv_cpu_utilization`` (since the previous reading) and the host's memory, from ``/proc``
    (empty where ``/proc`` is not there)."""

    def __init__(self) -> None:
        self._last: tuple[int, int] | None = None

    def read(self) -> dict[str, float]:
        out: dict[str, float] = {}
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
            idle, total = fields[3] + (fields[4] if len(fields) > 4 else 0), sum(fields)
            last, self._last = self._last, (idle, total)
            if last is not None and total > last[1]:
                out["nv_cpu_utilization"] = 1.0 - (idle - last[0]) / (total - last[1])
            else:
                out["nv_cpu_utilization"] = 0.0
            memory: dict[str, int] = {}
            with open("/proc/meminfo") as f:
                for line in f:
                    key, _, rest = line.partition(":")
                    memory[key] = int(rest.split()[0]) * 1024
            out["nv_cpu_memory_total_bytes"] = float(memory["MemTotal"])
            out["nv_cpu_memory_used_bytes"] = float(memory["MemTotal"] - memory.get("MemAvailable", 0))
        except (OSError, ValueError, KeyError, IndexError):
            return out
        return out
