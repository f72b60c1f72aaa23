"""Model control (NONE / EXPLICIT / POLL) and the repository index, independent of Ray.

The :class:`ModelController` keeps each model's state as Triton reports it and
asks a :class:`Deployer` to bring a model's application up or down; one
model's failure never touches the others. It is also the server application's
model registry (``deployments.protocol.dataplane.ModelRegistry``): a served
model is reached through ``remote`` (a handle to the model's own replicas,
``deployments.serve.handles``); any other raises NotFound or Unavailable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from deployments.protocol.dataplane import ServedModel
from deployments.settings import ServerSettings
from repository_loader.errors import InvalidArgument, NotFound, ServerError, Unavailable
from repository_loader.model import ModelDescription, ModelState

logger = logging.getLogger(__name__)


class Deployer(Protocol):
    def prepare(self, models: dict[str, ModelDescription]) -> None:
        """Plan resources for every model the repository holds (before any deploy)."""

    async def deploy(self, model: ModelDescription) -> None:
        """Bring the model's application up; raise a ``ServerError`` with the reason if it fails."""

    async def delete(self, name: str) -> None: ...


@dataclass
class ModelEntry:
    name: str
    state: ModelState = ModelState.UNAVAILABLE
    reason: str = ""
    model: ModelDescription | None = None

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
class ModelController:
    settings: ServerSettings
    deployer: Deployer
    remote: RemoteFn | None = None  # how a served model is reached (None: it is not)
    entries: dict[str, ModelEntry] = field(default_factory=dict)

    def scan(self) -> tuple[dict[str, ModelDescription], dict[str, list[str]]]:
        from repository_loader import load_repository

        state = load_repository(
            self.settings.model_repository,
            config_name=self.settings.model_config_name,
            auto_complete=self.settings.auto_complete,
        )
        return dict(state.models), {k: list(v) for k, v in state.failed.items()}

    async def start(self) -> None:
        """Read the repository and load what the control mode says to load."""
        models, failed = await asyncio.to_thread(self.scan)
        for name, reasons in failed.items():
            self.entries[name] = ModelEntry(name, ModelState.UNAVAILABLE, "; ".join(reasons))
        for name, model in models.items():
            self.entries[name] = ModelEntry(name, ModelState.UNAVAILABLE, "unloaded", model)
        self.deployer.prepare(models)
        mode = self.settings.model_control_mode
        wanted = list(models)
        if mode == "explicit":
            sel = self.settings.load_models
            wanted = [m for m in models if "*" in sel or m in sel]
        await self._load_many([models[m] for m in wanted])

    async def _load_many(self, models: list[ModelDescription]) -> None:
        # composing models first, so ensembles find their steps
        plain = [m for m in models if not m.is_ensemble]
        ensembles = [m for m in models if m.is_ensemble]
        await asyncio.gather(*(self._load(m) for m in plain))
        await asyncio.gather(*(self._load(m) for m in ensembles))

    async def _load(self, model: ModelDescription) -> None:
        entry = self.entries.setdefault(model.name, ModelEntry(model.name))
        entry.model = model
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
            entry.reason = exc.message if isinstance(exc, ServerError) else f"{type(exc).__name__}: {exc}"
            logger.error("model '%s' is unavailable: %s", model.name, entry.reason)
            with contextlib.suppress(Exception):  # nothing may have been deployed
                await self.deployer.delete(model.name)

    def _check_explicit(self) -> None:
        if self.settings.model_control_mode == "none":
            raise Unavailable("explicit model load / unload is not allowed if polling is enabled")

    async def load(self, name: str, parameters: Mapping[str, Any] | None = None) -> None:
        """Repository API load: re-read the model's files and (re)deploy it."""
        from repository_loader import load_model

        self._check_explicit()
        parameters = parameters or {}
        if parameters.get("config") or any(k.startswith("file:") for k in parameters):
            raise InvalidArgument("loading a model with an overriding config or files is not supported yet")
        try:
            model = await asyncio.to_thread(
                load_model,
                self.settings.model_repository,
                name,
                config_name=self.settings.model_config_name,
                auto_complete=self.settings.auto_complete,
            )
        except ServerError as exc:
            self.entries[name] = ModelEntry(name, ModelState.UNAVAILABLE, exc.message)
            raise InvalidArgument(f"failed to load '{name}': {exc.message}") from None
        await self._load(model)
        entry = self.entries[name]
        if entry.state != ModelState.READY:
            raise InvalidArgument(f"failed to load '{name}': {entry.reason}")

    async def unload(self, name: str, parameters: Mapping[str, Any] | None = None) -> None:
        self._check_explicit()
        entry = self.entries.get(name)
        if entry is None:
            raise NotFound(f"failed to unload '{name}': no such model in the repository")
        entry.state = ModelState.UNLOADING
        await self.deployer.delete(name)
        entry.state, entry.reason = ModelState.UNAVAILABLE, "unloaded"

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

    def ready(self) -> bool:
        if not self.settings.strict_readiness:
            return True
        wanted = [e for e in self.entries.values() if e.reason != "unloaded"]
        return all(e.state == ModelState.READY for e in wanted)

    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        rows = [row for name in sorted(self.entries) for row in self.entries[name].index_rows()]
        return [r for r in rows if r["state"] == "READY"] if ready_only else rows
