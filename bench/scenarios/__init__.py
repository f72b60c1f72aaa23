"""Scenarios: each one command (``python -m bench scenario <name>``) writing ``bench/results/<name>/``."""

from __future__ import annotations

import importlib
import sys

SCENARIOS = (
    "overhead",
    "batching",
    "limit",
    "ensemble",
    "agreement",
    "revisions",
    "grpc",
    "sequence",
    "cluster_scaling",
    "cluster_ensemble",
    "density",
    "shared_memory",
    "pooled",
)


def run_scenario(name: str, quick: bool = False) -> int:
    """Run the scenario called ``name``; returns a process exit code."""
    if name not in SCENARIOS:
        print(f"unknown scenario {name!r}; choose one of {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"bench.scenarios.{name}")
    report = module.run(quick=quick)
    return 1 if report.notes.get("skipped") and not report.runs else 0
