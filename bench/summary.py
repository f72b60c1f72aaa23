"""The ratio tables of the scenarios, from their saved results, for ``bench/results/SUMMARY.md`` and the README.

``python -m bench summary`` reads ``bench/results/<scenario>/results.json`` of every scenario that
has run, writes ``bench/results/SUMMARY.md`` and replaces the block between the README's
``<!-- bench:start -->`` and ``<!-- bench:end -->`` markers with the same tables and the plots.
Every table names the commit, the date and the command that produced its numbers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bench.results import Report, Run, read_json

RESULTS = Path(__file__).resolve().parent / "results"
README = RESULTS.parent.parent / "README.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"
SCENARIOS = ("overhead", "agreement", "batching", "limit", "ensemble")


def _num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def _table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> list[str]:
    head = list(header)
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _by_level(run: Run | None) -> dict[float, float]:
    return {} if run is None else run.throughput_by_level()


def _run(report: Report, label: str) -> Run | None:
    return next((r for r in report.runs if r.label == label), None)


def _levels(runs: Iterable[Run]) -> list[float]:
    return sorted({level for r in runs for level in r.throughput_by_level()})


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def provenance(report: Report) -> str:
    """One line: the command, the commit (and whether it had local changes), the date, the machine."""
    env = report.environment
    commit = str(env.get("git_commit") or "unknown")[:10]
    dirty = " (with local changes)" if env.get("git_dirty") else ""
    command = (
        env.get("command") or f"python -m bench scenario {report.name}"
    )  # results saved before it was recorded
    return (
        f"`{command}` at commit `{commit}`{dirty}, {env.get('time_utc', '?')}, "
        f"{env.get('cpu_count', '?')} CPUs, Ray {env.get('packages', {}).get('ray', '?')}"
    )


def overhead_section(report: Report) -> list[str]:
    """This server against the tritonserver peer on a trivial Python model, per tool and concurrency."""
    tools = ("perf_analyzer", "bench")
    runs = {
        (server, tool): _by_level(_run(report, f"{server} ({tool})"))
        for server in ("tritonserver", "this server")
        for tool in tools
    }
    rows = []
    for level in _levels(report.runs):
        row = [f"{level:g}"]
        for tool in tools:
            peer, this = runs[("tritonserver", tool)].get(level), runs[("this server", tool)].get(level)
            row += [_num(peer), _num(this), _num(_ratio(this, peer), 2)]
        rows.append(row)
    header = ["concurrency"]
    for tool in tools:
        header += [f"tritonserver ({tool})", f"this server ({tool})", "ratio"]
    return [
        "### Serving overhead: trivial Python-backend model, this server vs tritonserver 2.51 (infer/s)",
        "",
        provenance(report),
        "",
        *_table(header, rows),
        "",
        "![throughput](overhead/throughput.png) ![latency](overhead/latency.png)",
    ]


def batching_section(report: Report) -> list[str]:
    """The CRNN text-recognition experiment: four configurations side by side."""
    labels = [r.label for r in report.runs if r.tool == "bench"] or [r.label for r in report.runs]
    first = _by_level(_run(report, labels[0])) if labels else {}
    batches = report.notes.get("avg_batch_size", {})
    rows = []
    for level in _levels(report.runs):
        row = [f"{level:g}"]
        for label in labels:
            value = _by_level(_run(report, label)).get(level)
            avg = batches.get(label, {}).get(str(int(level)))
            row.append(f"{_num(value)} ({_num(_ratio(value, first.get(level)), 2)}×, b̄ {_num(avg, 1)})")
        rows.append(row)
    return [
        "### Dynamic batching and instances: CRNN, 2 rows per request (infer/s, × first column, mean rows per batch)",
        "",
        provenance(report),
        "",
        *_table(["concurrency", *(label.removesuffix(" (bench)") for label in labels)], rows),
        "",
        "![throughput](batching/throughput.png) ![latency](batching/latency.png)",
    ]


def limit_section(report: Report) -> list[str]:
    """CRNN served at concurrency 16 as a fraction of onnxruntime called directly, per configuration."""
    rows, sizes, drift = [], [], []
    for label, entry in report.notes.get("configurations", {}).items():
        direct = entry.get("direct", {}).get("infer_per_s")
        for tool, value in entry.get("served_infer_per_s", {}).items():
            rows.append([label, tool, _num(value), _num(direct), _num(_ratio(value, direct), 2)])
        formed = ", ".join(f"{k}×{v}" for k, v in entry.get("batch_sizes_formed", {}).items())
        sizes.append(f"{label}: {formed or 'none reported'}")
        first, last = (entry.get("direct", {}).get(f"infer_per_s_{w}_serving") for w in ("before", "after"))
        if first and last:
            drift.append(f"{label}: {_num(first)} before serving, {_num(last)} after")
    return [
        "### The raw limit: CRNN at concurrency 16 against onnxruntime in one process",
        "",
        provenance(report),
        "",
        *_table(
            ["configuration", "client", "served infer/s", "direct onnxruntime infer/s", "fraction"], rows
        ),
        "",
        f"Batches the server formed (rows×executions): {'; '.join(sizes) or 'none reported'}.",
        *([f"Direct onnxruntime infer/s, the mean of two timings: {'; '.join(drift)}."] if drift else []),
        *limit_cpu_lines(report.notes.get("configurations", {})),
    ]


CPU_ROLES = ("model replicas", "HAProxy", "bench client", "everything else")


def _threads(count: Any) -> str:
    return f"{count} thread" if count == 1 else f"{count if count is not None else '?'} threads"


def limit_cpu_lines(configurations: dict[str, Any]) -> list[str]:
    """The machine's CPU per request while the bench client measured, by role, beside onnxruntime's
    own and the budget at the target fraction (nothing for results saved before it was recorded)."""
    rows = []
    for label, entry in configurations.items():
        cpu = entry.get("cpu")
        if not cpu:
            continue
        ms = cpu.get("cpu_ms_per_request", {})
        framework = cpu.get("onnxruntime_cpu_ms_per_request", {})
        budget = cpu.get("budget_ms_per_request", {})
        rows.append(
            [
                label,
                *(_num(ms.get(role), 3) for role in CPU_ROLES),
                _num(ms.get("total"), 3),
                f"{_num(framework.get('ms'), 3)} ({_threads(framework.get('intra_op_threads'))})",
                f"{_num(budget.get('ms'), 3)} (at {budget.get('fraction', '?')})",
            ]
        )
    if not rows:
        return []
    header = ["configuration", *CPU_ROLES, "total", "onnxruntime alone", "budget"]
    return [
        "",
        "CPU milliseconds per request while the bench client measured, by process (all cores), "
        "beside onnxruntime's own CPU at the same batch sizes and threads, and the CPU per request "
        "the machine's cores allow at the target fraction of the direct throughput:",
        "",
        *_table(header, rows),
    ]


def ensemble_section(report: Report) -> list[str]:
    """The text-recognition ensemble with the in-process DLPack hand-off and with separate replicas."""
    labels = [r.label for r in report.runs]
    rows = []
    for level in _levels(report.runs):
        values = [_by_level(_run(report, label)).get(level) for label in labels]
        ratio = _ratio(values[0], values[1]) if len(values) > 1 else None
        rows.append([f"{level:g}", *(_num(v) for v in values), _num(ratio, 2)])
    header = ["concurrency", *(label.removesuffix(" (bench)") for label in labels), "ratio"]
    return [
        "### Ensemble pipeline: in-process DLPack hand-off vs separate replicas (infer/s, CPU)",
        "",
        provenance(report),
        "",
        *_table(header, rows),
        "",
        "![throughput](ensemble/throughput.png) ![latency](ensemble/latency.png)",
    ]


def agreement_section(report: Report) -> list[str]:
    """This tool against perf_analyzer on the same servers, the client on its own core."""
    rows = []
    for server in ("tritonserver", "this server"):
        bench = _by_level(_run(report, f"{server} (bench)"))
        pa = _by_level(_run(report, f"{server} (perf_analyzer)"))
        for level in sorted(set(bench) | set(pa)):
            ratio = _ratio(bench.get(level), pa.get(level))
            rows.append([server, f"{level:g}", _num(pa.get(level)), _num(bench.get(level)), _num(ratio, 2)])
    env = report.environment
    return [
        "### Tool agreement: this tool vs perf_analyzer, client pinned apart from the server (infer/s)",
        "",
        provenance(report),
        f"Server on CPUs {env.get('server_cpus', '?')}, clients on CPUs {env.get('client_cpus', '?')}.",
        "",
        *_table(["server", "concurrency", "perf_analyzer", "bench", "bench / perf_analyzer"], rows),
    ]


SECTIONS: dict[str, Callable[[Report], list[str]]] = {
    "overhead": overhead_section,
    "agreement": agreement_section,
    "batching": batching_section,
    "limit": limit_section,
    "ensemble": ensemble_section,
}


def summary_lines(results: Path = RESULTS, image_prefix: str = "") -> list[str]:
    """Every scenario's section, in a fixed order, for the scenarios that have results."""
    lines: list[str] = []
    for name in SCENARIOS:
        path = results / name / "results.json"
        if not path.exists():
            continue
        section = SECTIONS[name](read_json(path))
        if image_prefix:
            section = [re.sub(r"\]\((\w+/)", rf"]({image_prefix}\1", line) for line in section]
        lines += [*section, ""]
    return lines


def write_summary(results: Path = RESULTS, readme: Path | None = README) -> Path:
    """Write ``SUMMARY.md`` beside the results and refresh the README's bench block (if it has one)."""
    out = results / "SUMMARY.md"
    out.write_text("# Benchmark results\n\n" + "\n".join(summary_lines(results)))
    if readme is not None and readme.exists():
        text = readme.read_text()
        if START in text and END in text:
            prefix = results.relative_to(readme.parent).as_posix() + "/"
            block = "\n".join([START, *summary_lines(results, image_prefix=prefix), END])
            text = re.sub(re.escape(START) + r".*?" + re.escape(END), lambda _: block, text, flags=re.S)
            readme.write_text(text)
    return out


def main(argv: Any = None) -> int:
    print(write_summary())
    return 0


__all__ = ["SECTIONS", "provenance", "summary_lines", "write_summary"]
