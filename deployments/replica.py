"""The model registries of replicas: a model replica's one model, a model host's pooled models."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from deployments.inference import ModelExecutor
from deployments.protocol.dataplane import Describe, ModelDataPlane, model_metadata_document
from deployments.protocol.shared_memory import SharedMemory
from deployments.runtime.host import HostedModels, ModelHost
from deployments.runtime.model import ModelRuntime
from deployments.runtime.router import Router
from deployments.tracing.control import TraceControl
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
    shared_memory: SharedMemory | None = None,
    traces: TraceControl | None = None,
) -> ModelDataPlane:
    """The data plane of a model replica, over its own runtime: ``router`` (default: this runtime
    alone) decides where each inference runs; ``describe_elsewhere`` describes other models;
    ``shared_memory`` reads the regions the server application registered; ``traces`` holds the trace
    settings (the server application's)."""
    if router is None:
        router = Router()
    router.serve(runtime.model.name, runtime)
    return ModelDataPlane(
        ReplicaRegistry(runtime, cluster_stats),
        router,
        describe_elsewhere=describe_elsewhere,
        shared_memory=shared_memory,
        traces=traces,
    )


class DescribedModel:
    """A :class:`~deployments.protocol.dataplane.ServedModel` answered from its description: ready, and
    described, in every version it lists. Its statistics are a subclass's."""

    def __init__(self, description: ModelDescription) -> None:
        self.description = description

    def _check_version(self, version: str) -> None:
        if version and (not version.isdigit() or int(version) not in self.description.versions):
            raise NotFound(
                f"Request for unknown model: '{self.description.name}' version {version} is not found"
            )

    def is_ready(self, version: str = "") -> bool:
        try:
            self._check_version(version)
        except NotFound:
            return False
        return True

    def metadata(self, version: str = "") -> dict[str, Any]:
        self._check_version(version)
        versions = (int(version),) if version else tuple(sorted(self.description.versions))
        return model_metadata_document(self.description, versions)

    def config(self, version: str = "") -> dict[str, Any]:
        self._check_version(version)
        return dict(self.description.config_json)


class HostedModel(DescribedModel):
    """A pooled model of a model host: available (so ready, as Triton reports an available model)
    whether or not it is resident right now."""

    def __init__(self, host: ModelHost, description: ModelDescription, cluster_stats: StatsFn | None) -> None:
        super().__init__(description)
        self.host = host
        self._cluster_stats = cluster_stats

    async def statistics(self, version: str = "") -> list[dict[str, Any]]:
        self._check_version(version)
        name = self.description.name
        if self._cluster_stats is not None:
            stats: list[dict[str, Any]] = (await self._cluster_stats(name, version))["model_stats"]
            return stats
        own = self.host.statistics(name)
        return [s for s in own if s["version"] == version] if version else own


class ServedElsewhere(DescribedModel):
    """A model with replicas of its own, asked of a model host: HAProxy sends every model route it does
    not know yet to the hosts (their route is the longest-prefix fallback of every model's), as it does
    for a model just loaded until its own route reaches HAProxy. Described by the server application
    as it serves the model now (its error is the answer: a model unloaded is not ready); its
    statistics are the server's."""

    def __init__(self, description: ModelDescription, statistics: StatsFn) -> None:
        super().__init__(description)
        self._statistics = statistics

    async def statistics(self, version: str = "") -> list[dict[str, Any]]:
        self._check_version(version)
        stats: list[dict[str, Any]] = (await self._statistics(self.description.name, version))["model_stats"]
        return stats


class HostRegistry:
    """The registry of a model host replica: every pooled model it knows of (``ModelHost.known``)."""

    def __init__(self, host: ModelHost, cluster_stats: StatsFn | None = None) -> None:
        self.host = host
        self._cluster_stats = cluster_stats

    def get(self, name: str) -> HostedModel:
        description = self.host.known.get(name)
        if description is None:
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        return HostedModel(self.host, description, self._cluster_stats)

    def describe(self, name: str) -> ModelDescription:
        return self.get(name).description

    def ready(self) -> bool:
        return True

    def served(self) -> list[str]:
        return list(self.host.served())

    async def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return [
            {"name": name, "version": str(v), "state": "READY"}
            for name, model in sorted(self.host.known.items())
            for v in sorted(model.versions)
        ]

    async def load(self, name: str, parameters: Mapping[str, Any]) -> None:
        raise Unsupported("the repository API is served at /v2/repository")

    async def unload(self, name: str, parameters: Mapping[str, Any]) -> None:
        raise Unsupported("the repository API is served at /v2/repository")


def host_dataplane(
    host: ModelHost,
    cluster_stats: StatsFn | None = None,
    remote: ModelExecutor | None = None,
    describe_elsewhere: Describe | None = None,
    shared_memory: SharedMemory | None = None,
    traces: TraceControl | None = None,
    statistics_elsewhere: StatsFn | None = None,
) -> ModelDataPlane:
    """The data plane of a model host replica: every available pooled model runs here (loaded on its
    first request); ``remote`` reaches every other model. A name the host does not pool is described
    by ``describe_elsewhere`` (the server application), whose error (a model still loading, an
    unknown one) is the answer, and is then answered as the server answers it
    (:class:`ServedElsewhere`, its statistics from ``statistics_elsewhere``)."""

    async def discover(name: str) -> bool:
        try:
            await host.description(name)
        except NotFound:
            return False
        return True

    # with model namespacing, a name the server described as the one known copy of a name in several
    # repositories -> that copy's key: its requests go there, answered with the name asked for
    keys: dict[str, str] = {}

    async def elsewhere(name: str) -> ServedElsewhere:
        if describe_elsewhere is None:
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        keys.pop(name, None)
        description = await describe_elsewhere(name, "")  # raises the server's own answer for the model
        if description.name != name:
            keys[name] = description.name
        return ServedElsewhere(description, statistics_elsewhere or _no_statistics)

    router = Router(local=HostedModels(host), remote=remote)
    return ModelDataPlane(
        HostRegistry(host, cluster_stats),
        router,
        describe_elsewhere=describe_elsewhere,
        discover=discover,
        elsewhere=elsewhere,
        shared_memory=shared_memory,
        traces=traces,
        key_for=lambda name: keys.get(name, name),
    )


async def _no_statistics(name: str, version: str) -> dict[str, Any]:
    raise Unsupported(f"statistics of model '{name}' are served by the server application")
