"""Dynamic batching and instances on the CRNN-shaped ONNX model (the text-recognition experiment).

Two rows per request, concurrency 2 to 16 step 2, four configurations of the same model side by side:
no dynamic batching with one instance; dynamic batching with one instance; with two instances; with
two instances and a 10 µs queue delay. Each configuration is its own server run on a copy of the
example model whose ``config.pbtxt`` is rewritten. The notes hold each configuration's throughput
relative to the first one, and the average batch size the server formed.
"""

from __future__ import annotations

from typing import Any

from bench.peers import PeerSetupError
from bench.results import Report, Run
from bench.scenarios.common import (
    EXAMPLES,
    ConfigEdit,
    chain,
    free_port,
    log,
    make_repository,
    measure,
    new_report,
    save_report,
    set_dynamic_batching,
    set_instances,
    start_this_server,
    work_dir,
)

NAME = "batching"
MODEL = "crnn"
ROWS = 2
LEVELS = [2.0, 4, 6, 8, 10, 12, 14, 16]
QUICK_LEVELS = [2.0, 8, 16]

# Auto-complete turns dynamic batching on for an ONNX model that batches and names no scheduler (as
# Triton's ONNX Runtime backend does), so the configuration without it runs with auto-complete off.
NO_AUTO_COMPLETE = ("--disable-auto-complete-config",)
CONFIGS: list[tuple[str, ConfigEdit, tuple[str, ...]]] = [
    (
        "no dynamic batching, 1 instance",
        chain(set_dynamic_batching(False), set_instances(1)),
        NO_AUTO_COMPLETE,
    ),
    ("dynamic batching, 1 instance", chain(set_dynamic_batching(True), set_instances(1)), ()),
    ("dynamic batching, 2 instances", chain(set_dynamic_batching(True), set_instances(2)), ()),
    (
        "dynamic batching, 2 instances, 10 us delay",
        chain(set_dynamic_batching(True, 10), set_instances(2)),
        (),
    ),
]


def run(quick: bool = False, tools: tuple[str, ...] = ("bench",)) -> Report:
    """Run the four configurations and save them under ``bench/results/batching/``."""
    work = work_dir(NAME)
    levels = QUICK_LEVELS if quick else LEVELS
    report = new_report(NAME, model=MODEL, rows_per_request=ROWS, levels=levels)
    for i, (label, edit, server_args) in enumerate(CONFIGS):
        repo = make_repository(work / f"repo{i}", [(EXAMPLES / MODEL, MODEL, edit)])
        log(f"{NAME}: {label}")
        try:
            handle = start_this_server(
                repo, free_port(), log_path=work / f"server{i}.log", extra_args=server_args
            )
        except PeerSetupError as exc:
            report.notes.setdefault("skipped", {})[label] = str(exc)[-600:]
            continue
        with handle:
            report.runs += measure(handle.url, MODEL, levels, label, tools=tools, batch_size=ROWS)
    report.notes |= summarize(report.runs)
    log(f"{NAME}: results in {save_report(report, 'CRNN, 2 rows per request')}")
    return report


def summarize(runs: list[Run]) -> dict[str, Any]:
    """Throughput of each run relative to the first, and average batch sizes formed, per level."""
    if not runs:
        return {}
    base = {p.concurrency: p.infer_per_s for p in runs[0].points}
    speedup, batches = {}, {}
    for run in runs:
        speedup[run.label] = {
            str(p.concurrency): p.infer_per_s / base[p.concurrency]
            for p in run.points
            if base.get(p.concurrency)
        }
        batches[run.label] = {
            str(p.concurrency): p.main_server(MODEL).get("avg_batch_size") for p in run.points
        }
    return {"throughput_relative_to_first": speedup, "avg_batch_size": batches}
