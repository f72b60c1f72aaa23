"""The ``triton-serve`` command.

``triton-serve validate <repo>`` loads a model repository and prints, per model
and version, OK with its deployment plan or every error found; the exit status
is non-zero when any model fails. Other subcommands (``serve``) register
themselves through ``add_parser(subparsers)`` in their own modules.
"""

from __future__ import annotations

import argparse
import glob
import importlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from repository_loader.errors import ServerError
from repository_loader.plan import ClusterResources, DeploymentPlan, plan_deployments
from repository_loader.repository import RepositoryState, load_repository

EXIT_OK = 0
EXIT_MODEL_ERRORS = 1
EXIT_USAGE = 2
# Modules that add subcommands; each exposes add_parser(subparsers).
EXTRA_COMMANDS = ("deployments.cli_serve",)


def detected_gpus() -> int:
    """GPUs on this machine, counted from the NVIDIA device files (0 where there are none)."""
    return len(glob.glob("/dev/nvidia[0-9]*"))


def add_repository_options(parser: argparse.ArgumentParser) -> None:
    """Options every command that reads a repository shares (Triton's names)."""
    parser.add_argument("repository", help="model repository: a folder, s3://bucket/path or gs://bucket/path")
    parser.add_argument(
        "--model-config-name", default=None, help="use configs/<NAME>.pbtxt where a model has it"
    )
    parser.add_argument(
        "--disable-auto-complete-config",
        action="store_true",
        help="do not complete configs from model files or auto_complete_config()",
    )
    parser.add_argument("--cpus", type=float, default=float(os.cpu_count() or 1), help="CPUs of the cluster")
    parser.add_argument(
        "--gpus", type=int, default=None, help="GPUs of the cluster (default: this machine's)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="triton-serve", description="A Triton-compatible server on Ray Serve."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    validate = subparsers.add_parser(
        "validate", help="check a model repository and print the deployment plan"
    )
    add_repository_options(validate)
    validate.add_argument("--json", action="store_true", help="print the result as JSON")
    validate.set_defaults(func=run_validate)
    for module_name in EXTRA_COMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``triton-serve``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ServerError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


def run_validate(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """``validate``: load, plan, print; non-zero when a model fails or cannot be placed."""
    out = out or sys.stdout
    state = load_repository(
        args.repository,
        config_name=args.model_config_name,
        auto_complete=not args.disable_auto_complete_config,
    )
    gpus = detected_gpus() if args.gpus is None else args.gpus
    plan = plan_deployments(state.models, ClusterResources(num_cpus=args.cpus, num_gpus=gpus))
    if args.json:
        json.dump(validation_report(state, plan), out, indent=2)
        out.write("\n")
    else:
        out.write(format_report(state, plan))
    return EXIT_MODEL_ERRORS if state.failed or plan.problems else EXIT_OK


def validation_report(state: RepositoryState, plan: DeploymentPlan) -> dict[str, Any]:
    """The JSON form of a validation: per model its state, versions, plan entries or errors."""
    models: dict[str, Any] = {}
    for name in sorted({*state.models, *state.failed}):
        if name in state.failed:
            models[name] = {"state": "UNAVAILABLE", "errors": state.failed[name]}
            continue
        problems = list(plan.problems.get(name, ()))
        models[name] = {
            "state": "UNAVAILABLE" if problems else "READY",
            "versions": list(state.models[name].versions),
            "plan": [entry.to_dict() for entry in plan.for_model(name)],
            "errors": problems,
        }
    return {
        "repository": state.root,
        "ok": not state.failed and not plan.problems,
        "models": models,
        "resources": plan.to_dict()["resources"],
        "total_cpus": plan.total_cpus,
        "total_gpus": plan.total_gpus,
        "warnings": state.warnings,
    }


def format_report(state: RepositoryState, plan: DeploymentPlan) -> str:
    """The human-readable form of a validation."""
    res = plan.resources
    lines = [f"repository {state.root}  (cluster: {res.num_cpus:g} CPUs, {res.num_gpus} GPUs)"]
    for warning in state.warnings:
        lines.append(f"warning: {warning}")
    failed = 0
    for name in sorted({*state.models, *state.failed}):
        errors = state.failed.get(name) or list(plan.problems.get(name, ()))
        if errors:
            failed += 1
            lines.append(f"FAIL  {name}")
            lines.extend(f"      - {error}" for error in errors)
            continue
        model = state.models[name]
        for version in model.versions:
            lines.append(
                f"OK    {name}  version {version}  [{model.kind}, max_batch_size {model.max_batch_size}]"
            )
            lines.extend(_entry_lines(plan, name, version))
    ready = len(state.models) - sum(1 for name in state.models if name in plan.problems)
    lines.append(
        f"{ready} model(s) OK, {failed} failed; plan uses {plan.total_cpus:g} CPUs, {plan.total_gpus:g} GPUs"
    )
    return "\n".join(lines) + "\n"


def _entry_lines(plan: DeploymentPlan, name: str, version: int) -> list[str]:
    lines = []
    for entry in plan.for_model(name):
        if entry.version != version:
            continue
        gpus = f" on GPU(s) {sorted(set(entry.replica_gpu_ids))}" if entry.replica_gpu_ids else ""
        batching = (
            "dynamic batching"
            if entry.batching.dynamic
            else "sequence batching"
            if entry.batching.sequence
            else "no batching"
        )
        lines.append(
            f"      {entry.group or 'ensemble'}: {entry.kind} x{entry.num_replicas}{gpus}, "
            f"{entry.resources.num_cpus:g} CPU + {entry.resources.num_gpus:g} GPU per replica, "
            f"{batching}, route {entry.route_prefix}, max_ongoing_requests {entry.max_ongoing_requests}"
        )
    return lines


if __name__ == "__main__":
    sys.exit(main())
