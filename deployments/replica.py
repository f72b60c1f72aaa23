"""The data plane of a model replica: one model's runtime behind the protocol front ends."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from deployments.inference import InferRequest, InferResponse
from deployments.protocol.dataplane import model_metadata_document, server_metadata_document
from deployments.runtime.model import ModelRuntime
from repository_loader.errors import NotFound, Unsupported
from repository_loader.model import ModelDescription

StatsFn = Callable[[str, str], Awaitable[dict[str, Any]]]


class ReplicaDataPlane:
    """Answers the routes of ``/v2/models/<model>`` from the runtime in this replica.

    ``cluster_stats`` (optional) returns the statistics summed over every replica
    of the model; without it, this replica's own are reported.
    """

    def __init__(self, runtime: ModelRuntime, cluster_stats: StatsFn | None = None) -> None:
        self.runtime = runtime
        self.model = runtime.model
        self._cluster_stats = cluster_stats

    def _check(self, name: str) -> None:
        if name != self.model.name:
            raise NotFound(f"Request for unknown model: '{name}' is not found")

    async def server_metadata(self) -> dict[str, Any]:
        return server_metadata_document()

    async def live(self) -> bool:
        return True

    async def ready(self) -> bool:
        return self.runtime.is_ready()

    async def model_ready(self, name: str, version: str = "") -> bool:
        self._check(name)
        return self.runtime.is_ready(version)

    async def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        self._check(name)
        versions = (
            tuple(sorted(self.runtime.versions)) if not version else (self.runtime.version(version).version,)
        )
        return model_metadata_document(self.model, versions)

    async def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        self._check(name)
        return self.runtime.config(version)

    async def model_description(self, name: str, version: str = "") -> ModelDescription:
        self._check(name)
        return self.model

    async def infer(self, request: InferRequest) -> InferResponse:
        self._check(request.model_name)
        return await self.runtime.infer(request, checked=True)

    async def model_statistics(self, name: str | None = None, version: str = "") -> dict[str, Any]:
        if name is not None:
            self._check(name)
        if version:
            self.runtime.version(version)
        if self._cluster_stats is not None:
            return await self._cluster_stats(self.model.name, version)
        return {"model_stats": self.runtime.statistics(version)}

    async def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return [
            {"name": self.model.name, "version": str(v), "state": "READY" if r.ready else "UNAVAILABLE"}
            for v, r in sorted(self.runtime.versions.items())
        ]

    async def load_model(self, name: str, parameters: Mapping[str, Any]) -> None:
        raise Unsupported("the repository API is served at /v2/repository")

    async def unload_model(self, name: str, parameters: Mapping[str, Any]) -> None:
        raise Unsupported("the repository API is served at /v2/repository")
