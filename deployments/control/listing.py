"""What the model repositories hold, read without loading any model.

:func:`list_repositories` finds where each model lives and keeps each repository's
cheap signatures (``repository_snapshot``), which POLL compares between two
listings. A model is known by its key: its folder's name, unless that name is in
two repositories. Then, as in Triton, the name is an error for every copy, or,
with model namespacing, each copy is a model of its own whose key names its
repository (:func:`namespaced_key`), and the plain name is ambiguous.
:func:`model_folders` is the index's view: every model folder by name.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

Snapshot = dict[str, dict[str, str]]  # model -> entry -> signature
NAMESPACE_MARK = "@"  # between a model's name and its repository's namespace in a namespaced key


def namespaced_key(name: str, namespace: str) -> str:
    """The key of the copy of ``name`` in the repository of ``namespace`` (:func:`namespaces`)."""
    return f"{name}{NAMESPACE_MARK}{namespace}"


def namespaces(repositories: Iterable[str]) -> dict[str, str]:
    """Each repository's namespace in keys: the last part of its path or URL, made unique by its
    position where two repositories end alike."""
    repos = list(repositories)
    tails = [_tail(r) for r in repos]
    return {
        repo: tail if tails.count(tail) == 1 else f"{tail}-{i}"
        for i, (repo, tail) in enumerate(zip(repos, tails, strict=True))
    }


def _tail(repository: str) -> str:
    tail = repository.rstrip("/").rsplit("/", 1)[-1]
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in tail) or "repository"


@dataclass
class Listing:
    """Where each model lives, across every repository, by key."""

    where: dict[str, str] = field(default_factory=dict)  # key -> repository
    # a name in two or more repositories: its repositories (without namespacing: an error for the name)
    duplicates: dict[str, list[str]] = field(default_factory=dict)
    # with namespacing: a name in two or more repositories -> the keys of its copies
    ambiguous: dict[str, list[str]] = field(default_factory=dict)
    snapshots: dict[str, Snapshot] = field(default_factory=dict)  # repository -> snapshot
    namespaces: dict[str, str] = field(default_factory=dict)  # repository -> namespace (namespacing only)
    folders: dict[str, str] = field(default_factory=dict)  # a namespaced key -> the model's folder name

    def folder_of(self, key: str) -> str:
        """The folder (the model's name) of ``key``."""
        return self.folders.get(key, key)

    def signature(self, key: str) -> Any:
        repo = self.where.get(key)
        return (repo, self.snapshots[repo].get(self.folder_of(key))) if repo is not None else None

    def key_of(self, name: str, repository: str) -> str | None:
        """The key of ``name`` in ``repository`` (None where it has no such model)."""
        if name in self.ambiguous:
            key = namespaced_key(name, self.namespaces[repository])
            return key if self.where.get(key) == repository else None
        return name if self.where.get(name) == repository else None

    def keys_of(self, name: str) -> list[str]:
        """Every key of the model ``name``: one, several (namespacing) or none."""
        if name in self.ambiguous:
            return list(self.ambiguous[name])
        return [name] if name in self.where else []


def list_repositories(repositories: Iterable[str], namespacing: bool = False) -> Listing:
    """Every repository's models (names starting with '.' left out), with their signatures."""
    from repository_loader.storage import repository_snapshot

    repos = list(repositories)
    listing = Listing(namespaces=namespaces(repos) if namespacing else {})
    seen: dict[str, list[str]] = {}
    for repo in repos:
        snap = {n: s for n, s in repository_snapshot(repo).items() if not n.startswith(".")}
        listing.snapshots[repo] = snap
        for name in snap:
            seen.setdefault(name, []).append(repo)
    for name, found in seen.items():
        if len(found) == 1:
            listing.where[name] = found[0]
        elif namespacing:
            keys = [namespaced_key(name, listing.namespaces[repo]) for repo in found]
            listing.ambiguous[name] = keys
            listing.where.update(zip(keys, found, strict=True))
            listing.folders.update(dict.fromkeys(keys, name))
        else:
            listing.duplicates[name] = found
            logger.error("model '%s' appears in more than one repository: %s", name, found)
    return listing


def model_folders(repositories: Iterable[str]) -> set[str]:
    """The names of every repository's model folders (those starting with '.' left out)."""
    from repository_loader.storage import open_storage

    found: set[str] = set()
    for repo in repositories:
        storage, root = open_storage(repo)
        found.update(
            n
            for n in storage.list_dir(root)
            if not n.startswith(".") and storage.is_dir(storage.join(root, n))
        )
    return found


def local_model_folder(repository: str, name: str) -> Path:
    """A model's folder on this machine (a remote repository's copied here first)."""
    from repository_loader.storage import open_storage

    storage, root = open_storage(repository)
    return storage.localize(storage.join(root, name))
