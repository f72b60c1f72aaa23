"""Loading, reloading and unloading one model, as every control mode does it.

:class:`ModelLoader` reads a model's description (from its repository, or from an
override repository) and moves its entry through LOADING to READY or UNAVAILABLE
with the deployer; one model's failure never touches the others. A reload keeps
the serving version when the new one fails. Errors name models and
repository-relative files, never a server path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, replace
from pathlib import Path

from deployments.control.overlay import Overlays
from deployments.control.registry import UNLOADED, ModelEntry, Registry, load_failed, reason_of
from deployments.settings import TRITON_LINE
from repository_loader.ensemble_rules import nested_first
from repository_loader.errors import InvalidArgument, PollFailed, ServerError, Unavailable
from repository_loader.model import ModelDescription, ModelState
from repository_loader.revision import files_digest

logger = logging.getLogger(__name__)
TRITON = {TRITON_LINE: True}  # Triton's INFO lines show as its log flags say (deployments.settings)


@dataclass
class ModelLoader(Registry):
    def __post_init__(self) -> None:
        self._overlays = Overlays()
        self._repos: dict[str, str] = {}  # model -> the repository it was last read from (not an override)

    # --- reading descriptions (in a thread) ----------------------------------------

    def _read(self, key: str, repo: str | None, overlay: Path | None = None) -> ModelDescription:
        """One model's description, from its repository or from an overlay written for an override;
        with namespacing, named by its key, its ensemble steps by theirs (:meth:`_namespaced`)."""
        from repository_loader import ModelLoadError, load_model

        source = str(overlay) if overlay is not None else repo
        assert source is not None
        name = self.folder_of(key)
        try:
            model = load_model(
                source,
                name,
                config_name=None if overlay is not None else self.settings.model_config_name,
                auto_complete=self.settings.auto_complete,
                backend_directory=self.settings.backend_directory,
                elsewhere=lambda step, space: self._read_elsewhere(step, space, source, {name}),
            )
        except ModelLoadError as exc:
            message = self._scrub("; ".join(exc.errors) or exc.message, overlay)
            raise (PollFailed if exc.config_unread else InvalidArgument)(message) from None
        except ServerError as exc:
            raise type(exc)(self._scrub(exc.message, overlay)) from None
        if overlay is None:
            self._repos[key] = source
        else:  # served from its override: never moved to another key
            self._repos.pop(key, None)
        if self.settings.model_namespacing:
            return self._namespaced(model, key, repo)
        for step in model.ensemble_steps:
            if step.model_namespace:  # as in Triton: a namespace means nothing without namespacing
                logger.warning(
                    "ensemble '%s': step model '%s' names model namespace '%s', which is ignored: model "
                    "namespacing is off (--model-namespacing)",
                    key,
                    step.model_name,
                    step.model_namespace,
                )
        return model

    def _namespaced(self, model: ModelDescription, key: str, repo: str | None) -> ModelDescription:
        """``model`` named by its key, each ensemble step by the key of the model it runs, as Triton
        resolves a step: the model of that name in the ensemble's own repository, else the one model
        of that name in any repository (a name in several, none of them the ensemble's, is ambiguous)."""
        steps = []
        for step in model.ensemble_steps:
            name = step.model_name
            if step.model_namespace:
                steps.append(replace(step, model_name=self._in_namespace(key, name, step.model_namespace)))
                continue
            own = self.listing.key_of(name, repo) if repo is not None else None
            if own is None and name in self.listing.ambiguous:
                raise self._ambiguous_step(self.folder_of(key), name)
            steps.append(replace(step, model_name=own or name))
        return replace(model, name=key, ensemble_steps=tuple(steps))

    def _ambiguous_step(self, ensemble: str, name: str) -> InvalidArgument:
        return InvalidArgument(
            f"ensemble '{ensemble}': its step model '{name}' is in {len(self.listing.ambiguous[name])} "
            "repositories and not in the ensemble's own, model namespace must be provided to resolve ambiguity"
        )

    def _in_namespace(self, ensemble: str, name: str, namespace: str) -> str:
        """The key of step model ``name`` in the repository a step's ``model_namespace`` names (the
        repository's path as the server was given it, or its namespace in keys)."""
        for repo, label in self.listing.namespaces.items():
            if namespace in (repo, repo.rstrip("/"), label):
                found = self.listing.key_of(name, repo)
                if found is not None:
                    return found
                break
        raise InvalidArgument(
            f"ensemble '{self.folder_of(ensemble)}': no model '{name}' in the model namespace '{namespace}'"
        )

    def _read_elsewhere(
        self, name: str, namespace: str, source: str, seen: set[str]
    ) -> ModelDescription | None:
        """An ensemble step ``name`` that is in another repository than ``source`` (Triton's
        ensembles name models of any repository), or with namespacing in the one its
        ``model_namespace`` names, read from there; None where it is in ``source`` or none, fails to
        read, or runs the ensemble again (a cycle the ensemble rules report)."""
        from repository_loader import ModelLoadError, load_model

        ensemble = next(iter(seen))
        if namespace and self.settings.model_namespacing:
            repo: str | None = self.listing.where[self._in_namespace(ensemble, name, namespace)]
        elif name in self.listing.ambiguous:  # not in the ensemble's own repository, in two others
            raise self._ambiguous_step(ensemble, name)
        else:
            repo = self.listing.where.get(name)
        if repo is None or repo == source or name in seen:
            return None
        try:
            return load_model(
                repo,
                name,
                config_name=self.settings.model_config_name,
                auto_complete=self.settings.auto_complete,
                backend_directory=self.settings.backend_directory,
                elsewhere=lambda step, space: self._read_elsewhere(step, space, repo, seen | {name}),
            )
        except (ModelLoadError, ServerError):
            return None

    def _scrub(self, message: str, overlay: Path | None = None) -> str:
        """``message`` without the server's paths (repositories, override folders)."""
        roots = [str(overlay)] if overlay is not None else []
        roots += [r for r in self.settings.model_repositories if "://" not in r]
        if self._overlays.root is not None:
            roots.append(str(self._overlays.root))
        for root in sorted(roots, key=len, reverse=True):
            message = message.replace(root + "/", "").replace(root, "<repository>")
        return message

    def _read_all(self, names: list[str]) -> tuple[dict[str, ModelDescription], dict[str, ServerError]]:
        """``names`` read, and the models their ensembles run (in any repository), as Triton loads
        an ensemble's composing models with it; and why those that failed to read did."""
        models: dict[str, ModelDescription] = {}
        failed: dict[str, ServerError] = {}
        pending = list(names)
        while pending:
            name = pending.pop(0)
            if name in models or name in failed:
                continue
            try:
                models[name] = self._read(name, self.listing.where[name])
            except ServerError as exc:
                failed[name] = exc
                continue
            steps = [s.model_name for s in models[name].ensemble_steps]
            pending += [s for s in steps if s in self.listing.where and s not in self.entries]
        return models, failed

    def _release_overlays(self) -> None:
        """Remove the override repositories no model asked for is described from any more."""
        self._overlays.retain(
            e.model.path.parent for e in self.entries.values() if e.requested and e.model is not None
        )

    # --- entries -------------------------------------------------------------------

    def _fail(self, name: str, reason: str) -> None:
        logger.error("model '%s' is unavailable: %s", name, reason)
        self.unread.pop(name, None)
        self.entries[name] = ModelEntry(name, ModelState.UNAVAILABLE, reason, requested=True)

    def _fail_read(self, name: str, exc: ServerError, keep: bool = False) -> None:
        """``name`` failed to read. A model whose configuration could not be read and that is not known
        yet stays unknown, as Triton's poll leaves it out of its model lifecycle (its requests answer
        "is not found"; the index lists it with the reason); otherwise as :meth:`_fail` (``keep``: as
        :meth:`_keep_or_fail`)."""
        if isinstance(exc, PollFailed) and name not in self.entries:
            logger.error("Poll failed for model directory '%s': %s", name, exc.message)  # Triton's line
            self.unread[name] = exc.message
        elif keep:
            self._keep_or_fail(name, exc.message)
        else:
            self._fail(name, exc.message)

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

    async def _load_many(self, models: list[ModelDescription]) -> None:
        # composing models first, so ensembles find their steps; of those, the ones placed on GPUs
        # first (Ray may otherwise fill a GPU node's CPUs with CPU-only replicas, and a GPU replica
        # then waits there forever)
        plain = [m for m in models if not m.is_ensemble]
        ensembles = nested_first([m for m in models if m.is_ensemble])
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
                raise InvalidArgument(load_failed(model.name, entry.reason))

    async def _reload(self, entry: ModelEntry, model: ModelDescription) -> None:
        assert entry.model is not None
        entry.requested = True
        files = await asyncio.to_thread(files_digest, model.path)
        if model == entry.model and files and files == entry.files:
            # Triton loads a model again only where its configuration or files changed
            logger.info("model '%s' is unchanged: it serves on as it is", model.name)
            return
        served = {*entry.model.versions, *entry.model.retired_versions}
        model = replace(model, retired_versions=tuple(sorted(served - set(model.versions))))
        try:
            await self.deployer.reload(entry.model, model)
        except Exception as exc:
            reason = self._scrub(reason_of(exc), model.path.parent)
            logger.error(
                "model '%s' failed to reload, the loaded version keeps serving: %s", model.name, reason
            )
            raise InvalidArgument(load_failed(model.name, reason)) from None
        entry.model, entry.reason, entry.files = model, "", files
        logger.info("model '%s' reloaded (versions %s)", model.name, list(model.versions))
        logger.info("successfully loaded '%s'", model.name, extra=TRITON)  # Triton's line

    async def _load(self, model: ModelDescription) -> None:
        self.unread.pop(model.name, None)
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
            entry.state, entry.files = ModelState.READY, await asyncio.to_thread(files_digest, model.path)
            logger.info("successfully loaded '%s'", model.name, extra=TRITON)  # Triton's line
        except Exception as exc:
            entry.state = ModelState.UNAVAILABLE
            entry.reason = self._scrub(reason_of(exc), model.path.parent)
            logger.error("model '%s' is unavailable: %s", model.name, entry.reason)
            with contextlib.suppress(Exception):  # nothing may have been deployed
                await self.deployer.delete(model.name)

    async def _unload_one(self, name: str) -> None:
        entry = self.entries.get(name)
        if entry is None:
            return
        if entry.state in (ModelState.READY, ModelState.LOADING):
            entry.state = ModelState.UNLOADING
            try:
                await self.deployer.delete(name)
                logger.info("successfully unloaded '%s'", name, extra=TRITON)  # Triton's line
            except Exception as exc:
                logger.error("model '%s' did not unload cleanly: %s", name, reason_of(exc))
        entry.state, entry.reason, entry.requested = ModelState.UNAVAILABLE, UNLOADED, False
        await self._record_unloaded(name, True)

    async def _record_unloaded(self, name: str, unloaded: bool) -> None:
        """Keep what a restart of the server application must know; model control goes on without it."""
        try:
            await self.deployer.record_unloaded(name, unloaded)
        except Exception as exc:
            logger.warning("model '%s': the record of its unload was not kept: %s", name, reason_of(exc))
