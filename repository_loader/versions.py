"""Version folders of a model, and the versions its ``version_policy`` selects."""

from __future__ import annotations

from collections.abc import Callable

from repository_loader.findings import Findings
from repository_loader.proto import model_config_pb2 as pb
from repository_loader.storage import Storage

# Folders a model keeps beside its versions; not worth a warning.
KNOWN_FOLDERS = frozenset({"configs", "warmup", "initial_state"})


def parse_version(name: str) -> int | None:
    """The version a folder name stands for: digits only, no leading zero."""
    if not name.isdigit() or not name.isascii() or name.startswith("0"):
        return None
    return int(name)


def list_versions(storage: Storage, model_dir: str, model: str, warn: Callable[[str], None]) -> list[int]:
    """Version numbers present under ``model_dir``, ascending; other folders are ignored with a warning."""
    versions = []
    for entry in storage.list_dir(model_dir):
        if not storage.is_dir(storage.join(model_dir, entry)):
            continue
        version = parse_version(entry)
        if version is not None:
            versions.append(version)
        elif entry not in KNOWN_FOLDERS and not entry.startswith((".", "__")):
            warn(
                f"model '{model}': ignoring folder '{entry}': a version folder is a number without a leading 0"
            )
    return sorted(versions)


def select_versions(policy: pb.ModelVersionPolicy, available: list[int], findings: Findings) -> list[int]:
    """The versions to serve: ``latest`` (default: the newest one), ``all`` or ``specific``."""
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return list(available)
    if choice == "specific":
        # Triton serves the listed versions that have a folder (a missing one is left out with a
        # warning), and refuses the model only where none has
        wanted = sorted(set(policy.specific.versions))
        missing = [v for v in wanted if v not in available]
        selected = [v for v in wanted if v in available]
        if missing and available:
            where = "version_policy.specific.versions"
            if selected:
                findings.warn(where, f"version(s) {missing} not found: serving {selected}")
            else:
                findings.add(
                    where,
                    f"at least one version must be available under the version policy of model "
                    f"'{findings.model}' (listed {wanted}, available {available})",
                )
        return selected
    count = policy.latest.num_versions if choice == "latest" else 1
    return available[-count:] if count > 0 else []
