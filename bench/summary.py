"""The ratio tables of the scenarios, from their saved results, for ``bench/results/SUMMARY.md`` and the README.

``python -m bench summary`` reads ``bench/results/<scenario>/results.json`` of every scenario that
has run, writes ``bench/results/SUMMARY.md`` and replaces the block between the README's
``<!-- bench:start -->`` and ``<!-- bench:end -->`` markers with the same tables and the plots.
Every table names the commit, the date and the command that produced its numbers.

The same block is refreshed in every page of ``docs/`` that holds the markers
(``docs/measurements.md``).

``python -m bench summary --check`` writes nothing: it fails when those tables differ from what
``summary`` would write now, or when a figure in ``README.md``, a page of ``docs/`` or
``bench/README.md`` differs from the result it cites, or stands there without citing one. A figure
cites its result with an HTML comment right after it,
``0.40–0.50<!-- fig limit:1 instance:*:fraction -->`` (see ``bench/README.md``, "Figures in prose").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bench.results import Report, Run, read_json, report_from_dict

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = RESULTS.parent.parent
README = ROOT / "README.md"
BENCH_README = RESULTS.parent / "README.md"
DOCS = ROOT / "docs"
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
        ratios = [_num(_ratio(v, values[0]), 2) for v in values[1:]]
        rows.append([f"{level:g}", *(_num(v) for v in values), *ratios])
    names = [label.removesuffix(" (bench)") for label in labels]
    header = ["concurrency", *names, *(f"{n} / {names[0]}" for n in names[1:])]
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


def summary_text(results: Path = RESULTS) -> str:
    """What ``SUMMARY.md`` holds."""
    return "# Benchmark results\n\n" + "\n".join(summary_lines(results))


def readme_block(results: Path, readme: Path) -> str:
    """A page's block between the markers, markers included, image paths relative to the page."""
    prefix = Path(os.path.relpath(results, readme.parent)).as_posix() + "/"
    return "\n".join([START, *summary_lines(results, image_prefix=prefix), END])


BLOCK = re.compile(re.escape(START) + r".*?" + re.escape(END), flags=re.S)


def doc_pages(docs: Path | None) -> list[Path]:
    """The markdown pages of ``docs/``, in name order (none when there is no such folder)."""
    return sorted(docs.glob("*.md")) if docs is not None and docs.is_dir() else []


def write_summary(results: Path = RESULTS, readme: Path | None = README, docs: Path | None = None) -> Path:
    """Write ``SUMMARY.md`` beside the results and refresh the bench block of the README and of
    every page of ``docs`` that has one."""
    out = results / "SUMMARY.md"
    out.write_text(summary_text(results))
    for page in [*([readme] if readme is not None else []), *doc_pages(docs)]:
        if not page.exists():
            continue
        text = page.read_text()
        found = BLOCK.search(text)
        if found is not None:
            page.write_text(text[: found.start()] + readme_block(results, page) + text[found.end() :])
    return out


# The figures a prose sentence may cite, per scenario, named "label:level:what" and the like.


def _run_figures(report: Report) -> dict[str, float]:
    out = {}
    for run in report.runs:
        for p in run.points:
            key = f"{run.label}:{p.level:g}"
            out[f"{key}:infer_per_s"] = p.infer_per_s
            out[f"{key}:p50_ms"] = p.p50_us / 1000
            out[f"{key}:p99_ms"] = p.p99_us / 1000
            if p.client_cores is not None:
                out[f"{key}:client_cores"] = p.client_cores
            for role, ms in (p.cpu_ms or {}).items():
                out[f"{key}:cpu_ms:{role}"] = ms
    return out


