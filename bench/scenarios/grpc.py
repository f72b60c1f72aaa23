"""gRPC front end: perf_analyzer ``-i grpc`` on this server and on the real tritonserver, and HTTP beside it.

Both servers serve the same ``identity_py`` model (the same ``model.py``), one after the other in one
run. Per server: perf_analyzer over gRPC, synchronous (one request in flight per concurrency slot),
``--async`` and ``--streaming`` (``ModelStreamInfer``), then over HTTP, at the same concurrencies.
The notes hold this server's gRPC throughput as a fraction of the peer's gRPC (per mode) and of
its own HTTP, and any restart of a server that died during a mode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.pa_runner import run_perf_analyzer
from bench.peers import PeerSetupError, ServerHandle, log_tail
from bench.results import Report, Run
from bench.scenarios.common import (
    BENCH_MODELS,
    log,
    make_repository,
    new_report,
    peer_and_this,
    save_report,
    work_dir,
)
from bench.scenarios.overhead import ratios

NAME = "grpc"
MODEL = "identity_py"
LEVELS = [1.0, 2, 4, 8, 16, 32, 64]
QUICK_LEVELS = [1.0, 32]
PEER = "tritonserver"
THIS = "this server"
# (label suffix, protocol, extra perf_analyzer flags)
MODES = (
    ("grpc sync", "grpc", ()),
    ("grpc async", "grpc", ("--async",)),
    ("grpc streaming", "grpc", ("--streaming",)),  # ModelStreamInfer, one stream per concurrency slot
    ("http sync", "http", ()),
)


def _servers(repo: Any, logs: Any) -> list[tuple[str, Callable[[], ServerHandle]]]:
    return peer_and_this(repo, logs, grpc=True)


def run(quick: bool = False) -> Report:
    """Run the scenario and save it under ``bench/results/grpc/``."""
    work = work_dir(NAME)
    repo = make_repository(work / "repo", [(BENCH_MODELS / MODEL, MODEL, None)])
    levels = QUICK_LEVELS if quick else LEVELS
    report = new_report(NAME, model=MODEL, levels=levels)

    def measure(handle: ServerHandle, run_label: str, protocol: str, extra: tuple[str, ...]) -> Run:
        url = f"localhost:{handle.grpc_port}" if protocol == "grpc" else handle.url
        return run_perf_analyzer(url, MODEL, levels, label=run_label, protocol=protocol, extra=extra)

    for label, start in _servers(repo, work):
        run_modes(report, label, start, measure)
    report.notes |= summarize(report.runs)
    log(f"{NAME}: results in {save_report(report, 'gRPC front end, identity Python model')}")
    return report


def run_modes(
    report: Report,
    label: str,
    start: Callable[[], ServerHandle],
    measure: Callable[[ServerHandle, str, str, tuple[str, ...]], Run],
) -> None:
    """Start the server, measure every mode of ``MODES`` on it (``measure(handle, run label,
    protocol, perf_analyzer flags)``), stop it.

    A server that ended during a mode (tritonserver 2.51 has died on SIGSEGV between its
    ``--streaming`` runs at c=32 and c=64) is recorded in ``notes["restarts"]`` with its log's tail and started again
    for the next mode, so one crash does not lose the modes after it.
    """

    def started(where: str) -> ServerHandle | None:
        try:
            return start()
        except PeerSetupError as exc:
            report.notes.setdefault("skipped", {})[where] = str(exc)[-600:]
            return None

    log(f"{NAME}: starting {label}")
    handle = started(label)
    try:
        for suffix, protocol, extra in MODES:
            if handle is not None and handle.process.poll() is not None:
                report.notes.setdefault("restarts", {}).setdefault(label, []).append(
                    f"exited with {handle.process.returncode} before {suffix}: "
                    + log_tail(handle, 1200).strip()
                )
                handle.stop()
                log(f"{NAME}: {label} exited ({handle.process.returncode}); starting it again")
                handle = started(f"{label} ({suffix})")
            if handle is None:
                return
            log(f"{NAME}: {label}, {suffix}")
            report.runs.append(measure(handle, f"{label} ({suffix})", protocol, extra))
    finally:
        if handle is not None:
            handle.stop()


def _levels(runs: list[Run], label: str) -> dict[float, float]:
    run = next((r for r in runs if r.label == label), None)
    return {} if run is None else run.throughput_by_level()


def summarize(runs: list[Run]) -> dict[str, Any]:
    """This server's gRPC / the peer's gRPC (sync and async), and its gRPC / its own HTTP."""
    out: dict[str, Any] = {}
    for mode in ("grpc sync", "grpc async", "grpc streaming"):
        this = _levels(runs, f"{THIS} ({mode})")
        out[f"ratio_this_over_peer_{mode.replace(' ', '_')}"] = ratios(
            this, _levels(runs, f"{PEER} ({mode})")
        )
        out[f"ratio_this_{mode.replace(' ', '_')}_over_this_http"] = ratios(
            this, _levels(runs, f"{THIS} (http sync)")
        )
    out["ratio_peer_grpc_sync_over_peer_http"] = ratios(
        _levels(runs, f"{PEER} (grpc sync)"), _levels(runs, f"{PEER} (http sync)")
    )
    return out
