"""What the model repositories hold, read without loading any model.

:func:`list_repositories` finds where each model name lives (a name in two
repositories is a duplicate, an error for that name) and keeps each repository's
cheap signatures (``repository_snapshot``), which POLL compares between two
listings. :func:`model_folders` is the index's view: every model folder by name.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

Snapshot = dict[str, dict[str, str]]  # model -> entry -> signature


@dataclass
class Listing:
    """Where each model name lives, across every repository."""

    where: dict[str, str] = field(default_factory=dict)  # name -> repository
    duplicates: dict[str, list[str]] = field(default_factory=dict)
    snapshots: dict[str, Snapshot] = field(default_factory=dict)  # repository -> snapshot

    def signature(self, name: str) -> Any:
        repo = self.where.get(name)
        return (repo, self.snapshots[repo].get(name)) if repo is not None else None


def list_repositories(repositories: Iterable[str]) -> Listing:
    """Every repository's models (names starting with '.' left out), with their signatures."""
    from repository_loader.storage import repository_snapshot

    listing = Listing()
    seen: dict[str, list[str]] = {}
    for repo in repositories:
        snap = {n: s for n, s in repository_snapshot(repo).items() if not n.startswith(".")}
        listing.snapshots[repo] = snap
        for name in snap:
            seen.setdefault(name, []).append(repo)
    for name, repos in seen.items():
        if len(repos) == 1:
            listing.where[name] = repos[0]
        else:
            listing.duplicates[name] = repos
            logger.error("model '%s' appears in more than one repository: %s", name, repos)
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
