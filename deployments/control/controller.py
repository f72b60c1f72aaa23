"""The model control modes (NONE / EXPLICIT / POLL), as Triton's model repository manager has them.

* at start, :class:`ModelController` reads every repository (a model name found in
  two of them is an error for that name) and loads what the control mode says:
  everything (NONE, POLL) or the ``load_model`` names (EXPLICIT, ``*`` = all);
* in POLL mode it compares a cheap listing of the repositories every
  ``repository_poll_secs`` and loads, unloads or reloads exactly the models that changed;
* in EXPLICIT mode it answers the repository API: load (with Triton's overrides,
  ``deployments.control.overlay``), unload (with ``unload_dependents``); an
  ensemble's composing models are loaded with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from deployments.control.listing import Listing, list_repositories, local_model_folder
from deployments.control.loading import ModelLoader
from deployments.control.overlay import parse_overrides
from deployments.control.registry import (
    DUPLICATE,
    UNLOADED,
    ModelEntry,
    check_model_name,
    load_failed,
    reason_of,
)
from repository_loader.ensemble_rules import composing_models, nested_first
from repository_loader.errors import InvalidArgument, PollFailed, ServerError, Unavailable
from repository_loader.model import ModelDescription, ModelState

logger = logging.getLogger(__name__)


@dataclass
class ModelController(ModelLoader):
    """The server's model registry (``deployments.protocol.dataplane.ModelRegistry``) and its control mode."""

    def __post_init__(self) -> None:
        super().__post_init__()
        # one repository action at a time per model (and the models it loads or unloads with it), so a
        # load that waits for resources holds up no other model's; poll compares the repositories once
        self._locks: dict[str, asyncio.Lock] = {}
        self._poll_lock = asyncio.Lock()
        self._actions = 0  # repository actions under way: override folders are released after the last
        self.restarted = False  # this start found models of an earlier one running (see start)
        self._poller: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def _held(self, *names: str) -> AsyncIterator[None]:
        """The locks of ``names`` (in name order, so two actions never wait for each other)."""
        async with contextlib.AsyncExitStack() as stack:
            for name in sorted(set(names)):
                await stack.enter_async_context(self._locks.setdefault(name, asyncio.Lock()))
            yield

    @contextlib.asynccontextmanager
    async def _action(self) -> AsyncIterator[None]:
        """A repository action; the override folders no model uses any more go after the last one."""
        self._actions += 1
        try:
            yield
        finally:
            self._actions -= 1
            if not self._actions:
                self._release_overlays()

    # --- start, poll and stop -------------------------------------------------------

    async def start(self) -> None:
        """Read the repositories and load what the control mode says; raise (``exit_on_error``)
        when a model asked for failed, unless this is a restart of the server application (models of
        the earlier start still run: they are adopted, and a failure is logged, never a teardown).
        POLL mode then watches the repositories."""
        self.listing = await self._list()
        mode = self.settings.model_control_mode
        known = sorted({*self.listing.where, *self.listing.duplicates})
        if mode == "explicit":
            sel = self.settings.load_models
            wanted = known if "*" in sel else list(dict.fromkeys(k for n in sel for k in self._keys(n)))
        else:
            wanted = known
        for name in wanted:
            if name in self.listing.duplicates:
                self._fail(name, DUPLICATE)
            elif name not in self.listing.where:  # unknown, as in Triton; named in exit_on_error's report
                logger.error("failed to load '%s', failed to poll from model repository", name)
                self.unread[name] = f"failed to load '{name}', failed to poll from model repository"
        # a restarted server application does not load again what the repository API unloaded
        gone = await self._recorded_unloads()
        for name in [n for n in wanted if n in gone]:
            self.entries[name] = ModelEntry(name, ModelState.UNAVAILABLE, UNLOADED)
        names = [n for n in wanted if n in self.listing.where and n not in gone]
        # a restarted server application finds the models loaded before it still running: they stay
        # loaded and listed (the repository API loaded them, perhaps with an override)
        running = await self.deployer.running()
        self.restarted = bool(running) or bool(gone)
        for name, model in running.items():
            if name in gone:  # its unload was under way when the server application stopped: finish it
                self.entries[name] = ModelEntry(name, ModelState.READY, "", model)
                await self._unload_one(name)
            elif name not in names:
                self.entries[name] = ModelEntry(name, ModelState.READY, "", model, requested=True)
                logger.info("model '%s' was loaded before this start and keeps serving", name)
        models, failed = await asyncio.to_thread(self._read_all, names)
        for name, exc in failed.items():
            self._fail_read(name, exc)
        self.deployer.prepare(models)
        # a start model that runs as it would be deployed now is adopted, not deployed again (a
        # redeploy restarts its replicas: a single replica's model would stop answering meanwhile)
        adopted = [name for name, model in models.items() if running.get(name) == model]
        for name in adopted:
            self.entries[name] = ModelEntry(name, ModelState.READY, "", models[name], requested=True)
            logger.info("model '%s' was serving before this start and keeps serving", name)
        await self._load_many([m for name, m in models.items() if name not in adopted])
        self.started = True
        broken = {
            e.name: e.reason for e in self.entries.values() if e.requested and e.state != ModelState.READY
        }
        broken.update(self.unread)
        if broken and self.restarted:  # a restart of a serving server: what serves keeps serving
            for name, reason in broken.items():
                logger.error("model '%s' did not load again after a restart: %s", name, reason)
        elif broken and self.settings.exit_on_error:
            raise Unavailable(
                "failed to load all models (exit_on_error): "
                + "; ".join(f"'{name}': {reason}" for name, reason in sorted(broken.items()))
            )
        if mode == "poll":
            self._poller = asyncio.get_running_loop().create_task(self._poll_forever())

    async def _list(self) -> Listing:
        """The repositories as they are now."""
        repos, namespacing = self.settings.model_repositories, self.settings.model_namespacing
        return self._listed(await asyncio.to_thread(list_repositories, repos, namespacing))

    def _keys(self, name: str) -> list[str]:
        """The keys a model name asked for by the repository API stands for: with namespacing, every
        copy of it (as Triton applies a load to every model of that name), else the name itself."""
        if self.settings.model_namespacing:
            return self.listing.keys_of(name) or [name]
        return [name]

    async def _recorded_unloads(self) -> set[str]:
        try:
            return await self.deployer.unloaded()
        except Exception as exc:  # the record is unreachable: start as configured
            logger.warning("models unloaded before this start are not known: %s", reason_of(exc))
            return set()

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        self._overlays.close()

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
        async with self._poll_lock:
            before = self.listing
            after = await self._list()
            names = {*before.where, *before.duplicates, *after.where, *after.duplicates, *self.entries}
            changed = sorted(
                n
                for n in names
                if before.signature(n) != after.signature(n)
                or (n in after.duplicates) != (n in before.duplicates)
                or (n in after.where and n not in self.entries)
            )
            self.listing = after
            gone = [n for n in changed if n not in after.where and n not in after.duplicates]
            for name in changed:
                if name in after.duplicates:
                    async with self._held(name):
                        await self._unload_one(name)
                        self._fail(name, DUPLICATE)
            if not self.settings.model_namespacing:
                await self._unload_gone(gone, after)
            present = [n for n in changed if n in after.where]
            models, failed = await asyncio.to_thread(self._read_all, present)
            for name, exc in failed.items():
                self._fail_read(name, exc, keep=True)
            plain = [m for m in models.values() if not m.is_ensemble]
            ensembles = [m for m in models.values() if m.is_ensemble]
            await asyncio.gather(*(self._apply_held(m) for m in plain))
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
            if self.settings.model_namespacing and changed:
                ensembles += await self._resolved_again({m.name for m in ensembles})
            for m in nested_first(ensembles):
                await self._apply_held(m)
            if self.settings.model_namespacing:
                # a copy that left, or a model now under another key, goes once the models and
                # ensembles that take its place serve
                await self._unload_gone(gone, after)
            return changed

    async def _unload_gone(self, gone: list[str], after: Listing) -> None:
        """Unload the models that left the repositories, all at once (each waits for its replicas)."""

        async def unload(name: str) -> None:
            logger.info("model '%s' left the repository: unloading it", name)
            async with self._held(name):
                # Triton keeps it known, unavailable: its requests say it has no version
                await self._unload_one(name)
                if self.settings.model_namespacing and after.keys_of(self.folder_of(name)):
                    # its name is in the repositories under another key (a copy of the same name
                    # came or went): that key is the model now
                    self.entries.pop(name, None)

        await asyncio.gather(*(unload(name) for name in gone))

    async def _resolved_again(self, skip: set[str]) -> list[ModelDescription]:
        """The serving ensembles (but ``skip``) whose steps now name other keys: a copy of a step's
        name came into or left a repository, and Triton's resolution of the step changed with it."""
        found = []
        for entry in list(self.entries.values()):
            m = entry.model
            if m is None or not m.is_ensemble or entry.state != ModelState.READY or m.name in skip:
                continue
            repo = self._repos.get(m.name)
            if repo is None or self.listing.where.get(m.name) != repo:
                continue
            try:
                again = await asyncio.to_thread(self._read, m.name, repo)
            except ServerError as exc:
                logger.error("ensemble '%s' cannot resolve its steps again: %s", m.name, exc.message)
                continue
            if again.ensemble_steps != m.ensemble_steps:
                found.append(again)
        return found

    async def _apply_held(self, model: ModelDescription) -> None:
        async with self._held(model.name):
            await self._apply(model)

    # --- the repository API (EXPLICIT) ------------------------------------------------

    def _check_explicit(self) -> None:
        if self.settings.model_control_mode != "explicit":
            raise Unavailable("explicit model load / unload is not allowed if polling is enabled")

    async def load(self, name: str, parameters: Mapping[str, Any] | None = None) -> None:
        """Repository API load: (re)read the model, with Triton's overrides, and serve it.

        A name that is in no repository (and comes with no files) records nothing."""
        check_model_name(name)
        self._check_explicit()
        try:
            config, files = parse_overrides(parameters or {}, self.settings.allow_model_file_upload)
        except InvalidArgument as exc:  # Triton's answer names the load
            raise InvalidArgument(f"failed to load '{name}': {exc.message}") from None
        if files and config is None:  # Triton's answer, and why
            raise InvalidArgument(
                f"failed to load '{name}', failed to poll from model repository: file parameters need a "
                "'config' parameter with the model's configuration"
            )
        async with self._action():
            if self.settings.model_namespacing:  # the keys of the name now (each load lists again)
                self.listing = await self._list()
            for key in self._keys(name):
                async with self._held(key):
                    await self._record_unloaded(key, False)
                    await self._load_named(key, config, files)
            if self.settings.model_namespacing:
                await self._rekey()

    async def _rekey(self) -> None:
        """With namespacing, a model whose key changed since it loaded (a copy of its name came into or
        left another repository) is loaded under its new key, the ensembles that run it are resolved
        again, and the old key is unloaded and forgotten: the plain name of a model now in several
        repositories is ambiguous, as in Triton."""
        for key, entry in list(self.entries.items()):
            repo = self._repos.get(key)
            if entry.state != ModelState.READY or repo is None or key in self.listing.where:
                continue
            new = self.listing.key_of(self.folder_of(key), repo)
            if new is None or new == key:
                continue
            logger.info("model '%s' is now known as '%s'", key, new)
            async with self._held(new):
                if (e := self.entries.get(new)) is None or e.state != ModelState.READY:
                    try:
                        await self._load_or_reload(await asyncio.to_thread(self._read, new, repo))
                    except ServerError as exc:
                        logger.error("model '%s' did not load as '%s': %s", key, new, exc.message)
                        continue
            for user in await self._resolved_again(set()):
                async with self._held(user.name):
                    await self._load_steps(user, set())
                    await self._apply(user)
            async with self._held(key):
                await self._unload_one(key)
                self.entries.pop(key, None)

    async def _load_named(self, name: str, config: dict[str, Any] | None, files: dict[str, bytes]) -> None:
        """Load ``name`` (a model's key) as the repository API asked."""
        self.listing = await self._list()
        if name in self.listing.duplicates:
            raise InvalidArgument(f"failed to load '{name}': it appears in more than one model repository")
        if name not in self.listing.where and not files:
            raise InvalidArgument(f"failed to load '{name}', failed to poll from model repository")
        entry = self.entries.get(name)
        signature = self.listing.signature(name)
        if (
            config is None
            and not files
            and entry is not None
            and entry.state == ModelState.READY
            and entry.override_of is not None
            and entry.override_of == signature
        ):
            # Triton loads a model again only where its repository folder changed since the last load,
            # so a plain load after an override load keeps the override
            logger.info("model '%s' is unchanged since its override load: it serves on as it is", name)
            return
        try:
            model = await asyncio.to_thread(self._describe, name, config, files)
        except ServerError as exc:
            message = load_failed(name, exc.message)
            entry = self.entries.get(name)
            if isinstance(exc, PollFailed) and entry is None:  # Triton's answer: the model stays unknown
                self._fail_read(name, exc)
                raise InvalidArgument(
                    f"failed to load '{name}', failed to poll from model repository: {exc.message}"
                ) from None
            if entry is None or entry.state != ModelState.READY:
                self.entries[name] = ModelEntry(name, ModelState.UNAVAILABLE, exc.message, requested=True)
            raise InvalidArgument(message) from None
        await self._load_steps(model, set())
        await self._load_or_reload(model)
        self.entries[name].override_of = signature if config is not None or files else None

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
                self._fail_read(name, exc)
                continue
            await self._load_steps(step_model, seen)
            async with self._held(name):
                if (dep := self.entries.get(name)) is None or dep.state != ModelState.READY:
                    await self._load(step_model)

    def _describe(
        self, name: str, config: dict[str, Any] | None, files: dict[str, bytes]
    ) -> ModelDescription:
        if config is None:
            return self._read(name, self.listing.where[name])
        folder = self.folder_of(name)
        source = None if files else local_model_folder(self.listing.where[name], folder)
        return self._read(name, None, self._overlays.write(folder, config, files, source))

    async def unload(self, name: str, parameters: Mapping[str, Any] | None = None) -> None:
        """Repository API unload; ``unload_dependents`` also unloads an ensemble's composing models.
        The ensembles serving (or loading) with the model as a step are unloaded after it, as Triton
        does (a later load of the model does not load them again); one still loading is waited for
        without holding the model's lock."""
        check_model_name(name)
        self._check_explicit()
        dependents = _flag((parameters or {}).get("unload_dependents", False))
        keys = [name]
        if self.settings.model_namespacing:  # every copy of the name, as Triton unloads them
            keys = [k for k in self.entries if self.folder_of(k) == name] or keys
        for key in keys:
            await self._unload_key(key, dependents)

    async def _unload_key(self, name: str, dependents: bool) -> None:
        async with self._action():
            async with self._held(name):
                entry = self.entries.get(name)
                if entry is None:
                    return  # never loaded (in the repository or not): nothing to do, as Triton answers
                steps = []
                if dependents and entry.model is not None:
                    steps = [n for n in self._composing(entry.model) if not self._needed_by_others(n, name)]
                users = self._ensembles_using(name)
                await self._unload_one(name)
            for user in users:
                async with self._held(user):
                    logger.info("ensemble '%s' is unloaded with its step '%s'", user, name)
                    await self._unload_one(user)
            for step in steps:
                async with self._held(step):
                    await self._unload_one(step)

    def _composing(self, model: ModelDescription) -> list[str]:
        """The models ``model`` needs, followed through the ensembles the entries describe."""
        return composing_models(model, lambda n: e.model if (e := self.entries.get(n)) else None)

    def _ensembles_using(self, name: str) -> list[str]:
        """The ensembles serving or loading that run ``name`` as a step (through nested ones too)."""
        return [
            e.name
            for e in self.entries.values()
            if e.state in (ModelState.READY, ModelState.LOADING)
            and e.model is not None
            and e.model.is_ensemble
            and name in self._composing(e.model)
        ]

    def _needed_by_others(self, name: str, unloading: str) -> bool:
        return any(
            e.name != unloading
            and e.state == ModelState.READY
            and e.model is not None
            and name in self._composing(e.model)
            and e.name not in self._composing(self.entries[unloading].model)  # type: ignore[arg-type]
            for e in self.entries.values()
        )


def _flag(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)
