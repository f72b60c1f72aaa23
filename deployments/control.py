"""Model control (NONE / EXPLICIT / POLL) and the repository index, independent of Ray.

The :class:`ModelController` is the server's model registry
(``deployments.protocol.dataplane.ModelRegistry``) and does what Triton's model
repository manager does:

* at start, it reads every repository (a model name found in two of them is an
  error for that name) and loads what the control mode says: everything (NONE,
  POLL) or the ``load_model`` names (EXPLICIT, ``*`` = all);
* in POLL mode it compares a cheap listing of the repositories
  (``repository_snapshot``) every ``repository_poll_secs`` and loads, unloads or
  reloads exactly the models that changed;
* in EXPLICIT mode it answers the repository API: load (with Triton's
  ``config`` override and ``file:<version>/<name>`` contents), unload (with
  ``unload_dependents``); an ensemble's composing models are loaded with it.

A :class:`Deployer` brings a model's application up, swaps a serving model to a new
description (the new one ready, warmup included, before it answers; the old one kept
when the new one fails), or takes it down; one model's failure never touches the others.
A served model is reached through ``remote``; any other raises NotFound or Unavailable.
Errors name models and repository-relative files, never a server path.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from deployments.protocol.dataplane import ServedModel
from deployments.settings import ServerSettings
from repository_loader.errors import InvalidArgument, NotFound, ServerError, Unavailable
from repository_loader.model import ModelDescription, ModelState

logger = logging.getLogger(__name__)

MAX_NAME_LENGTH = 255  # a folder name on common file systems
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
_FILE_KEY = re.compile(r"file:([0-9]+/[A-Za-z0-9_.\-]+(?:/[A-Za-z0-9_.\-]+)*)")
UNLOADED = "unloaded"  # Triton's reason for a model unloaded on request

Snapshot = dict[str, dict[str, str]]  # model -> entry -> signature


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

    async def unserved(self) -> dict[str, str]:
        """Deployed models that have no running replica now (a lost node, replicas not yet placed
        again), each with the reason; they are UNAVAILABLE in the index until a replica runs."""


def check_model_name(name: str) -> None:
    """Refuse a name no repository folder can have, before any work is done for it."""
    if not name or len(name) > MAX_NAME_LENGTH or not _NAME.fullmatch(name):
        shown = name if len(name) <= 64 else name[:64] + "..."
        raise InvalidArgument(
            f"invalid model name '{shown}': 1 to {MAX_NAME_LENGTH} letters, digits, '_', '-' or '.', "
            "not starting with '.' or '-'"
        )


@dataclass
class ModelEntry:
    name: str
    state: ModelState = ModelState.UNAVAILABLE
    reason: str = ""
    model: ModelDescription | None = None
    requested: bool = False  # asked to be served (counts for readiness) until unloaded

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
class Listing:
    """Where each model name lives, across every repository."""

    where: dict[str, str] = field(default_factory=dict)  # name -> repository
    duplicates: dict[str, list[str]] = field(default_factory=dict)
    snapshots: dict[str, Snapshot] = field(default_factory=dict)  # repository -> snapshot

    def signature(self, name: str) -> Any:
        repo = self.where.get(name)
        return (repo, self.snapshots[repo].get(name)) if repo is not None else None


@dataclass
class ModelController:
    settings: ServerSettings
    deployer: Deployer
    remote: RemoteFn | None = None  # how a served model is reached (None: it is not)
    entries: dict[str, ModelEntry] = field(default_factory=dict)
    listing: Listing = field(default_factory=Listing)
    folders: set[str] = field(default_factory=set)  # model folders seen by the last index call
    started: bool = False

    def __post_init__(self) -> None:
        self._lock = asyncio.Lock()  # one repository action at a time, as Triton serializes them
        self._poller: asyncio.Task[None] | None = None
        self._overlays: Path | None = None
        self._overlay_count = 0

    # --- reading the repositories (in a thread) --------------------------------

    def _list(self) -> Listing:
        from repository_loader.storage import repository_snapshot

        listing = Listing()
        seen: dict[str, list[str]] = {}
        for repo in self.settings.model_repositories:
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

    def _read(self, name: str, repo: str | None, overlay: Path | None = None) -> ModelDescription:
        """One model's description, from its repository or from an overlay written for an override."""
        from repository_loader import ModelLoadError, load_model

        source = str(overlay) if overlay is not None else repo
        assert source is not None
        try:
            return load_model(
                source,
                name,
                config_name=None if overlay is not None else self.settings.model_config_name,
                auto_complete=self.settings.auto_complete,
            )
        except ModelLoadError as exc:
            raise InvalidArgument(self._scrub("; ".join(exc.errors) or exc.message, overlay)) from None
        except ServerError as exc:
            raise type(exc)(self._scrub(exc.message, overlay)) from None

    def _scrub(self, message: str, overlay: Path | None = None) -> str:
        """``message`` without the server's paths (repositories, override folders)."""
        roots = [str(overlay)] if overlay is not None else []
        roots += [r for r in self.settings.model_repositories if "://" not in r]
        if self._overlays is not None:
            roots.append(str(self._overlays))
        for root in sorted(roots, key=len, reverse=True):
            message = message.replace(root + "/", "").replace(root, "<repository>")
        return message

    def _read_all(self, names: list[str]) -> tuple[dict[str, ModelDescription], dict[str, str]]:
        models: dict[str, ModelDescription] = {}
        failed: dict[str, str] = {}
        for name in names:
            try:
                models[name] = self._read(name, self.listing.where[name])
            except ServerError as exc:
                failed[name] = exc.message
        return models, failed

    # --- start and poll ----------------------------------------------------------

    async def start(self) -> None:
        """Read the repositories and load what the control mode says; raise (``exit_on_error``)
        when a model asked for failed. POLL mode then watches the repositories."""
        self.listing = await asyncio.to_thread(self._list)
        mode = self.settings.model_control_mode
        known = sorted({*self.listing.where, *self.listing.duplicates})
        if mode == "explicit":
            sel = self.settings.load_models
            wanted = known if "*" in sel else list(dict.fromkeys(sel))
        else:
            wanted = known
        for name in wanted:
            if name in self.listing.duplicates:
                self._fail(name, f"model '{name}' appears in more than one model repository")
            elif name not in self.listing.where:
                self._fail(name, f"failed to load '{name}', failed to poll from model repository")
        names = [n for n in wanted if n in self.listing.where]
        models, failed = await asyncio.to_thread(self._read_all, names)
        for name, reason in failed.items():
            self._fail(name, reason)
        self.deployer.prepare(models)
        await self._load_many(list(models.values()))
        self.started = True
        broken = [e for e in self.entries.values() if e.requested and e.state != ModelState.READY]
        if broken and self.settings.exit_on_error:
            raise Unavailable(
                "failed to load all models (exit_on_error): "
                + "; ".join(f"'{e.name}': {e.reason}" for e in broken)
            )
        if mode == "poll":
            self._poller = asyncio.get_running_loop().create_task(self._poll_forever())

    def _fail(self, name: str, reason: str) -> None:
        logger.error("model '%s' is unavailable: %s", name, reason)
        self.entries[name] = ModelEntry(name, ModelState.UNAVAILABLE, reason, requested=True)

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        if self._overlays is not None:
            shutil.rmtree(self._overlays, ignore_errors=True)

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.repository_poll_secs)
            try:
                await self.poll()
            except Exception:  # a repository that cannot be read now may be readable next time
                logger.exception("polling the model repositories failed")

    async def poll(self) -> list[str]:
        """Compare the repositories with the last listing; load, unload or reload what changed.
        Returns the names acted on."""
        async with self._lock:
            before = self.listing
            after = await asyncio.to_thread(self._list)
            names = {*before.where, *before.duplicates, *after.where, *after.duplicates, *self.entries}
            changed = sorted(
                n
                for n in names
                if before.signature(n) != after.signature(n)
                or (n in after.duplicates) != (n in before.duplicates)
                or (n in after.where and n not in self.entries)
            )
            self.listing = after
            for name in changed:
                if name in after.duplicates:
                    await self._unload_one(name)
                    self._fail(name, f"model '{name}' appears in more than one model repository")
                elif name not in after.where:
                    logger.info("model '%s' left the repository: unloading it", name)
                    await self._unload_one(name)
                    self.entries.pop(name, None)
            present = [n for n in changed if n in after.where]
            models, failed = await asyncio.to_thread(self._read_all, present)
            for name, reason in failed.items():
                self._keep_or_fail(name, reason)
            plain = [m for m in models.values() if not m.is_ensemble]
            ensembles = [m for m in models.values() if m.is_ensemble]
            await asyncio.gather(*(self._apply(m) for m in plain))
            touched = {m.name for m in plain}
            for entry in list(self.entries.values()):  # ensembles whose steps changed
                m = entry.model
                if (
                    m is not None
                    and m.is_ensemble
                    and entry.state == ModelState.READY
                    and m.name not in models
                    and any(s.model_name in touched for s in m.ensemble_steps)
                ):
                    ensembles.append(m)
            for m in ensembles:
                await self._apply(m)
            return changed

    def _keep_or_fail(self, name: str, reason: str) -> None:
        entry = self.entries.get(name)
        if entry is not None and entry.state == ModelState.READY:
            logger.error("model '%s' failed to reload, the loaded version keeps serving: %s", name, reason)
        else:
            self._fail(name, reason)

    async def _apply(self, model: ModelDescription) -> None:
        """Load ``model``, or reload it where it is serving (failures logged, as POLL reports them)."""
        with contextlib.suppress(ServerError):
            await self._load_or_reload(model)

    # --- loading -----------------------------------------------------------------

    async def _load_many(self, models: list[ModelDescription]) -> None:
        # composing models first, so ensembles find their steps; of those, the ones placed on GPUs
        # first (Ray may otherwise fill a GPU node's CPUs with CPU-only replicas, and a GPU replica
        # then waits there forever)
        plain = [m for m in models if not m.is_ensemble]
        ensembles = [m for m in models if m.is_ensemble]
        on_gpus = [m for m in plain if self.deployer.needs_gpu(m)]
        await asyncio.gather(*(self._load(m) for m in on_gpus))
        await asyncio.gather(*(self._load(m) for m in plain if m not in on_gpus))
        for m in ensembles:
            await self._load(m)

    async def _load_or_reload(self, model: ModelDescription) -> None:
        entry = self.entries.get(model.name)
        if entry is not None and entry.state == ModelState.READY and entry.model is not None:
            await self._reload(entry, model)
        else:
            await self._load(model)
            entry = self.entries[model.name]
            if entry.state != ModelState.READY:
                raise InvalidArgument(f"failed to load '{model.name}': {entry.reason}")

    async def _reload(self, entry: ModelEntry, model: ModelDescription) -> None:
        assert entry.model is not None
        entry.requested = True
        try:
            await self.deployer.reload(entry.model, model)
        except Exception as exc:
            reason = self._scrub(_reason(exc), model.path.parent)
            logger.error(
                "model '%s' failed to reload, the loaded version keeps serving: %s", model.name, reason
            )
            raise InvalidArgument(f"failed to load '{model.name}': {reason}") from None
        entry.model, entry.reason = model, ""
        logger.info("model '%s' reloaded (versions %s)", model.name, list(model.versions))

    async def _load(self, model: ModelDescription) -> None:
        entry = self.entries.setdefault(model.name, ModelEntry(model.name))
        entry.model, entry.requested = model, True
        entry.state, entry.reason = ModelState.LOADING, ""
        try:
            for step in model.ensemble_steps:
                dep = self.entries.get(step.model_name)
                if dep is None or dep.state != ModelState.READY:
                    raise Unavailable(
                        f"ensemble '{model.name}' depends on '{step.model_name}' which is not available"
                    )
            await self.deployer.deploy(model)
            entry.state = ModelState.READY
        except Exception as exc:
            entry.state = ModelState.UNAVAILABLE
            entry.reason = self._scrub(_reason(exc), model.path.parent)
            logger.error("model '%s' is unavailable: %s", model.name, entry.reason)
            with contextlib.suppress(Exception):  # nothing may have been deployed
                await self.deployer.delete(model.name)

    def _check_explicit(self) -> None:
        if self.settings.model_control_mode != "explicit":
            raise Unavailable("explicit model load / unload is not allowed if polling is enabled")

    async def load(self, name: str, parameters: Mapping[str, Any] | None = None) -> None:
        """Repository API load: (re)read the model, with Triton's overrides, and serve it.

        A name that is in no repository (and comes with no files) records nothing."""
        check_model_name(name)
        self._check_explicit()
        config, files = self._overrides(parameters or {})
        async with self._lock:
            self.listing = await asyncio.to_thread(self._list)
            if name in self.listing.duplicates:
                raise InvalidArgument(
                    f"failed to load '{name}': it appears in more than one model repository"
                )
            if name not in self.listing.where and not files:
                raise InvalidArgument(f"failed to load '{name}', failed to poll from model repository")
            try:
                model = await asyncio.to_thread(self._describe, name, config, files)
            except ServerError as exc:
                message = f"failed to load '{name}': {exc.message}"
                entry = self.entries.get(name)
                if entry is None or entry.state != ModelState.READY:
                    self.entries[name] = ModelEntry(name, ModelState.UNAVAILABLE, exc.message, requested=True)
                raise InvalidArgument(message) from None
            await self._load_steps(model, set())
            await self._load_or_reload(model)

    async def _load_steps(self, model: ModelDescription, seen: set[str]) -> None:
        """An ensemble's composing models that are not serving, loaded first (nested ones too)."""
        for step in model.ensemble_steps:
            name = step.model_name
            dep = self.entries.get(name)
            if name in seen or (dep is not None and dep.state == ModelState.READY):
                continue
            seen.add(name)
            if name not in self.listing.where:
                continue  # the ensemble's own load reports it
            try:
                step_model = await asyncio.to_thread(self._read, name, self.listing.where[name])
            except ServerError as exc:
                self._fail(name, exc.message)
                continue
            await self._load_steps(step_model, seen)
            await self._load(step_model)

    def _overrides(self, parameters: Mapping[str, Any]) -> tuple[dict[str, Any] | None, dict[str, bytes]]:
        """Triton's load parameters: ``config`` (a JSON object, or its text) and ``file:<version>/<name>``
        (base64 contents; refused unless ``allow_model_file_upload``)."""
        config: dict[str, Any] | None = None
        files: dict[str, bytes] = {}
        for key, value in parameters.items():
            if key == "config":
                try:
                    doc = json.loads(value) if isinstance(value, (str, bytes)) else value
                except ValueError as exc:
                    raise InvalidArgument(f"failed to parse the 'config' parameter as JSON: {exc}") from None
                if not isinstance(doc, dict):
                    raise InvalidArgument("the 'config' parameter must be a JSON object")
                config = doc
            elif key.startswith("file:"):
                if not self.settings.allow_model_file_upload:
                    raise InvalidArgument(
                        "loading model files through the repository API is not allowed on this server "
                        "(start it with allow_model_file_upload)"
                    )
                match = _FILE_KEY.fullmatch(key)
                if match is None or ".." in key.split("/"):
                    raise InvalidArgument(
                        f"invalid file parameter '{key[:80]}': expected 'file:<version>/<name>'"
                    )
                try:
                    files[match.group(1)] = base64.b64decode(str(value), validate=True)
                except (binascii.Error, ValueError):
                    raise InvalidArgument(f"the '{key[:80]}' parameter is not base64 content") from None
        if files and config is None:
            raise InvalidArgument("file parameters need a 'config' parameter with the model's configuration")
        return config, files

    def _describe(
        self, name: str, config: dict[str, Any] | None, files: dict[str, bytes]
    ) -> ModelDescription:
        if config is None:
            return self._read(name, self.listing.where[name])
        return self._read(name, None, self._overlay(name, config, files))

    def _overlay(self, name: str, config: dict[str, Any], files: dict[str, bytes]) -> Path:
        """A one-model repository: the override config, and the request's files or else the
        model's own folders (linked, not copied)."""
        from repository_loader.config import config_from_json, config_to_text
        from repository_loader.storage import open_storage

        if self._overlays is None:
            self._overlays = Path(tempfile.mkdtemp(prefix="triton-serve-overrides-"))
        self._overlay_count += 1
        root = self._overlays / str(self._overlay_count)
        target = root / name
        target.mkdir(parents=True)
        parsed = config_from_json(config, "the 'config' parameter")
        parsed.name = parsed.name or name
        (target / "config.pbtxt").write_text(config_to_text(parsed))
        if files:
            for rel, data in files.items():
                path = target / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            return root
        storage, repo_root = open_storage(self.listing.where[name])
        source = storage.localize(storage.join(repo_root, name))
        for child in source.iterdir():
            if child.name not in ("config.pbtxt", "configs", "__pycache__"):
                (target / child.name).symlink_to(child, target_is_directory=child.is_dir())
        return root

    async def unload(self, name: str, parameters: Mapping[str, Any] | None = None) -> None:
        """Repository API unload; ``unload_dependents`` also unloads an ensemble's composing models."""
        check_model_name(name)
        self._check_explicit()
        dependents = _flag((parameters or {}).get("unload_dependents", False))
        async with self._lock:
            entry = self.entries.get(name)
            if entry is None:
                if name in self.listing.where:
                    return  # in the repository, not loaded: nothing to do
                raise NotFound(f"failed to unload '{name}': no such model in the repository")
            targets = [name]
            if dependents and entry.model is not None:
                targets += [n for n in self._composing(entry.model) if not self._needed_by_others(n, name)]
            for target in targets:
                await self._unload_one(target)

    def _composing(self, model: ModelDescription) -> list[str]:
        found: list[str] = []
        todo = [s.model_name for s in model.ensemble_steps]
        while todo:
            step = todo.pop()
            if step in found:
                continue
            found.append(step)
            dep = self.entries.get(step)
            if dep is not None and dep.model is not None:
                todo.extend(s.model_name for s in dep.model.ensemble_steps)
        return found

    def _needed_by_others(self, name: str, unloading: str) -> bool:
        return any(
            e.name != unloading
            and e.state == ModelState.READY
            and e.model is not None
            and name in self._composing(e.model)
            and e.name not in self._composing(self.entries[unloading].model)  # type: ignore[arg-type]
            for e in self.entries.values()
        )

    async def _unload_one(self, name: str) -> None:
        entry = self.entries.get(name)
        if entry is None:
            return
        if entry.state in (ModelState.READY, ModelState.LOADING):
            entry.state = ModelState.UNLOADING
            try:
                await self.deployer.delete(name)
            except Exception as exc:
                logger.error("model '%s' did not unload cleanly: %s", name, _reason(exc))
        entry.state, entry.reason, entry.requested = ModelState.UNAVAILABLE, UNLOADED, False

    # --- the registry --------------------------------------------------------------

    def require(self, name: str) -> ModelEntry:
        entry = self.entries.get(name)
        if entry is None:
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        return entry

    def unavailable(self, name: str) -> ServerError:
        """The error for a request that reached the server app for ``name``: it is not served."""
        entry = self.require(name)
        if entry.state == ModelState.LOADING:
            return Unavailable(f"model '{name}' is loading")
        reason = f": {entry.reason}" if entry.reason else ""
        return Unavailable(f"model '{name}' is not ready{reason}")

    def get(self, name: str) -> ServedModel:
        """A served model (READY) through ``remote``; NotFound or Unavailable otherwise."""
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
        return all(e.state == ModelState.READY for e in self.entries.values() if e.requested)

    async def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Every model of the repositories, read again at each call as Triton does (a folder added since
        the last load or poll shows by name); those never loaded by name only. A loaded model with no
        running replica now (:meth:`Deployer.unserved`) is UNAVAILABLE, with the reason."""
        try:
            self.folders = await asyncio.to_thread(self._model_folders)
        except Exception as exc:  # an unreachable repository: list what was last seen
            logger.warning("repository index: cannot list the repositories: %s", _reason(exc))
        rows = self.index_rows()
        try:
            unserved = await self.deployer.unserved()
        except Exception as exc:  # the cluster's state unknown: the index from what was loaded
            logger.warning("repository index: cannot read the replicas' state: %s", _reason(exc))
            unserved = {}
        for row in rows:
            if row.get("state") == ModelState.READY.value and row["name"] in unserved:
                row["state"], row["reason"] = ModelState.UNAVAILABLE.value, unserved[row["name"]]
        return [r for r in rows if r.get("state") == "READY"] if ready_only else rows

    def _model_folders(self) -> set[str]:
        from repository_loader.storage import open_storage

        found: set[str] = set()
        for repo in self.settings.model_repositories:
            storage, root = open_storage(repo)
            found.update(
                n
                for n in storage.list_dir(root)
                if not n.startswith(".") and storage.is_dir(storage.join(root, n))
            )
        return found

    def index_rows(self) -> list[dict[str, Any]]:
        """The index from what is known now (no repository read)."""
        names = sorted({*self.entries, *self.listing.where, *self.listing.duplicates, *self.folders})
        rows: list[dict[str, Any]] = []
        for name in names:
            entry = self.entries.get(name)
            rows.extend(entry.index_rows() if entry is not None else [{"name": name}])
        return rows


def _reason(exc: BaseException) -> str:
    return exc.message if isinstance(exc, ServerError) else f"{type(exc).__name__}: {exc}"


def _flag(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)
