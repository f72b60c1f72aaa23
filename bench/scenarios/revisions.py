"""This server at two revisions, side by side: does a change cost request-path throughput?

The ``overhead`` scenario's model (``identity_py``) is served by the working tree and by a base
revision (``BENCH_BASE_REV``, a git revision; default ``HEAD~1``), checked out in a worktree under
``bench/.work/``. The two alternate for ``BENCH_ROUNDS`` rounds (default 2), each measured over HTTP
with perf_analyzer and this tool, over gRPC (``ModelInfer``) with perf_analyzer ``-i grpc``, and over
gRPC streams (``ModelStreamInfer``, ``--streaming``), after one tritonserver run for scale; the notes
hold head / base per round and tool (``grpc`` and ``stream`` for the gRPC sweeps), and their median,
and for the perf_analyzer sweeps the CPU milliseconds per request of each
role (replicas, HAProxy, the client, everything else), median over rounds, on each side.
"""

from __future__ import annotations

import os
import statistics
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.pa_runner import run_perf_analyzer
from bench.peers import PeerSetupError, ServerHandle, start_tritonserver
from bench.results import Report, Run
from bench.scenarios.common import (
    BENCH_MODELS,
    free_port,
    log,
    make_repository,
    measure,
    new_report,
    save_report,
    start_this_server,
    work_dir,
)

NAME = "revisions"
MODEL = "identity_py"
LEVELS = [1.0, 8, 32]
QUICK_LEVELS = [1.0, 32]
PEER = "tritonserver"
HEAD = "head"
TOOLS = ("perf_analyzer", "bench", "grpc", "stream")  # the label suffix of each sweep
PROJECT = Path(__file__).resolve().parents[2]


def base_worktree(revision: str, work: Path) -> tuple[str, Path]:
    """A clean checkout of ``revision`` (its full commit id, and the folder)."""
    commit = subprocess.run(
        ["git", "rev-parse", revision], cwd=PROJECT, check=True, capture_output=True, text=True
    ).stdout.strip()
    path = work / f"base-{commit[:12]}"
    if not path.exists():
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(path), commit],
            cwd=PROJECT,
            check=True,
            capture_output=True,
        )
    return commit, path


def _start_base(tree: Path, repo: Path, logs: Path) -> ServerHandle:
    """The base revision's server: its own packages first on the path of every process it starts."""
    return start_this_server(repo, free_port(), grpc_port=free_port(), log_path=logs / "base.log", tree=tree)


def run(quick: bool = False) -> Report:
    """Run the scenario and save it under ``bench/results/revisions/``."""
    work = work_dir(NAME)
    repo = make_repository(work / "repo", [(BENCH_MODELS / MODEL, MODEL, None)])
    commit, tree = base_worktree(os.environ.get("BENCH_BASE_REV", "HEAD~1"), work)
    base = f"base {commit[:7]}"
    levels = QUICK_LEVELS if quick else LEVELS
    rounds = int(os.environ.get("BENCH_ROUNDS", "1" if quick else "2"))
    report = new_report(NAME, model=MODEL, levels=levels)
    report.notes["base_commit"] = commit
    starts: list[tuple[str, Callable[[], ServerHandle]]] = [
        (
            PEER,
            lambda: start_tritonserver(repo, free_port(), free_port(), free_port(), log_path=work / "t.log"),
        )
    ]
    for n in range(1, rounds + 1):
        starts.append((f"{base} #{n}", lambda: _start_base(tree, repo, work)))
        starts.append(
            (
                f"{HEAD} #{n}",
                lambda: start_this_server(
                    repo, free_port(), grpc_port=free_port(), log_path=work / "head.log"
                ),
            )
        )
    for label, start in starts:
        log(f"{NAME}: starting {label}")
        try:
            handle = start()
        except PeerSetupError as exc:
            report.notes.setdefault("skipped", {})[label] = str(exc)[-600:]
            continue
        with handle:
            report.runs += measure(handle.url, MODEL, levels, label, tools=("perf_analyzer", "bench"))
            grpc_url = f"localhost:{handle.grpc_port}"
            report.runs.append(
                run_perf_analyzer(grpc_url, MODEL, levels, label=f"{label} (grpc)", protocol="grpc")
            )
            report.runs.append(
                run_perf_analyzer(
                    grpc_url, MODEL, levels, label=f"{label} (stream)", protocol="grpc", extra=["--streaming"]
                )
            )
    report.notes |= summarize(report.runs, base, rounds)
    log(f"{NAME}: results in {save_report(report, 'This server at two revisions, identity Python model')}")
    return report


def summarize(runs: list[Run], base: str, rounds: int) -> dict[str, Any]:
    """head / base throughput per round, tool and level, and the median over rounds."""
    out: dict[str, Any] = {}
    for tool in TOOLS:
        per_round: list[dict[str, float]] = []
        for n in range(1, rounds + 1):
            head = _by_level(runs, f"{HEAD} #{n}", tool)
            old = _by_level(runs, f"{base} #{n}", tool)
            per_round.append({f"{k:g}": head[k] / old[k] for k in sorted(head) if old.get(k)})
        out[f"head_over_base_{tool}"] = per_round
        levels = sorted({k for r in per_round for k in r}, key=float)
        out[f"head_over_base_{tool}_median"] = {
            k: statistics.median(r[k] for r in per_round if k in r) for k in levels
        }
        cpu = {side: _cpu_ms(runs, side, tool, rounds) for side in (HEAD, base)}
        if any(cpu.values()):
            out[f"cpu_ms_{tool}"] = {HEAD if side == HEAD else "base": v for side, v in cpu.items()}
    return out


def _cpu_ms(runs: list[Run], side: str, tool: str, rounds: int) -> dict[str, dict[str, float]]:
    """The median over rounds of each role's CPU milliseconds per request, by level (perf_analyzer
    runs record them)."""
    seen: dict[str, dict[str, list[float]]] = {}
    for n in range(1, rounds + 1):
        run = next((r for r in runs if r.label == f"{side} #{n} ({tool})"), None)
        for point in run.points if run is not None else ():
            for role, value in (point.cpu_ms or {}).items():
                seen.setdefault(f"{point.level:g}", {}).setdefault(role, []).append(value)
    return {level: {role: statistics.median(v) for role, v in roles.items()} for level, roles in seen.items()}


def _by_level(runs: list[Run], label: str, tool: str) -> dict[float, float]:
    run = next((r for r in runs if r.label == f"{label} ({tool})"), None)
    return {} if run is None else run.throughput_by_level()
