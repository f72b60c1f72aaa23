"""Do this tool and perf_analyzer measure the same thing? Both drive each server with the client on its own core.

On a small machine the client shares the cores with the server, so a client that costs more CPU
per request (perf_analyzer, at high concurrency) leaves the server less and reads lower: the two
tools then measure different systems. Here the servers (this one and tritonserver, on the same
``identity_py`` model as ``overhead``) are started pinned to the first CPU and the clients run
pinned to the others, so each tool has the same server capacity in front of it. The notes hold
bench / perf_analyzer per server and concurrency.
"""

from __future__ import annotations

import os
from typing import Any

from bench.peers import PeerSetupError
from bench.results import Report
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
            with handle:
                report.runs += measure(handle.url, MODEL, levels, label, tools=("perf_analyzer", "bench"))
    finally:
        os.sched_setaffinity(0, everything)
    report.notes |= agreement(summarize(report.runs))
    log(f"{NAME}: results in {save_report(report, 'Client on its own core: bench vs perf_analyzer')}")
    return report


def agreement(ratios: dict[str, Any]) -> dict[str, Any]:
    """The bench / perf_analyzer ratios of ``overhead.summarize``, and the largest gap of each server."""
    out = {k: v for k, v in ratios.items() if k.startswith("agreement_")}
    out["largest_gap"] = {k: max((abs(r - 1) for r in v.values()), default=None) for k, v in out.items()}
    return out


__all__ = ["agreement", "run", "split_cpus"]
