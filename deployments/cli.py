"""The ``triton-serve`` command.

``triton-serve validate <repo>`` loads a model repository and prints, per model
and version, OK with its deployment plan or every error found, and a warning for
each config field the server accepts without acting on it; for an
ensemble, also its placement (which steps its replica hosts in process and how
each tensor travels), bad placement parameters failing that ensemble alone. The
exit status is non-zero when any model fails. ``--print-config`` prints instead each
model's completed config as ``GET /v2/models/<m>/config`` returns it. ``serve`` and ``ray-start``
come from :mod:`deployments.serve.cli`. ``python -m deployments`` runs the same command.

The command sits above every layer it reports on (the repository, ensembles' placement, the
server), so that none of them imports it.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple, TextIO

from deployments.serve import cli as serve_cli
from ensembles.graph import build_graph
from ensembles.placement import EnsemblePlacement, choose_placement, describe_placement
from repository_loader.errors import ServerError
from repository_loader.model import ModelDescription
from repository_loader.plan import ClusterResources, DeploymentPlan, plan_deployments
from repository_loader.platforms import DEFAULT_BACKEND_DIRECTORY
from repository_loader.repository import RepositoryState, load_repository

EXIT_OK = 0
EXIT_MODEL_ERRORS = 1
EXIT_USAGE = 2


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
    parser.add_argument(
        "--backend-directory",
        default=DEFAULT_BACKEND_DIRECTORY,
        help="where a Python-based backend's <name>/model.py is found (default %(default)s)",
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
    validate.add_argument(
        "--print-config",
        action="store_true",
        help="print each model's completed config as GET /v2/models/<m>/config returns it (JSON, "
        "keyed by model name); warnings and errors go to stderr",
    )
    validate.set_defaults(func=run_validate)
    serve_cli.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``triton-serve``; returns the exit status."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["ray-start"]:  # every word after it is ray start's, options first too (--head ...)
        return serve_cli.ray_start(argparse.Namespace(ray_args=words[1:]))
    parser = build_parser()
    args = parser.parse_args(words)
    try:
        return int(args.func(args))
    except ServerError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


def _kind_label(model: ModelDescription) -> str:
    """The backend that runs ``model``, naming a Python-based backend's file."""
    if model.python_runtime:
        return f"{model.backend}: Python-based backend {model.python_runtime}"
    return model.kind


