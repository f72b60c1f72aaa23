"""``python -m tools.triton_qa --triton-server <checkout> --suites L0_http L0_grpc ...``."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

# importing these modules registers their suites
from tools.triton_qa import (  # noqa: F401
    batcher,
    client_timeout,
    decoupled,
    dyna_sequence,
    grpc_state_cleanup,
    implicit_state,
    infer,
    infer_variable,
    infer_zero,
    input_validation,
    iterative_sequence,
    lifecycle,
    log_settings,
    metrics,
    model_namespacing,
    model_queue,
    model_update,
    nan_inf,
    optional_input,
    parameters,
    request_cancellation,
    response_cache,
    sequence,
    sequence_stress,
    server_status,
    shared_memory,
    simple_ensemble,
    string_io,
    trace,
)
from tools.triton_qa.report import RESULTS_DIR, RunRecord, git_commit, load_reference, write_results
from tools.triton_qa.runner import COMMON_TRITON_ARGS, REFERENCE, THIS, Workspace, run_both
from tools.triton_qa.suites import SUITES, select

SERVER_CHOICES = {"both": (REFERENCE, THIS), "tritonserver": (REFERENCE,), "this": (THIS,)}


def triton_ref(checkout: Path) -> str:
    """Which Triton version the checkout is: its ``TRITON_VERSION`` file or ``git describe``."""
    version_file = checkout / "TRITON_VERSION"
    if version_file.exists():
        return version_file.read_text().strip()
    out = subprocess.run(
        ["git", "-C", str(checkout), "describe", "--tags", "--always"], capture_output=True, text=True
    )
    return out.stdout.strip() or "unknown (expected v2.51.0)"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tools.triton_qa", description=__doc__)
    parser.add_argument(
        "--triton-server", type=Path, help="checkout of triton-inference-server/server (v2.51.0)"
    )
    parser.add_argument(
        "--suites", nargs="+", default=["L0_http"], help=f"any of {', '.join(SUITES)}, or all"
    )
    parser.add_argument("--runs", nargs="*", default=[], help="only the runs with these labels")
    parser.add_argument("--tests", nargs="*", default=[], help="only these tests of per-test-server runs")
    parser.add_argument("--servers", choices=sorted(SERVER_CHOICES), default="both")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/triton-qa-work"))
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument(
        "--reference-from",
        type=Path,
        nargs="*",
        default=[],
        help="with --servers this: tritonserver's column from these earlier results.json files",
    )
    parser.add_argument("--list", action="store_true", help="list the suites and their runs, then exit")
    return parser.parse_args(argv)


def list_suites() -> None:
    for suite in SUITES.values():
        print(suite.name)
        for run in suite.runs:
            print(f"  {run.label:<40} {run.test_file}  ({len(run.models)} models)")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        list_suites()
        return 0
    if args.triton_server is None or not (args.triton_server / "qa" / "common" / "test_util.py").exists():
        print("error: --triton-server must name a checkout of Triton's server repository", file=sys.stderr)
        return 2
    try:
        suites = select(args.suites)
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    checkout = args.triton_server.resolve()
    ws = Workspace(checkout, args.work_dir.resolve())
    ws.prepare()
    started = time.monotonic()
    records: list[RunRecord] = []
    cannot_run = [{"suite": s.name, "what": what, "why": why} for s in suites for what, why in s.cannot_run]
    cannot_run += [
        {"suite": s.name, "what": f"{run.test_file}: {test}", "why": why}
        for s in suites
        for run in s.runs
        for test, why in run.not_here
    ]
    reference = load_reference(args.reference_from)
    meta: dict[str, Any] = {
        "command": "python -m tools.triton_qa " + shlex.join(sys.argv[1:] if argv is None else list(argv)),
        "commit": git_commit(),
        "triton_checkout": str(checkout),
        "triton_ref": triton_ref(checkout),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "common_server_args": list(COMMON_TRITON_ARGS),
    }
    for suite in suites:
        for run in suite.runs:
            if args.runs and run.label not in args.runs:
                continue
            results, skipped = run_both(ws, suite, run, SERVER_CHOICES[args.servers], args.tests)
            if REFERENCE not in results and (suite.name, run.label) in reference:
                earlier, source = reference[(suite.name, run.label)]
                results = {REFERENCE: earlier, **results}
                used = meta.setdefault("reference_from", [])  # the files that gave a run, in first use
                if source not in used:
                    used.append(source)
            records.append(RunRecord(suite.name, run.label, run.test_file, results, skipped))
            meta["seconds"] = time.monotonic() - started
            write_results(records, meta, cannot_run, args.out)  # after each run: nothing is lost
    meta["seconds"] = time.monotonic() - started
    out = write_results(records, meta, cannot_run, args.out)
    print(f"wrote {out / 'README.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
