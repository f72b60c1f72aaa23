"""The server-side view of a window: deltas of the KServe v2 / Triton statistics extension (pure).

``GET /v2/models/stats`` returns cumulative counters per model version. Two snapshots taken at the
edges of a measurement window give, by difference, how many requests the server finished in it, the
average time they spent queued and in compute input / infer / output, and which batch sizes the
server formed (``batch_stats`` counts executions per batch size).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

PHASES: tuple[str, ...] = ("queue", "compute_input", "compute_infer", "compute_output")


@dataclass(frozen=True)
class ModelCounters:
    """Cumulative counters of one model (all its versions added together)."""

    success_count: int = 0
    fail_count: int = 0
    inference_count: int = 0
    execution_count: int = 0
    phase_ns: dict[str, int] = field(default_factory=dict)
    batch_executions: dict[int, int] = field(default_factory=dict)


def _count_ns(stat: Mapping[str, Any] | None) -> tuple[int, int]:
    """``(count, ns)`` of a ``{"count": .., "ns": ..}`` duration entry (missing = zeros)."""
    if not stat:
        return 0, 0
    return int(stat.get("count", 0)), int(stat.get("ns", 0))


def parse_snapshot(body: Mapping[str, Any]) -> dict[str, ModelCounters]:
    """Counters per model name from a ``/v2/models[/m]/stats`` response body."""
    out: dict[str, ModelCounters] = {}
    for entry in body.get("model_stats", []):
        infer = entry.get("inference_stats", {})
        phase_ns = {p: _count_ns(infer.get(p))[1] for p in PHASES}
        batches: dict[int, int] = {}
        for b in entry.get("batch_stats", []) or []:
            size = int(b.get("batch_size", 0))
            batches[size] = batches.get(size, 0) + _count_ns(b.get("compute_infer"))[0]
        counters = ModelCounters(
            success_count=_count_ns(infer.get("success"))[0],
            fail_count=_count_ns(infer.get("fail"))[0],
            inference_count=int(entry.get("inference_count", 0)),
            execution_count=int(entry.get("execution_count", 0)),
            phase_ns=phase_ns,
            batch_executions=batches,
        )
        name = str(entry.get("name", ""))
        out[name] = _add(out[name], counters) if name in out else counters
    return out


def _add(a: ModelCounters, b: ModelCounters) -> ModelCounters:
    """Counters of two versions of one model added together."""
    return _combine(a, b, 1)


def _combine(a: ModelCounters, b: ModelCounters, sign: int) -> ModelCounters:
    """``a + sign * b`` field by field."""
    keys = set(a.batch_executions) | set(b.batch_executions)
    batches = {k: a.batch_executions.get(k, 0) + sign * b.batch_executions.get(k, 0) for k in keys}
    return ModelCounters(
        success_count=a.success_count + sign * b.success_count,
        fail_count=a.fail_count + sign * b.fail_count,
        inference_count=a.inference_count + sign * b.inference_count,
        execution_count=a.execution_count + sign * b.execution_count,
        phase_ns={p: a.phase_ns.get(p, 0) + sign * b.phase_ns.get(p, 0) for p in PHASES},
        batch_executions={k: v for k, v in sorted(batches.items()) if v},
    )


@dataclass(frozen=True)
class ServerBreakdown:
    """What the server reports for one model over a span of time: counts and mean phase times (µs)."""

    success_count: int
    fail_count: int
    inference_count: int
    execution_count: int
    queue_us: float
    compute_input_us: float
    compute_infer_us: float
    compute_output_us: float
    batch_sizes: dict[int, int]

    @property
    def avg_batch_size(self) -> float:
        """Mean rows per execution (0 when nothing executed)."""
        return self.inference_count / self.execution_count if self.execution_count else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (batch sizes keyed by string)."""
        d = asdict(self)
        d["batch_sizes"] = {str(k): v for k, v in self.batch_sizes.items()}
        d["avg_batch_size"] = self.avg_batch_size
        return d


def breakdown(before: ModelCounters, after: ModelCounters) -> ServerBreakdown:
    """The difference ``after - before`` with phase times averaged per successful request."""
    d = _combine(after, before, -1)
    n = d.success_count

    def per_request(phase: str) -> float:
        return d.phase_ns.get(phase, 0) / n / 1000.0 if n else 0.0

    return ServerBreakdown(
        success_count=d.success_count,
        fail_count=d.fail_count,
        inference_count=d.inference_count,
        execution_count=d.execution_count,
        queue_us=per_request("queue"),
        compute_input_us=per_request("compute_input"),
        compute_infer_us=per_request("compute_infer"),
        compute_output_us=per_request("compute_output"),
        batch_sizes=dict(d.batch_executions),
    )


def breakdowns(
    before: Mapping[str, ModelCounters], after: Mapping[str, ModelCounters]
) -> dict[str, ServerBreakdown]:
    """Per-model breakdowns of two snapshots, for every model that did any work in between."""
    out: dict[str, ServerBreakdown] = {}
    for name, end in after.items():
        b = breakdown(before.get(name, ModelCounters()), end)
        if b.success_count or b.fail_count or b.execution_count:
            out[name] = b
    return out
