"""Sequence batching: perf_analyzer's sequences on a stateful Python model, this server and tritonserver.

Both servers serve the same running-sum model (``tests/batching/models/sequence_accumulator``, the
Direct strategy, 8 slots per instance) with one instance and with two, one server after the other in
one run. perf_analyzer sends sequences of 10 requests (``--sequence-length 10``) with IDs from
``--sequence-id-range``, concurrency = concurrent sequences. With two replicas this server's HAProxy
spreads requests over both, and a replica that does not own a sequence forwards the request to the one
that does (``deployments.runtime.router``): about half the requests take a second hop, which
the one-instance and two-instance runs put side by side. Notes: this server / tritonserver per model
and concurrency, and the perf_analyzer command.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.pa_runner import run_perf_analyzer
from bench.peers import PeerSetupError, ServerHandle
from bench.results import Report, Run
from bench.scenarios.common import (
    log,
    make_repository,
    new_report,
    peer_and_this,
    save_report,
    set_instances,
    work_dir,
)

NAME = "sequence"
SOURCE = Path(__file__).resolve().parents[2] / "tests" / "batching" / "models" / "sequence_accumulator"
MODELS = {"seq_acc_x1": 1, "seq_acc_x2": 2}
LEVELS = [1.0, 4, 8]
QUICK_LEVELS = [1.0, 8]
SEQUENCE_ARGS = ["--sequence-length", "10", "--sequence-id-range", "1:1000000"]
PEER = "tritonserver"
THIS = "this server"


def _servers(repo: Any, logs: Any) -> list[tuple[str, Callable[[], ServerHandle]]]:
    return peer_and_this(repo, logs, grpc=False)


def run(quick: bool = False) -> Report:
    """Run the scenario and save it under ``bench/results/sequence/``."""
    work = work_dir(NAME)
    repo = make_repository(work / "repo", [(SOURCE, name, set_instances(n)) for name, n in MODELS.items()])
    levels = QUICK_LEVELS if quick else LEVELS
    report = new_report(NAME, models=list(MODELS), levels=levels)
    report.notes["perf_analyzer_args"] = " ".join(SEQUENCE_ARGS) + " --concurrency-range <level>"
    for label, start in _servers(repo, work):
        log(f"{NAME}: starting {label}")
        try:
            handle = start()
        except PeerSetupError as exc:
            report.notes.setdefault("skipped", {})[label] = str(exc)[-600:]
            continue
        with handle:
            for model in MODELS:
                report.runs.append(
                    run_perf_analyzer(
                        handle.url,
                        model,
                        levels,
                        label=f"{label} {model} (perf_analyzer)",
                        measurement_interval_ms=2000,
                        max_trials=6,
                        extra=SEQUENCE_ARGS,
                    )
                )
    report.notes |= summarize(report.runs)
    log(f"{NAME}: results in {save_report(report, 'Sequence batching, stateful Python model')}")
    return report


def _find(runs: list[Run], label: str, model: str) -> Run | None:
    return next((r for r in runs if r.label.startswith(f"{label} {model} ")), None)


def summarize(runs: list[Run]) -> dict[str, Any]:
    """This server / tritonserver per model and concurrency, and 2 replicas / 1 on this server."""
    out: dict[str, Any] = {}
    for model in MODELS:
        this, peer = _find(runs, THIS, model), _find(runs, PEER, model)
        if this is None or peer is None:
            continue
        a, b = this.throughput_by_level(), peer.throughput_by_level()
        out[f"ratio_this_over_peer_{model}"] = {f"{k:g}": a[k] / b[k] for k in sorted(a) if b.get(k)}
    one, two = _find(runs, THIS, "seq_acc_x1"), _find(runs, THIS, "seq_acc_x2")
    if one is not None and two is not None:
        a, b = two.throughput_by_level(), one.throughput_by_level()
        out["this_server_x2_over_x1"] = {f"{k:g}": a[k] / b[k] for k in sorted(a) if b.get(k)}
    return out
