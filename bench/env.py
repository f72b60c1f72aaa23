"""The environment a benchmark ran in: machine, versions and the source commit."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
_PACKAGES = ("numpy", "ray", "onnxruntime", "torch", "tritonclient", "matplotlib")


def _git(*args: str) -> str:
    """Output of a git command in the repository, empty when git is unavailable."""
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


UNMEASURED = (":!bench/results", ":!docs", ":!*.md")
"""What a measurement does not depend on: saved results and the documentation, whose tables ``python -m
bench summary`` rewrites after each run (the README's, ``docs/measurements.md``'s)."""


def local_changes() -> bool:
    """Whether the repository's tracked files differ from its commit outside :data:`UNMEASURED`."""
    return bool(_git("status", "--porcelain", "--untracked-files=no", "--", ".", *UNMEASURED))


def environment(**extra: Any) -> dict[str, Any]:
    """CPU count, platform, Python and package versions, git commit (and whether it had local changes)."""
    return {
        "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "packages": {p: _version(p) for p in _PACKAGES},
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": local_changes(),
        **extra,
    }


def save_measurement(
    module: str, document: dict[str, Any], argv: list[str] | None = None, file: str = "results.json"
) -> Path:
    """Write ``document`` with the environment and the command line (``python -m bench.<module>`` and
    ``argv``, default this process's arguments) to ``bench/results/<module>/<file>``."""
    out = Path(__file__).resolve().parent / "results" / module / file
    out.parent.mkdir(parents=True, exist_ok=True)
    command = f"python -m bench.{module} " + " ".join(argv if argv is not None else sys.argv[1:])
    out.write_text(
        json.dumps({"environment": environment(command=command.strip()), **document}, indent=1) + "\n"
    )
    return out