def _overhead_figures(report: Report, data: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for tool in ("perf_analyzer", "bench"):
        peer = _by_level(_run(report, f"tritonserver ({tool})"))
        this = _by_level(_run(report, f"this server ({tool})"))
        out |= {f"{tool}:{lv:g}:ratio": r for lv in this if (r := _ratio(this[lv], peer.get(lv)))}
    return out


def _agreement_figures(report: Report, data: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    counted = report.notes.get("server_counted_over_client_counted", {})
    for server in ("tritonserver", "this server"):
        bench = _by_level(_run(report, f"{server} (bench)"))
        pa = _by_level(_run(report, f"{server} (perf_analyzer)"))
        out |= {f"{server}:{lv:g}:ratio": r for lv in bench if (r := _ratio(bench[lv], pa.get(lv)))}
        for level, value in counted.get(server, {}).items():
            out[f"{server}:{level}:count_gap_pct"] = abs(value - 1) * 100
    return out


def _batching_figures(report: Report, data: dict[str, Any]) -> dict[str, float]:
    out = {}
    labels = [r.label for r in report.runs if r.tool == "bench"] or [r.label for r in report.runs]
    first = _by_level(_run(report, labels[0])) if labels else {}
    for label in labels:
        for level, value in _by_level(_run(report, label)).items():
            if ratio := _ratio(value, first.get(level)):
                out[f"{label}:{level:g}:ratio"] = ratio
        for level, avg in report.notes.get("avg_batch_size", {}).get(label, {}).items():
            out[f"{label}:{level}:mean_batch"] = avg
    return out


def _limit_figures(report: Report, data: dict[str, Any]) -> dict[str, float]:
    out = {}
    for label, entry in report.notes.get("configurations", {}).items():
        direct = entry.get("direct", {}).get("infer_per_s")
        if direct:
            out[f"{label}:direct"] = direct
        for tool, value in entry.get("served_infer_per_s", {}).items():
            out[f"{label}:{tool}:served"] = value
            if fraction := _ratio(value, direct):
                out[f"{label}:{tool}:fraction"] = fraction
        cpu = entry.get("cpu")
        if not cpu:
            continue
        ms = cpu.get("cpu_ms_per_request", {})
        out |= {f"{label}:cpu:{role}": value for role, value in ms.items()}
        framework = cpu.get("onnxruntime_cpu_ms_per_request", {}).get("ms")
        budget = cpu.get("budget_ms_per_request", {})
        others = sum(ms.get(role, 0.0) for role in CPU_ROLES[1:])
        out[f"{label}:cpu:others"] = others  # HAProxy, the client and everything else
        if framework is not None:
            out[f"{label}:cpu:onnxruntime"] = framework
            out[f"{label}:cpu:request path"] = ms.get("model replicas", 0.0) - framework
        if budget.get("ms") is not None:
            out[f"{label}:cpu:budget"] = budget["ms"]
            out[f"{label}:cpu:target"] = budget.get("fraction", 0.0)
            if framework is not None:
                out[f"{label}:cpu:left"] = budget["ms"] - framework - others
    return out


def _ensemble_figures(report: Report, data: dict[str, Any]) -> dict[str, float]:
    labels = [r.label for r in report.runs]
    if len(labels) < 2:
        return {}
    first = _by_level(_run(report, labels[0]))
    out: dict[str, float] = {}
    for index, label in enumerate(labels[1:], start=1):  # each separate variant over in-process
        other = _by_level(_run(report, label))
        out |= {f"{lv:g}:ratio{index}": r for lv in first if (r := _ratio(other.get(lv), first[lv]))}
    return out


def _http_floor_figures(data: dict[str, Any]) -> dict[str, float]:
    result = data.get("result", {})
    names = {"requests_per_s": "requests_per_s", "server_cpu_ms": "server_cpu_ms_per_request"}
    names["client_cpu_ms"] = "client_cpu_ms_per_request"
    return {key: float(result[field]) for key, field in names.items() if field in result}


def _item_name(index: int, item: Any) -> str:
    """A list item's part of a figure name: its text fields joined (``add_one``, ``(b) one hop sync``),
    else its position."""
    if isinstance(item, dict):
        words = [v for k, v in item.items() if isinstance(v, str) and k not in ("command",)]
        if words:
            return " ".join(words)
    return str(index)


def flatten(data: Any, prefix: str = "") -> dict[str, float]:
    """Every number of a JSON value by its path, parts joined by ``:`` (``load:sent``,
    ``add_one:first_answer_after_kill_s``, ``ratio_this_over_peer_grpc_sync:1``)."""
    out: dict[str, float] = {}
    if isinstance(data, bool):
        return out
    if isinstance(data, int | float):
        return {prefix: float(data)} if prefix else out
    if isinstance(data, dict):
        for key, value in data.items():
            part = f"{float(key):g}" if _is_number(key) else str(key)
            out |= flatten(value, f"{prefix}:{part}" if prefix else part)
    elif isinstance(data, list):
        for index, value in enumerate(data):
            part = _item_name(index, value)
            out |= flatten(value, f"{prefix}:{part}" if prefix else part)
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


FIGURES: dict[str, Callable[[Report, dict[str, Any]], dict[str, float]]] = {
    "overhead": _overhead_figures,
    "agreement": _agreement_figures,
    "batching": _batching_figures,
    "limit": _limit_figures,
    "ensemble": _ensemble_figures,
}


def figures(data: dict[str, Any], scenario: str) -> dict[str, float]:
    """Every figure of one saved result that prose may cite, by name (without the scenario).

    A scenario's report gives its runs' figures, the numbers of its ``notes`` by path (the ratios
    by level of ``grpc``, ``sequence``, ``cluster_scaling``...) and the scenario's own figures; any
    other saved JSON (``recovery/after``, ``cluster/node_loss``...) gives every number by path."""
    if scenario == "http_floor":
        return _http_floor_figures(data)
    if "runs" not in data:
        return flatten({k: v for k, v in data.items() if k != "environment"})
    report = report_from_dict(data)
    return {
        **_run_figures(report),
        **flatten(report.notes),
        **FIGURES.get(scenario, lambda r, d: {})(report, data),
    }


class Sources:
    """The saved results a citation names: ``limit`` (the file now), ``limit@4143317`` (in git),
    ``recovery/after`` (another file of the scenario's folder, here ``after.json``)."""

    def __init__(self, results: Path = RESULTS, repo: Path = ROOT):
        self.results, self.repo = results, repo
        self.cache: dict[str, dict[str, float] | str] = {}

    @staticmethod
    def _relative(name: str) -> str:
        """``limit`` → ``limit/results.json``, ``recovery/after`` → ``recovery/after.json``."""
        return f"{name}.json" if "/" in name else f"{name}/results.json"

    def file(self, source: str) -> str:
        name, _, ref = source.partition("@")
        path = f"bench/results/{self._relative(name)}"
        return f"{path} at commit {ref}" if ref else path

    def get(self, source: str) -> dict[str, float] | str:
        """The figures of ``source``, or why they cannot be read."""
        if source not in self.cache:
            self.cache[source] = self._load(source)
        return self.cache[source]

    def _load(self, source: str) -> dict[str, float] | str:
        name, _, ref = source.partition("@")
        relative = self._relative(name)
        try:
            if ref:
                text = subprocess.run(
                    ["git", "-C", str(self.repo), "show", f"{ref}:bench/results/{relative}"],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
            else:
                text = (self.results / relative).read_text()
            return figures(json.loads(text), name.partition("/")[0])
        except (OSError, subprocess.CalledProcessError, ValueError) as exc:
            return f"cannot read {self.file(source)}: {str(exc).strip() or type(exc).__name__}"


_NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
CITED = re.compile(
    rf"(?P<low>{_NUMBER})(?:\s*[–-]\s*(?P<high>{_NUMBER}))?\s*<!--\s*fig\s+(?P<cite>.*?)\s*-->"
)
MARK = re.compile(r"<!--\s*fig\s.*?-->")
# A figure that must cite its result: a decimal, a percentage or a factor, a number with thousands
# separators, or a count of inferences per second.
UNCITED = re.compile(
    rf"(?:{_NUMBER})\s*(?:[–-]\s*(?:{_NUMBER})\s*)?(?:%|×)"
    r"|\d+\.\d+(?:\s*[–-]\s*[\d.]+)?"
    r"|\d{1,3}(?:,\d{3})+"
    r"|\d+(?:\s*[–-]\s*\d+)?(?=\s*infer/s)"
)
CODE = re.compile(r"`[^`]*`")
FENCE = re.compile(r"^```.*?^```", flags=re.S | re.M)
# Not figures: versions (HTTP/1.1, Ray 2.60, tritonserver 2.51, Python 3.11) and addresses.
NOT_FIGURES = re.compile(
    r"(?:HTTP/|\b(?:Ray|Serve|tritonserver|Triton|Python|numpy|grpcio|uvicorn|HAProxy) )\d+(?:\.\d+)+\b"
    r"|\b\d+(?:\.\d+){2,}\b"
)
# Where every measured figure must cite its result: the whole README, every page of docs/ (each but
# its bench block, whose tables are checked against what ``summary`` writes), and bench/README.md's
# "Reading the numbers". A citation is checked wherever it stands.
PROSE = {"bench/README.md": ("## Reading the numbers", "\n## ")}
WHOLE = ("", "")


def _pattern(text: str) -> re.Pattern[str]:
    """A glob over figure names: ``*`` within one part, ``{4,16}`` for alternatives."""
    out = ""
    for part in re.split(r"(\{[^}]*\}|\*)", text):
        if part == "*":
            out += "[^:]*"
        elif part.startswith("{") and part.endswith("}"):
            out += "(?:" + "|".join(re.escape(p.strip()) for p in part[1:-1].split(",")) + ")"
        else:
            out += re.escape(part)
    return re.compile(out)


def _fmt(value: float, digits: int) -> str:
    return f"{value:,.{digits}f}"


def _digits(number: str) -> int:
    return len(number.partition(".")[2])


def check_figure(low: str, high: str | None, cite: str, sources: Sources) -> tuple[str, str] | None:
    """``None`` when the figure is what its result holds, else (problem, kind) with kind
    ``stale`` or ``unverified`` (the cited commit is not in this clone)."""
    reduce, _, rest = cite.strip().partition(" ")
    if reduce not in ("max", "min"):
        reduce, rest = "", cite.strip()
    source, _, names = rest.partition(":")
    found = sources.get(source)
    if isinstance(found, str):
        return found, "unverified" if "@" in source else "stale"
    pattern = _pattern(names.strip())
    values = [v for k, v in found.items() if pattern.fullmatch(k)]
    if not values:
        return f"{sources.file(source)} holds no figure named {names.strip()!r}", "stale"
    if reduce:
        values = [max(values) if reduce == "max" else min(values)]
    expected_low = _fmt(min(values), _digits(low))
    expected_high = _fmt(max(values), _digits(high or low))
    if high is None and expected_low == low and expected_high == low:
        return None
    if high is not None and (expected_low, expected_high) == (low, high):
        return None
    expected = (
        expected_low if expected_low == expected_high and high is None else f"{expected_low}–{expected_high}"
    )
    stated = low if high is None else f"{low}–{high}"
    return f"{stated} should read {expected} ({sources.file(source)}: {names.strip()})", "stale"


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _blank(m: re.Match[str]) -> str:
    """The match as spaces, its line breaks kept (so offsets and line numbers hold)."""
    return re.sub(r"[^\n]", " ", m.group())


def check_prose(
    path: Path, name: str, sources: Sources, region: tuple[str, str] | None = None
) -> tuple[list[str], list[str]]:
    """The stale and the unverifiable figures of one file, each as ``file:line: what``. Within
    ``region`` (the text from its first heading to its end marker; ``WHOLE``: all of it) a figure
    that cites no result is stale too."""
    text = BLOCK.sub(_blank, FENCE.sub(_blank, path.read_text()))  # examples, generated tables
    stale: list[str] = []
    unverified: list[str] = []
    cited = list(CITED.finditer(text))
    for m in cited:
        found = check_figure(m["low"], m["high"], m["cite"], sources)
        if found:
            (stale if found[1] == "stale" else unverified).append(
                f"{name}:{_line(text, m.start())}: {found[0]}"
            )
    spans = {m.start() + m.group().index("<!--") for m in cited}
    for m in MARK.finditer(text):
        if m.start() not in spans:
            stale.append(f"{name}:{_line(text, m.start())}: citation {m.group()} follows no figure")
    start, end = region if region is not None else PROSE.get(name, ("", ""))
    if region == WHOLE or (start and start in text):
        a = text.index(start) + len(start) if start else 0
        b = text.find(end, a) if end else -1
        b = len(text) if b < 0 else b
        prose = text[a:b]
        for pattern in (CODE, CITED, MARK, NOT_FIGURES):
            prose = pattern.sub(_blank, prose)
        for m in UNCITED.finditer(prose):
            stale.append(f"{name}:{_line(text, a + m.start())}: {m.group().strip()} cites no result")
    return stale, unverified


def check(
    results: Path = RESULTS,
    readme: Path = README,
    bench_readme: Path | None = BENCH_README,
    repo: Path = ROOT,
    docs: Path | None = DOCS,
) -> tuple[list[str], list[str]]:
    """Everything stale in the README, the pages of ``docs``, ``bench/README.md`` and ``SUMMARY.md``,
    and what could not be verified here (citations of a commit this clone lacks)."""
    sources = Sources(results, repo)
    stale, unverified = [], []
    summary = results / "SUMMARY.md"
    if not summary.exists() or summary.read_text() != summary_text(results):
        stale.append(f"{summary.name}: differs from the saved results (run python -m bench summary)")
    pages: list[tuple[Path | None, str, tuple[str, str] | None]] = [(readme, "README.md", WHOLE)]
    pages += [(page, f"docs/{page.name}", WHOLE) for page in doc_pages(docs)]
    pages.append((bench_readme, "bench/README.md", None))
    for path, name, region in pages:
        if path is None or not path.exists():
            continue
        block = BLOCK.search(path.read_text())
        if block is not None and block.group() != readme_block(results, path):
            stale.append(f"{name}: the tables differ from the saved results (run python -m bench summary)")
        s, u = check_prose(path, name, sources, region)
        stale += s
        unverified += u
    return stale, unverified


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench summary")
    parser.add_argument("--check", action="store_true", help="write nothing; fail on a stale table or figure")
    args = parser.parse_args(argv)
    if not args.check:
        print(write_summary(RESULTS, README, DOCS))
        return 0
    stale, unverified = check()
    for line in unverified:
        print(f"not verified: {line}", file=sys.stderr)
    for line in stale:
        print(f"stale: {line}", file=sys.stderr)
    if not stale:
        print("figures and tables match bench/results/")
    return 1 if stale else 0


__all__ = ["SECTIONS", "check", "figures", "flatten", "provenance", "summary_lines", "write_summary"]
