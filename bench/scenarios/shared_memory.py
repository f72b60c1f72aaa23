"""System shared memory: perf_analyzer ``--shared-memory system`` on this server, and the same runs
without it.

This server alone serves ``identity_py``; perf_analyzer creates its regions, registers them with the
server application and sends every input and asks for every output in them, over HTTP and gRPC. The
notes hold each protocol's throughput with shared memory over the same run without it. It proves the
extension works with Triton's own tool; on this model (64 bytes a tensor) shared memory saves
nothing worth measuring, so the ratio says what the extra work per request costs.
"""

from __future__ import annotations

from bench.pa_runner import run_perf_analyzer
from bench.results import Report, Run
from bench.scenarios.common import (
    BENCH_MODELS,
    free_port,
    log,
    make_repository,
    new_report,
    save_report,
    start_this_server,
    work_dir,
)

NAME = "shared_memory"
MODEL = "identity_py"
LEVELS = [1.0, 4]
QUICK_LEVELS = [1.0]
MODES = (
    ("http", "http", ()),
    ("http shm", "http", ("--shared-memory", "system")),
    ("grpc", "grpc", ()),
    ("grpc shm", "grpc", ("--shared-memory", "system")),
)


def run(quick: bool = False) -> Report:
    """Run the scenario and save it under ``bench/results/shared_memory/``."""
    work = work_dir(NAME)
    repo = make_repository(work / "repo", [(BENCH_MODELS / MODEL, MODEL, None)])
    levels = QUICK_LEVELS if quick else LEVELS
    report = new_report(NAME, model=MODEL, levels=levels)
    handle = start_this_server(repo, free_port(), grpc_port=free_port(), log_path=work / "this_server.log")
    try:
        for label, protocol, extra in MODES:
            url = f"localhost:{handle.grpc_port}" if protocol == "grpc" else handle.url
            log(f"{NAME}: {label}")
            report.runs.append(
                run_perf_analyzer(url, MODEL, levels, label=label, protocol=protocol, extra=extra)
            )
    finally:
        handle.stop()
    report.notes |= ratios(report.runs)
    log(f"{NAME}: results in {save_report(report, 'system shared memory, identity Python model')}")
    return report


def ratios(runs: list[Run]) -> dict[str, float]:
    """``ratio_<protocol>:<level>``: throughput with shared memory over the same run without it."""
    by_label = {run.label: run.throughput_by_level() for run in runs}
    notes: dict[str, float] = {}
    for protocol in ("http", "grpc"):
        plain, shared = by_label.get(protocol, {}), by_label.get(f"{protocol} shm", {})
        for level, value in shared.items():
            if plain.get(level):
                notes[f"ratio_{protocol}:{level:g}"] = round(value / plain[level], 3)
    return notes
