"""Do this tool and perf_analyzer measure the same thing? Both drive each server with the client on its own core.

On a small machine the client shares the cores with the server, so a client that costs more CPU
per request (perf_analyzer, at high concurrency) leaves the server less and reads lower: the two
tools then measure different systems. Here the servers (this one and tritonserver, on the same
``identity_py`` model as ``overhead``) are started pinned to the first CPU and the clients run
pinned to the others, so each tool has the same server capacity in front of it.

A shared machine drifts by more than the tolerance between two sweeps of the same tool, so each
server is swept ``ROUNDS`` times, the tools taking turns (and turns about which goes first); a
tool's figure at a level is the median round. The notes hold bench / perf_analyzer of those medians
per server and concurrency, every round's throughput, and how many requests the server itself
counted for each bench point against the requests the client counted.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

from bench.peers import PeerSetupError
from bench.results import Point, Report, Run
from bench.scenarios.common import (
    BENCH_MODELS,
    log,
    make_repository,
    measure,
    new_report,
    save_report,
    work_dir,
)
from bench.scenarios.overhead import MODEL, _servers, summarize

NAME = "agreement"
LEVELS = [1.0, 4, 16]
QUICK_LEVELS = [1.0, 8]
ROUNDS = 3
TOOLS = ("perf_analyzer", "bench")


def split_cpus(cpus: set[int]) -> tuple[set[int], set[int]] | None:
    """``(server CPUs, client CPUs)``: the lowest CPU for the server, the rest for the client."""
    if len(cpus) < 2:
        return None
    ordered = sorted(cpus)
    return {ordered[0]}, set(ordered[1:])


def run(quick: bool = False) -> Report:
    """Measure both servers with both tools, clients pinned apart; save under ``bench/results/agreement/``."""
    work = work_dir(NAME)
    repo = make_repository(work / "repo", [(BENCH_MODELS / MODEL, MODEL, None)])
    levels = QUICK_LEVELS if quick else LEVELS
    everything = os.sched_getaffinity(0)
    split = split_cpus(everything)
    report = new_report(NAME, model=MODEL, levels=levels)
    if split is None:
        report.notes["skipped"] = "needs at least 2 CPUs: one for the server, one for the clients"
        save_report(report)
        return report
    server_cpus, client_cpus = split
    report.environment |= {"server_cpus": sorted(server_cpus), "client_cpus": sorted(client_cpus)}
    try:
        for label, start in _servers(repo, work):
            log(f"{NAME}: starting {label} on CPUs {sorted(server_cpus)}")
            os.sched_setaffinity(0, server_cpus)  # the server's processes inherit this
            try:
                handle = start()
            except PeerSetupError as exc:
                report.notes.setdefault("skipped", {})[label] = str(exc)[-600:]
                continue
            finally:
                os.sched_setaffinity(0, client_cpus)  # so do perf_analyzer's
            rounds: list[Run] = []
            with handle:
                for turn in range(1 if quick else ROUNDS):
                    order = TOOLS if turn % 2 == 0 else TOOLS[::-1]
                    for tool in order:
                        log(f"{NAME}: {label}, {tool}, round {turn + 1}")
                        rounds += measure(handle.url, MODEL, levels, label, tools=(tool,))
            report.runs += [median_run(rounds, f"{label} ({tool})") for tool in TOOLS]
            report.notes.setdefault("rounds", {}).update(round_throughputs(rounds))
            report.notes.setdefault("server_counted_over_client_counted", {})[label] = server_confirmation(
                [r for r in rounds if r.tool == "bench"]
            )
    finally:
        os.sched_setaffinity(0, everything)
    report.notes |= agreement(summarize(report.runs))
    log(f"{NAME}: results in {save_report(report, 'Client on its own core: bench vs perf_analyzer')}")
    return report


def median_run(rounds: list[Run], label: str) -> Run:
    """One run labelled ``label`` whose point at each level is the median-throughput point of the rounds
    with that label (the lower middle one of an even count)."""
    same = [r for r in rounds if r.label == label]
    by_level: dict[float, list[Point]] = {}
    for run in same:
        for point in run.points:
            by_level.setdefault(point.level, []).append(point)
    points = []
    for level in sorted(by_level):
        ordered = sorted(by_level[level], key=lambda p: p.infer_per_s)
        points.append(ordered[(len(ordered) - 1) // 2])
    first = same[0]
    options = first.options | {"rounds": len(same), "figure": "median round"}
    return Run(label, first.tool, first.model, first.url, first.mode, options, points)


def round_throughputs(rounds: list[Run]) -> dict[str, dict[str, list[float]]]:
    """Every round's throughput, by run label and level."""
    out: dict[str, dict[str, list[float]]] = {}
    for run in rounds:
        for level, value in run.throughput_by_level().items():
            out.setdefault(run.label, {}).setdefault(f"{level:g}", []).append(value)
    return out


def server_confirmation(runs: list[Run]) -> dict[str, float | None]:
    """Per level, the median over rounds of (requests the server counted) / (requests the client counted)
    during the measured windows; None where the server reported no count."""
    ratios: dict[str, list[float]] = {}
    for run in runs:
        for point in run.points:
            counted = point.main_server(run.model).get("success_count")
            if counted is not None and point.requests:
                ratios.setdefault(f"{point.level:g}", []).append(counted / point.requests)
    return {level: statistics.median(values) if values else None for level, values in ratios.items()}


def agreement(ratios: dict[str, Any]) -> dict[str, Any]:
    """The bench / perf_analyzer ratios of ``overhead.summarize``, and the largest gap of each server."""
    out = {k: v for k, v in ratios.items() if k.startswith("agreement_")}
    out["largest_gap"] = {k: max((abs(r - 1) for r in v.values()), default=None) for k, v in out.items()}
    return out


__all__ = ["agreement", "median_run", "round_throughputs", "run", "server_confirmation", "split_cpus"]