def run_validate(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """``validate``: load, plan, place ensembles, print; non-zero when a model fails or cannot be placed."""
    out = out or sys.stdout
    state = load_repository(
        args.repository,
        config_name=args.model_config_name,
        auto_complete=not args.disable_auto_complete_config,
        backend_directory=args.backend_directory,
    )
    gpus = detected_gpus() if args.gpus is None else args.gpus
    plan = plan_deployments(state.models, ClusterResources(num_cpus=args.cpus, num_gpus=gpus))
    placements = place_ensembles(state, plan)
    if getattr(args, "print_config", False):
        print_configs(state, plan, placements, out)
    elif args.json:
        json.dump(validation_report(state, plan, placements), out, indent=2)
        out.write("\n")
    else:
        out.write(format_report(state, plan, placements))
    return EXIT_MODEL_ERRORS if state.failed or plan.problems or placements.errors else EXIT_OK


def print_configs(
    state: RepositoryState,
    plan: DeploymentPlan,
    placements: Placements,
    out: TextIO,
    err: TextIO | None = None,
) -> None:
    """Each loaded model's completed config, the document the server's ``/config`` endpoint returns."""
    err = err or sys.stderr
    configs = {name: dict(model.config_json) for name, model in sorted(state.models.items())}
    json.dump(configs, out, indent=2)
    out.write("\n")
    for warning in state.warnings:
        err.write(f"warning: {warning}\n")
    for name in sorted({*state.models, *state.failed}):
        for error in _errors(state, plan, placements, name):
            err.write(f"error: {error}\n")


class Placements(NamedTuple):
    """The placement of every ensemble that loaded and was planned, and the errors of those it fails."""

    placed: dict[str, EnsemblePlacement]
    errors: dict[str, list[str]]


def place_ensembles(state: RepositoryState, plan: DeploymentPlan) -> Placements:
    """Place each ensemble as its replica will: a GPU group is hosted only where the plan gives it a GPU."""
    result = Placements({}, {})
    for name, model in sorted(state.models.items()):
        if not model.is_ensemble or name in plan.problems or name in plan.pooled:
            continue  # a pooled ensemble places nothing: its host runs its pooled steps in process
        gpu = any(entry.resources.num_gpus > 0 for entry in plan.for_model(name))
        try:
            result.placed[name] = choose_placement(build_graph(model, state.models), gpu_available=gpu)
        except ServerError as exc:
            result.errors[name] = [exc.message]
    return result


def _errors(state: RepositoryState, plan: DeploymentPlan, placements: Placements, name: str) -> list[str]:
    return state.failed.get(name) or [*plan.problems.get(name, ()), *placements.errors.get(name, ())]


def validation_report(
    state: RepositoryState, plan: DeploymentPlan, placements: Placements | None = None
) -> dict[str, Any]:
    """The JSON form of a validation: per model its state, versions, plan entries (and placement) or errors."""
    placements = placements or place_ensembles(state, plan)
    models: dict[str, Any] = {}
    for name in sorted({*state.models, *state.failed}):
        if name in state.failed:
            models[name] = {"state": "UNAVAILABLE", "errors": state.failed[name]}
            continue
        problems = _errors(state, plan, placements, name)
        models[name] = {
            "state": "UNAVAILABLE" if problems else "READY",
            "versions": list(state.models[name].versions),
            "plan": [entry.to_dict() for entry in plan.for_model(name)],
            "errors": problems,
        }
        if name in placements.placed:
            models[name]["placement"] = placements.placed[name].to_dict()
    return {
        "repository": state.root,
        "ok": not state.failed and not plan.problems and not placements.errors,
        "models": models,
        "resources": plan.to_dict()["resources"],
        "total_cpus": plan.total_cpus,
        "total_gpus": plan.total_gpus,
        "warnings": state.warnings,
    }


def format_report(state: RepositoryState, plan: DeploymentPlan, placements: Placements | None = None) -> str:
    """The human-readable form of a validation."""
    placements = placements or place_ensembles(state, plan)
    res = plan.resources
    lines = [f"repository {state.root}  (cluster: {res.num_cpus:g} CPUs, {res.num_gpus} GPUs)"]
    for warning in state.warnings:
        lines.append(f"warning: {warning}")
    failed = 0
    for name in sorted({*state.models, *state.failed}):
        errors = _errors(state, plan, placements, name)
        if errors:
            failed += 1
            lines.append(f"FAIL  {name}")
            lines.extend(f"      - {error}" for error in errors)
            continue
        model = state.models[name]
        for version in model.versions:
            lines.append(
                f"OK    {name}  version {version}  [{_kind_label(model)}, max_batch_size {model.max_batch_size}]"
            )
            lines.extend(_entry_lines(plan, name, version))
        if name in placements.placed:
            lines.extend(f"      {line}" for line in describe_placement(placements.placed[name]))
    ready = sum(1 for name in state.models if name not in plan.problems and name not in placements.errors)
    lines.append(
        f"{ready} model(s) OK, {failed} failed; plan uses {plan.total_cpus:g} CPUs, {plan.total_gpus:g} GPUs"
    )
    return "\n".join(lines) + "\n"


def _entry_lines(plan: DeploymentPlan, name: str, version: int) -> list[str]:
    if name in plan.pooled:
        return ["      pooled: served by the model hosts, loaded on its first request (docs/hosts.md)"]
    lines = []
    for entry in plan.for_model(name):
        if version not in entry.versions:
            continue
        gpus = f" on GPU(s) {sorted(set(entry.replica_gpu_ids))}" if entry.replica_gpu_ids else ""
        batching = (
            "dynamic batching"
            if entry.batching.dynamic
            else "sequence batching"
            if entry.batching.sequence
            else "no batching"
        )
        ranks = ""
        if entry.passive:  # Triton's passive group: loaded, never scheduled
            ranks = " (passive: loaded, takes no requests)"
        elif entry.num_replicas != entry.model_replicas:  # one of several instance groups
            last = entry.rank_offset + entry.num_replicas - 1
            ranks = f" (ranks {entry.rank_offset}-{last} of the model's {entry.model_replicas})"
        lines.append(
            f"      {entry.group or 'ensemble'}: {entry.kind} x{entry.num_replicas}{gpus}{ranks}, "
            f"{entry.resources.num_cpus:g} CPU + {entry.resources.num_gpus:g} GPU per replica, "
            f"{batching}, route {entry.route_prefix}, max_ongoing_requests {entry.max_ongoing_requests}"
        )
    return lines


if __name__ == "__main__":
    sys.exit(main())
