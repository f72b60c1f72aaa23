"""What a model's replicas run, as one string: the Serve ``version`` of its deployments.

Serve keeps a replica whose deployment keeps its version (and resources) and only
adds or removes replicas when ``num_replicas`` changes; a new version replaces
every replica. So the version holds what a running replica was built from and
would not follow by itself: the model's description without the instance counts,
the files of its folder (their names, sizes and modification times, as Triton
decides a model changed), and the replica's constructor arguments that are not
per count. A count-only change (``instance_group`` counts, same files) keeps the
version, and Serve scales the deployment in place (docs/compatibility.md, Model
updates).

A stateful model's replicas hold their rank among the model's replicas (docs/sequence.md); with one
instance group they follow a count change (its new world size, and the rank Serve may renumber), so
it scales in place too. With several groups each group's ranks start after the earlier groups' counts,
so its version includes the counts: a count change redeploys it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any

from repository_loader.model import ModelDescription

# the model's config files: their content is the description (the test of a count change rewrites it)
_CONFIG_FILES = frozenset({"config.pbtxt"})
_CONFIG_FOLDERS = frozenset({"configs"})
_SKIPPED_FOLDERS = frozenset({"__pycache__"})


def files_digest(folder: Path, without_versions: bool = False) -> str:
    """The names, sizes and modification times of the files below ``folder`` (links followed;
    the config files and bytecode caches left out), as a digest; "" for a folder that is not there.
    ``without_versions``: the numeric folders at its top (a model's versions) left out too."""
    if not folder.is_dir():
        return ""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(folder, followlinks=True):
        relative = Path(root).relative_to(folder)
        top = relative == Path(".")
        dirs[:] = sorted(
            d
            for d in dirs
            if d not in _SKIPPED_FOLDERS
            and not (top and d in _CONFIG_FOLDERS)
            and not (top and without_versions and d.isdigit())
        )
        for name in sorted(files):
            if relative == Path(".") and name in _CONFIG_FILES:
                continue
            try:
                stat = os.stat(os.path.join(root, name))
            except OSError:  # a dangling link, or removed meanwhile
                continue
            digest.update(f"{relative / name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def version_signatures(model: ModelDescription) -> dict[int, str]:
    """For each version ``model`` selects, a digest of what loading it reads from the model's folder:
    its own version folder and every file of the model's folder outside the version folders (shared
    code, a dependency), each by name, size and modification time as :func:`files_digest` takes them.
    A reload keeps a loaded version whose signature did not change (as Triton reloads only the
    versions whose files changed, and every version when a file beside them did)."""
    shared = files_digest(model.path, without_versions=True)
    return {
        version: hashlib.sha256(f"{shared}\0{files_digest(model.version_path(version))}".encode()).hexdigest()
        for version in model.versions
    }


def same_but_versions(a: ModelDescription, b: ModelDescription) -> bool:
    """Whether ``a`` and ``b`` describe the model alike but for which versions they select (and the
    instance counts, which scale the replicas apart from any load): a version loaded for ``a`` serves
    ``b`` as it is."""
    first, second = uncounted(a), uncounted(b)
    first.pop("versions")
    second.pop("versions")
    return first == second


def uncounted(model: ModelDescription) -> dict[str, Any]:
    """The fields of ``model`` that its replicas are built from, without the instance counts and
    without where the model was read from (a load with a config override reads it from a folder of
    links to the same files)."""
    fields = {f.name: getattr(model, f.name) for f in dataclasses.fields(model) if f.compare}
    fields.pop("path")
    fields["instance_groups"] = tuple(dataclasses.replace(g, count=0) for g in model.instance_groups)
    return fields


def stateful(model: ModelDescription) -> bool:
    """Whether the model's replicas are ranked among its replicas (a sequence model's owners)."""
    sequence = model.sequence_batching
    return sequence is not None and not sequence.iterative


def code_version(model: ModelDescription, files: str, built_with: Mapping[str, Any]) -> str:
    """The Serve version of one deployment of ``model``: its uncounted description, the digest of its
    ``files`` (:func:`files_digest`), and ``built_with``, the replica's other constructor arguments
    that hold for every count (the kind, the server's settings, an ensemble's composing models)."""
    described = uncounted(model)
    if stateful(model) and len(model.instance_groups) > 1:
        described["instance_groups"] = model.instance_groups
    parts = {"model": described, "files": files, "built_with": dict(built_with)}
    text = json.dumps(canonical(parts), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def canonical(value: Any) -> Any:
    """``value`` as JSON values that are the same in every process (sets sorted, mappings as objects,
    dataclasses by their compared fields, paths and enums as strings)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: canonical(getattr(value, f.name)) for f in dataclasses.fields(value) if f.compare}
    if isinstance(value, Enum):
        return canonical(value.value)
    if isinstance(value, Mapping):
        return {str(k): canonical(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted((canonical(v) for v in value), key=repr)
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
