"""Serving overhead: a trivial Python-backend model on this server and on the real tritonserver.

Both servers serve the same ``identity_py`` model (the same ``model.py``), one after the other in one
run; each is measured with perf_analyzer and with this tool at concurrency 1 to 64. The report's
notes hold, per concurrency, this server's throughput as a fraction of the peer's (per tool) and how
far this tool's numbers are from perf_analyzer's on the same server.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.peers import PeerSetupError, ServerHandle
from bench.results import Report, Run
from bench.scenarios.common import (
    BENCH_MODELS,
    log,
    make_repository,
    measure,
    new_report,
    peer_and_this,
    save_report,
    work_dir,
)

NAME = "overhead"
MODEL = "identity_py"
LEVELS = [1.0, 2, 4, 8, 16, 32, 64]
QUICK_LEVELS = [1.0, 8, 32]
PEER = "tritonserver"
THIS = "this server"


def _servers(repo: Any, logs: Any) -> list[tuple[str, Callable[[], ServerHandle]]]:
    return peer_and_this(repo, logs, grpc=False)


def run(quick: bool = False, servers: tuple[str, ...] = (PEER, THIS)) -> Report:
    """Run the scenario (on the named ``servers``) and save it under ``bench/results/overhead/``."""
    work = work_dir(NAME)
    repo = make_repository(work / "repo", [(BENCH_MODELS / MODEL, MODEL, None)])
    levels = QUICK_LEVELS if quick else LEVELS
    report = new_report(NAME, model=MODEL, levels=levels)
    for label, start in _servers(repo, work):
        if label not in servers:
            continue
        log(f"{NAME}: starting {label}")
        try:
            handle = start()
        except PeerSetupError as exc:
            report.notes.setdefault("skipped", {})[label] = str(exc)[-600:]
            log(f"{NAME}: {label} did not start: {exc}")
            continue
        with handle:
            report.runs += measure(handle.url, MODEL, levels, label, tools=("perf_analyzer", "bench"))
    report.notes |= summarize(report.runs)
    log(f"{NAME}: results in {save_report(report, 'Serving overhead, identity Python model')}")
    return report


def _by_level(run: Run | None) -> dict[float, float]:
    """Throughput per concurrency of a run."""
    return {} if run is None else run.throughput_by_level()


def _find(runs: list[Run], label: str, tool: str) -> Run | None:
    return next((r for r in runs if r.label.startswith(label) and r.tool == tool), None)


def ratios(num: dict[float, float], den: dict[float, float]) -> dict[str, float]:
    """``num / den`` at every level both have (keyed by the level as text)."""
    return {f"{k:g}": num[k] / den[k] for k in sorted(num) if k in den and den[k] > 0}


def summarize(runs: list[Run]) -> dict[str, Any]:
    """Throughput ratios this server / peer (per tool), and bench / perf_analyzer (per server)."""
    out: dict[str, Any] = {}
    for tool in ("perf_analyzer", "bench"):
        this, peer = _by_level(_find(runs, THIS, tool)), _by_level(_find(runs, PEER, tool))
        out[f"ratio_this_over_peer_{tool}"] = ratios(this, peer)
    for label in (THIS, PEER):
        bench, pa = _by_level(_find(runs, label, "bench")), _by_level(_find(runs, label, "perf_analyzer"))
        out[f"agreement_bench_over_perf_analyzer_{label.replace(' ', '_')}"] = ratios(bench, pa)
    return out
