"""The registry the data plane reads: what each model's state is, and how a served one is reached.

:class:`Registry` holds the controller's entries (one per model name asked for or
listed) and answers ``deployments.protocol.dataplane.ModelRegistry``'s reads: a
served model through ``remote``, its description, readiness and the repository
index. The control modes (``deployments.control.controller``) change the entries;
nothing here does.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from deployments.control.listing import Listing, list_repositories, model_folders
from deployments.protocol.dataplane import ServedModel
from deployments.settings import ServerSettings
from repository_loader.errors import InvalidArgument, NoAvailableVersion, NotFound, ServerError
from repository_loader.model import ModelDescription, ModelState

logger = logging.getLogger(__name__)

MAX_NAME_LENGTH = 255  # a folder name on common file systems
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
UNLOADED = "unloaded"  # Triton's reason for a model unloaded on request
DUPLICATE = "model appears in two or more repositories"  # Triton's reason for a name in several


class Deployer(Protocol):
    def prepare(self, models: dict[str, ModelDescription]) -> None:
        """Plan resources for every model the repository holds (before any deploy)."""

    async def deploy(self, model: ModelDescription) -> None:
        """Bring the model's application up; raise a ``ServerError`` with the reason if it fails."""

    async def reload(self, old: ModelDescription, new: ModelDescription) -> None:
        """Move a serving model to ``new`` without a moment unserved; on failure ``old`` keeps serving."""

    async def delete(self, name: str) -> None: ...

    def needs_gpu(self, model: ModelDescription) -> bool:
        """Whether the model's replicas ask for GPUs: such models are deployed before the others at
        start, so that CPU-only replicas do not take the CPUs of the GPU nodes first."""

    async def running(self) -> dict[str, ModelDescription]:
        """Models whose applications run in the serving layer already (deployed before this controller
        started: the server application was restarted), each with the description its replicas serve;
        they are known to the deployer afterwards as if it had deployed them."""

    async def unserved(self) -> dict[str, str]:
        """Deployed models that have no running replica now (a lost node, replicas not yet placed
        again), each with the reason; they are UNAVAILABLE in the index until a replica runs."""

    async def unloaded(self) -> set[str]:
        """Models unloaded through the repository API (and not loaded since) by this server, as kept
        where a restart of the server application finds them: the restart does not load them again."""

    async def record_unloaded(self, name: str, unloaded: bool) -> None:
        """Keep (``unloaded``) or drop ``name`` from :meth:`unloaded`."""


def check_model_name(name: str) -> None:
    """Refuse a name no repository folder can have, before any work is done for it."""
    if not name or len(name) > MAX_NAME_LENGTH or not _NAME.fullmatch(name):
        shown = name if len(name) <= 64 else name[:64] + "..."
        raise InvalidArgument(
            f"invalid model name '{shown}': 1 to {MAX_NAME_LENGTH} letters, digits, '_', '-' or '.', "
            "not starting with '.' or '-'"
        )


def load_failed(name: str, reason: str) -> str:
    """Triton's answer to a load of a model of the repository that failed (its configuration or a
    version did not load)."""
    return f"load failed for model '{name}': {reason}"


def reason_of(exc: BaseException) -> str:
    """What a failure says, as the index and the logs show it."""
    return exc.message if isinstance(exc, ServerError) else f"{type(exc).__name__}: {exc}"


@dataclass
class ModelEntry:
    name: str
    state: ModelState = ModelState.UNAVAILABLE
    reason: str = ""
    model: ModelDescription | None = None
    requested: bool = False  # asked to be served (counts for readiness) until unloaded
    files: str = ""  # the digest of the model's files when it was last deployed (revision.files_digest)
    # served with a load's override: the repository's signature of the model at that load (None: served
    # from the repository), so that a later plain load finds whether the repository changed since
    override_of: Any = None

    def index_rows(self) -> list[dict[str, Any]]:
        versions = [str(v) for v in self.model.versions] if self.model else [""]
        rows = []
        for v in versions:
            row: dict[str, Any] = {"name": self.name, "state": self.state.value}
            if v:
                row["version"] = v
            if self.reason:
                row["reason"] = self.reason
            rows.append(row)
        return rows


RemoteFn = Callable[[ModelDescription], ServedModel]


