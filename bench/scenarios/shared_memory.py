"""System shared memory: perf_analyzer ``--shared-memory system`` on this server and on tritonserver,
each with and without it, in one run.

Both servers serve ``identity_py`` twice: as shipped (FP32 [16], 64 bytes a tensor) and as
``identity_py_1m`` (FP32 [262144], 1 MiB a tensor), where shared memory has real bytes to save.
perf_analyzer creates its regions, registers them with the server and sends every input and asks for
every output in them, over HTTP and gRPC. The notes hold, per server, tensor size, protocol and
level, the throughput with shared memory over the same server without it, and this server's
throughput over tritonserver's in the same mode.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bench.pa_runner import run_perf_analyzer
from bench.peers import PeerSetupError, ServerHandle
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
from repository_loader.proto import model_config_pb2

NAME = "shared_memory"
MODEL = "identity_py"
LARGE = "identity_py_1m"
LARGE_ELEMENTS = 262144  # FP32: 1 MiB a tensor
LEVELS = [1.0, 4]
QUICK_LEVELS = [1.0]
PEER = "tritonserver"
THIS = "this server"
MODES = (
    ("http", "http", ()),
    ("http shm", "http", ("--shared-memory", "system")),
    ("grpc", "grpc", ()),
    ("grpc shm", "grpc", ("--shared-memory", "system")),
)


def _large(config: model_config_pb2.ModelConfig) -> None:
    """``identity_py`` with 1 MiB tensors."""
    for tensor in (*config.input, *config.output):
        del tensor.dims[:]
        tensor.dims.append(LARGE_ELEMENTS)


def _servers(repo: Path, logs: Path) -> list[tuple[str, Callable[[], ServerHandle]]]:
    return peer_and_this(repo, logs, grpc=True)


def run(quick: bool = False, servers: tuple[str, ...] = (PEER, THIS)) -> Report:
    """Run the scenario (on the named ``servers``) and save it under ``bench/results/shared_memory/``."""
    work = work_dir(NAME)
    repo = make_repository(
        work / "repo",
        [(BENCH_MODELS / MODEL, MODEL, None), (BENCH_MODELS / MODEL, LARGE, _large)],
    )
    levels = QUICK_LEVELS if quick else LEVELS
    report = new_report(NAME, model=MODEL, levels=levels)
    for server, start in _servers(repo, work):
        if server not in servers:
            continue
        log(f"{NAME}: starting {server}")
        try:
            handle = start()
        except PeerSetupError as exc:
            report.notes.setdefault("skipped", {})[server] = str(exc)[-600:]
            log(f"{NAME}: {server} did not start: {exc}")
            continue
        with handle:
            for model in (MODEL, LARGE):
                for mode, protocol, extra in MODES:
                    url = f"localhost:{handle.grpc_port}" if protocol == "grpc" else handle.url
                    label = f"{server}: {model}: {mode}"
                    log(f"{NAME}: {label}")
                    report.runs.append(
                        run_perf_analyzer(url, model, levels, label=label, protocol=protocol, extra=extra)
                    )
    report.notes |= ratios(report.runs)
    log(f"{NAME}: results in {save_report(report, 'system shared memory, identity Python model')}")
    return report


def ratios(runs: list[Run]) -> dict[str, float]:
    """Throughput ratios, keyed ``<kind>:<server>:<model>:<protocol>:<level>``.

    ``shm_over_plain``: with shared memory over the same server without it;
    ``this_over_peer``: this server over tritonserver, both in the same mode (``<protocol>`` names the
    mode: ``http``, ``http shm``, ...).
    """
    by_label = {run.label: run.throughput_by_level() for run in runs}
    notes: dict[str, float] = {}
    for model in (MODEL, LARGE):
        for server in (THIS, PEER):
            for protocol in ("http", "grpc"):
                plain = by_label.get(f"{server}: {model}: {protocol}", {})
                shared = by_label.get(f"{server}: {model}: {protocol} shm", {})
                for level, value in shared.items():
                    if plain.get(level):
                        key = f"shm_over_plain:{server}:{model}:{protocol}:{level:g}"
                        notes[key] = round(value / plain[level], 3)
        for mode, _protocol, _extra in MODES:
            this = by_label.get(f"{THIS}: {model}: {mode}", {})
            peer = by_label.get(f"{PEER}: {model}: {mode}", {})
            for level, value in this.items():
                if peer.get(level):
                    notes[f"this_over_peer:{model}:{mode}:{level:g}"] = round(value / peer[level], 3)
    return notes
