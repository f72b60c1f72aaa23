"""The model registry of a model replica: its one model's runtime, in this process."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from deployments.protocol.dataplane import Describe, ModelDataPlane, model_metadata_document
from deployments.runtime.model import ModelRuntime
from deployments.runtime.router import Router
from repository_loader.errors import NotFound, Unsupported
from repository_loader.model import ModelDescription

StatsFn = Callable[[str, str], Awaitable[dict[str, Any]]]


class LocalModel:
    """A :class:`~deployments.protocol.dataplane.ServedModel` over the runtime in this process.

    ``cluster_stats`` (optional) returns the statistics summed over every replica
    of the model; without it, this replica's own are reported.
    """

    def __init__(self, runtime: ModelRuntime, cluster_stats: StatsFn | None = None) -> None:
        self.runtime = runtime
        self.description: ModelDescription = runtime.model
        self._cluster_stats = cluster_stats

    def is_ready(self, version: str = "") -> bool:
        return self.runtime.is_ready(version)

    def metadata(self, version: str = "") -> dict[str, Any]:
        versions = (
            tuple(sorted(self.runtime.versions)) if not version else (self.runtime.version(version).version,)
        )
        return model_metadata_document(self.description, versions)

    def config(self, version: str = "") -> dict[str, Any]:
        return self.runtime.config(version)

    async def statistics(self, version: str = "") -> list[dict[str, Any]]:
        if version:
            self.runtime.version(version)
        if self._cluster_stats is not None:
            stats: list[dict[str, Any]] = (await self._cluster_stats(self.description.name, version))[
                "model_stats"
            ]
            return stats
        return self.runtime.statistics(version)


class ReplicaRegistry:
    """The registry of a model replica: its one model; the repository API lives at ``/v2/repository``."""

    def __init__(self, runtime: ModelRuntime, cluster_stats: StatsFn | None = None) -> None:
        self.model = LocalModel(runtime, cluster_stats)
        self.name = runtime.model.name

    def swap(self, runtime: ModelRuntime) -> None:
        """Serve ``runtime`` (a reload of the same model) from now on."""
        self.model = LocalModel(runtime, self.model._cluster_stats)

    def get(self, name: str) -> LocalModel:
        if name != self.name:
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        return self.model

    def describe(self, name: str) -> ModelDescription:
        return self.get(name).description

    def ready(self) -> bool:
        return self.model.runtime.is_ready()

    def served(self) -> list[str]:
        return [self.name]

    async def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        rows = [
            {"name": self.name, "version": str(v), "state": "READY" if r.ready else "UNAVAILABLE"}
            for v, r in sorted(self.model.runtime.versions.items())
        ]
        return [r for r in rows if r["state"] == "READY"] if ready_only else rows

    async def load(self, name: str, parameters: Mapping[str, Any]) -> None:
        raise Unsupported("the repository API is served at /v2/repository")

    async def unload(self, name: str, parameters: Mapping[str, Any]) -> None:
        raise Unsupported("the repository API is served at /v2/repository")


def replica_dataplane(
    runtime: ModelRuntime,
    cluster_stats: StatsFn | None = None,
    router: Router | None = None,
    describe_elsewhere: Describe | None = None,
) -> ModelDataPlane:
    """The data plane of a model replica, over its own runtime: ``router`` (default: this runtime
    alone) decides where each inference runs; ``describe_elsewhere`` describes other models."""
    if router is None:
        router = Router()
    router.serve(runtime.model.name, runtime)
    return ModelDataPlane(
        ReplicaRegistry(runtime, cluster_stats), router, describe_elsewhere=describe_elsewhere
    )