@dataclass
class Registry:
    settings: ServerSettings
    deployer: Deployer
    remote: RemoteFn | None = None  # how a served model is reached (None: it is not)
    entries: dict[str, ModelEntry] = field(default_factory=dict)
    listing: Listing = field(default_factory=Listing)
    folders: set[str] = field(default_factory=set)  # model folders seen by the last index call
    # models whose configuration could not be read, and why: unknown, as in Triton (not in ``entries``)
    unread: dict[str, str] = field(default_factory=dict)
    started: bool = False
    # model -> replica -> (its load error or None, when it said so): what the replicas' pushes report
    replica_loads: dict[str, dict[str, tuple[str | None, float]]] = field(default_factory=dict)
    # with namespacing: every namespaced key seen in a listing -> the model's folder name
    key_folders: dict[str, str] = field(default_factory=dict)

    def folder_of(self, key: str) -> str:
        """The model name (its folder's) of ``key``: the key itself but for a namespaced copy."""
        return self.key_folders.get(key, key)

    def _listed(self, listing: Listing) -> Listing:
        self.key_folders.update(listing.folders)
        return listing

    def replica_loaded(self, name: str, replica: str, error: str | None) -> None:
        """A replica of ``name`` reports whether its model loaded (each push: when its statistics change,
        and at least every ``stats_heartbeat_s``)."""
        self.replica_loads.setdefault(name, {})[replica] = (error, time.monotonic())

    def failed_in_replicas(self, name: str) -> str | None:
        """Why ``name`` is not served although it was loaded: every replica that reported lately
        failed to load it (a replica restarted after its files changed or went away)."""
        recent = time.monotonic() - 3 * self.settings.stats_heartbeat_s
        reports = [r for r in self.replica_loads.get(name, {}).values() if r[1] >= recent]
        if not reports or any(error is None for error, _ in reports):
            return None
        return f"its replicas failed to load it again: {reports[-1][0]}"

    def require(self, name: str) -> ModelEntry:
        entry = self.entries.get(name)
        if entry is None and self.settings.model_namespacing:
            entry = self._resolve(name)
        if entry is None:
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        return entry

    def key_for(self, name: str) -> str:
        """The model a request for ``name`` reaches: ``name`` itself, or with namespacing the one known
        copy of a name in several repositories (ambiguity where several are known)."""
        if not self.settings.model_namespacing or name in self.entries:
            return name
        entry = self._resolve(name)
        return entry.name if entry is not None else name

    def _resolve(self, name: str) -> ModelEntry | None:
        """With namespacing, the model a plain name stands for: the one copy of the name that is known
        (its key names its repository); several are ambiguous, as in Triton."""
        known = [e for key, e in self.entries.items() if key != name and self.folder_of(key) == name]
        if len(known) > 1:
            raise InvalidArgument(
                f"There are {len(known)} identifiers of model '{name}' in global map, model namespace "
                "must be provided to resolve ambiguity."
            )
        return known[0] if known else None

    def unavailable(self, name: str) -> ServerError:
        """The error for a request that reached the server app for ``name``: it is not served. Triton's
        answer for a model it knows (asked for, loading, failed or unloaded) with no version ready; the
        reason stays in the repository index."""
        self.require(name)
        return NoAvailableVersion(f"Request for unknown model: '{name}' has no available versions")

    def get(self, name: str) -> ServedModel:
        """A served model (READY) through ``remote``; NotFound (NoAvailableVersion: known) otherwise."""
        entry = self.require(name)
        if entry.state != ModelState.READY or entry.model is None or self.remote is None:
            raise self.unavailable(name)
        return self.remote(entry.model)

    def describe(self, name: str) -> ModelDescription:
        entry = self.require(name)
        if entry.model is None:
            raise self.unavailable(name)
        return entry.model

    def served(self) -> list[str]:
        return [n for n, e in sorted(self.entries.items()) if e.state == ModelState.READY]

    def live(self) -> bool:
        return self.started

    def ready(self) -> bool:
        """Triton's readiness: started and, with ``strict_readiness``, every model asked for
        (at start or through the API, and not unloaded since) is READY."""
        if not self.started:
            return False
        if not self.settings.strict_readiness:
            return True
        return all(
            e.state == ModelState.READY and self.failed_in_replicas(e.name) is None
            for e in self.entries.values()
            if e.requested
        )

    async def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Every model of the repositories, read again at each call as Triton does (a folder added since
        the last load or poll shows by name); those never loaded by name only. A loaded model with no
        running replica now (:meth:`Deployer.unserved`) is UNAVAILABLE, with the reason."""
        present: set[str] | None = None
        try:
            present = self.folders = await asyncio.to_thread(self._present)
        except Exception as exc:  # an unreachable repository: list what was last seen
            logger.warning("repository index: cannot list the repositories: %s", reason_of(exc))
        rows = self.index_rows(present)
        try:
            unserved = await self.deployer.unserved()
        except Exception as exc:  # the cluster's state unknown: the index from what was loaded
            logger.warning("repository index: cannot read the replicas' state: %s", reason_of(exc))
            unserved = {}
        for row in rows:
            if row.get("state") != ModelState.READY.value:
                continue
            why = unserved.get(row["name"]) or self.failed_in_replicas(row["name"])
            if why is not None:
                row["state"], row["reason"] = ModelState.UNAVAILABLE.value, why
        if self.settings.model_namespacing:  # a model of several repositories is listed once in each
            for row in rows:
                row["name"] = self.folder_of(row["name"])
        return [r for r in rows if r.get("state") == "READY"] if ready_only else rows

    def _present(self) -> set[str]:
        """The models of the repositories now: their folders' names, with namespacing their keys."""
        if self.settings.model_namespacing:
            return set(self._listed(list_repositories(self.settings.model_repositories, True)).where)
        return model_folders(self.settings.model_repositories)

    def index_rows(self, present: set[str] | None = None) -> list[dict[str, Any]]:
        """The index from what is known now: the model folders ``present`` in the repositories as just
        read, else those seen by the last load, poll or index call."""
        if present is None:
            present = {*self.listing.where, *self.listing.duplicates, *self.folders}
        # a model unloaded because its folder left the repository (POLL) is known, but not listed
        kept = {n for n, e in self.entries.items() if n in present or e.reason != UNLOADED}
        rows: list[dict[str, Any]] = []
        for name in sorted(present | kept):
            entry = self.entries.get(name)
            if entry is not None:
                rows.extend(entry.index_rows())
            else:  # never loaded; where its configuration could not be read, why
                rows.append(
                    {"name": name, "reason": self.unread[name]} if name in self.unread else {"name": name}
                )
        return rows
