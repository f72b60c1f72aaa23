"""The calls between model replicas and the server application, typed, in one place.

A replica reaches the server application (``ServerDeployment``) only through :class:`ServerClient`,
and the server reaches a model's replicas only through :class:`ReplicaClient`: each method names
the deployment method it calls, with the same parameters. ``tests/serve/test_server_api.py`` checks
every method here against the deployment classes' signatures, so a renamed or changed deployment
method fails there, not on the first call in production.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

from deployments.inference import InferRequest, InferResponse
from deployments.protocol.region_table import Answer, Region, TableState
from deployments.serve.names import MODEL_DEPLOYMENT, SERVER_APP, SERVER_DEPLOYMENT
from deployments.settings import LogSettings
from deployments.timeouts import within
from deployments.tracing.store import TraceState
from repository_loader.errors import ServerError
from repository_loader.model import ModelDescription
from repository_loader.plan import HOST_APP, HOST_DEPLOYMENT

logger = logging.getLogger(__name__)

GroupApps = tuple[tuple[str, int], ...]
"""A model's Serve applications, one per instance group in group order, each with its replica count."""
Member = tuple[str, str]
"""Where a rank of a stateful model runs: its application and its replica's actor name."""


def server_error(exc: BaseException) -> ServerError | None:
    """The server's own error that a failed handle call carries (Ray wraps it), if any."""
    if isinstance(exc, ServerError):
        return exc
    cause = getattr(exc, "cause", None) or getattr(exc, "__cause__", None)
    return cause if isinstance(cause, ServerError) else None


class ServerClient:
    """The server application's methods, as a model replica calls them (``ServerDeployment``)."""

    def __init__(self, handle: Any = None) -> None:
        self._handle: Any = handle

    @property
    def handle(self) -> Any:
        if self._handle is None:
            from ray import serve

            self._handle = serve.get_deployment_handle(SERVER_DEPLOYMENT, app_name=SERVER_APP)
        return self._handle

    async def _call(self, method: Any, *args: Any, timeout_s: float | None = None) -> Any:
        call = method.remote(*args)
        try:
            return await (call if timeout_s is None else within(call, timeout_s))
        except Exception as exc:
            own = server_error(exc)
            if own is not None:
                raise own from None
            raise

    async def pooled(self, name: str) -> tuple[ModelDescription, int] | None:
        found: tuple[ModelDescription, int] | None = await self._call(self.handle.pooled, name)
        return found

    async def pool_generations(self) -> dict[str, int]:
        found: dict[str, int] = await self._call(self.handle.pool_generations)
        return found

    async def model_apps(self, name: str, timeout_s: float | None = None) -> GroupApps:
        found = await self._call(self.handle.model_apps, name, timeout_s=timeout_s)
        return tuple((str(app), int(replicas)) for app, replicas in found)

    async def describe(self, name: str, version: str) -> ModelDescription:
        found: ModelDescription = await self._call(self.handle.describe, name, version)
        return found

    async def model_statistics(self, name: str, version: str) -> dict[str, Any]:
        found: dict[str, Any] = await self._call(self.handle.model_statistics, name, version)
        return found

    async def sequence_register(self, model: str, rank: int, member: Member) -> None:
        await self._call(self.handle.sequence_register, model, rank, member)

    async def sequence_members(self, model: str) -> dict[int, Member]:
        found: dict[int, Member] = await self._call(self.handle.sequence_members, model)
        return found

    async def report_stats(self, model: str, replica: str, snapshot: list[dict[str, Any]]) -> None:
        await self._call(self.handle.report_stats, model, replica, snapshot)

    async def report_host(self, replica: str, status: dict[str, Any]) -> None:
        await self._call(self.handle.report_host, replica, status)

    async def report_metrics(self, model: str, replica: str, snapshot: dict[str, Any]) -> None:
        await self._call(self.handle.report_metrics, model, replica, snapshot)

    async def cluster_stats(
        self,
        model: str,
        replica: str,
        snapshot: list[dict[str, Any]],
        remember: bool = True,
        siblings: dict[str, list[dict[str, Any]]] | None = None,
    ) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = await self._call(
            self.handle.cluster_stats, model, replica, snapshot, remember, siblings
        )
        return found

    async def reload_order(self, model: str, seen: tuple[int, str], timeout_s: float) -> Any:
        return await self._call(self.handle.reload_order, model, seen, timeout_s)

    async def reload_report(
        self, model: str, generation: int, replica: str, phase: str, error: str | None
    ) -> None:
        await self._call(self.handle.reload_report, model, generation, replica, phase, error)

    async def control_load(self, name: str, config: str, files: dict[str, bytes]) -> None:
        await self._call(self.handle.control_load, name, config, files)

    async def control_unload(self, name: str, unload_dependents: bool) -> None:
        await self._call(self.handle.control_unload, name, unload_dependents)

    async def control_is_ready(self, name: str, version: str) -> bool:
        return bool(await self._call(self.handle.control_is_ready, name, version))

    async def index(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = await self._call(self.handle.index)
        return found

    async def deployed_plan(self) -> dict[str, list[dict[str, Any]]]:
        found: dict[str, list[dict[str, Any]]] = await self._call(self.handle.deployed_plan)
        return found

    async def is_started(self) -> bool:
        return bool(await self._call(self.handle.is_started))

    async def log_settings(self, applied: LogSettings | None, timeout_s: float) -> LogSettings | None:
        found: LogSettings | None = await self._call(self.handle.log_settings, applied, timeout_s)
        return found

    async def shm_region(self, name: str, follower: str) -> tuple[Region, int]:
        found: tuple[Region, int] = await self._call(self.handle.shm_region, name, follower)
        return found

    async def shm_follow(
        self, follower: str, seen: int, timeout_s: float, answer: Answer | None
    ) -> TableState:
        state: TableState = await self._call(self.handle.shm_follow, follower, seen, timeout_s, answer)
        return state

    async def shm_register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        await self._call(self.handle.shm_register, name, key, offset, byte_size)

    async def shm_unregister(self, name: str) -> None:
        await self._call(self.handle.shm_unregister, name)

    async def shm_status(self, name: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = await self._call(self.handle.shm_status, name)
        return found

    async def trace_settings(self, model: str | None) -> dict[str, Any]:
        found: dict[str, Any] = await self._call(self.handle.trace_settings, model)
        return found

    async def trace_update(self, model: str | None, changes: dict[str, Any]) -> dict[str, Any]:
        found: dict[str, Any] = await self._call(self.handle.trace_update, model, changes)
        return found

    async def trace_take(self, model: str) -> bool:
        return bool(await self._call(self.handle.trace_take, model))

    async def trace_state(self, replica: str, seen: int, timeout_s: float) -> TraceState | None:
        found: TraceState | None = await self._call(self.handle.trace_state, replica, seen, timeout_s)
        return found

    async def hold_report(
        self, model: str, reporter: str, queued: int, backlogged: int, requests: int, backlog: int
    ) -> bool:
        return bool(
            await self._call(self.handle.hold_report, model, reporter, queued, backlogged, requests, backlog)
        )

    async def hold_forget(self, model: str, reporter: str) -> None:
        await self._call(self.handle.hold_forget, model, reporter)


async def summed_stats(
    server: ServerClient,
    model: str,
    replica: str,
    own: list[dict[str, Any]],
    version: str,
    remember: bool,
    siblings: dict[str, list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """The statistics document of ``model`` (of ``version`` where given) that a replica answers: its
    ``own`` counts summed with the others' (``ServerClient.cluster_stats``); its own alone where the
    server does not answer."""
    try:
        merged = await server.cluster_stats(model, replica, own, remember, siblings)
    except Exception as exc:
        logger.warning("statistics of the other replicas of '%s' unavailable: %s", model, exc)
        merged = own
    if version:
        merged = [s for s in merged if s["version"] == str(version)]
    return {"model_stats": merged}


class ServerRegions:
    """The server application's shared-memory table, as a model replica reaches it (a
    ``deployments.protocol.shared_memory.RegionSource``)."""

    def __init__(self, server: ServerClient) -> None:
        self.server = server

    async def region(self, name: str, follower: str) -> tuple[Region, int]:
        return await self.server.shm_region(name, follower)

    async def follow(
        self, follower: str, seen: int, timeout_s: float, answer: Answer | None = None
    ) -> TableState:
        return await self.server.shm_follow(follower, seen, timeout_s, answer)

    async def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        await self.server.shm_register(name, key, offset, byte_size)

    async def unregister(self, name: str) -> None:
        await self.server.shm_unregister(name)

    async def status(self, name: str) -> list[dict[str, Any]]:
        return await self.server.shm_status(name)


class ServerHolds:
    """The first-batch hold counted over a model's replicas (``TRITONSERVER_DELAY_SCHEDULER``, a
    ``deployments.runtime.batch_execute.HeldCounts``): each held scheduler reports its counts to the
    server application's ``HoldBoard``, which adds up the model's."""

    def __init__(self, server: ServerClient, replica: str) -> None:
        self.server = server
        self.replica = replica
        self._schedulers = itertools.count()

    def __call__(self, model: str, requests: int, backlog: int) -> ServerHeldCount:
        reporter = f"{self.replica}/{next(self._schedulers)}"
        return ServerHeldCount(self.server, model, reporter, requests, backlog)


class ServerHeldCount:
    """One scheduler's count on the server application's board (a ``HeldCount``)."""

    def __init__(self, server: ServerClient, model: str, reporter: str, requests: int, backlog: int) -> None:
        self.server = server
        self.model = model
        self.reporter = reporter
        self.requests = requests
        self.backlog = backlog

    async def reached(self, queued: int, backlogged: int) -> bool:
        return await self.server.hold_report(
            self.model, self.reporter, queued, backlogged, self.requests, self.backlog
        )

    async def forget(self) -> None:
        await self.server.hold_forget(self.model, self.reporter)


class ReplicaClient:
    """A model deployment's methods, as the server and other replicas call them (``ModelDeployment``).

    ``handle`` is the deployment handle of one of the model's applications (Serve picks the replica).
    """

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def infer_internal(self, request: InferRequest) -> InferResponse:
        response: InferResponse = await self.handle.infer_internal.remote(request)
        return response

    def infer_stream_internal(self, request: InferRequest) -> Any:
        """The streaming call (``responses``: an async iterator of the model's responses, with
        ``cancel()``)."""
        return self.handle.options(stream=True).infer_stream_internal.remote(request)

    async def load_status(self) -> dict[str, Any]:
        status: dict[str, Any] = await self.handle.load_status.remote()
        return status

    async def description(self) -> ModelDescription:
        """The model description the replica serves (after any in-place reload)."""
        model: ModelDescription = await self.handle.description.remote()
        return model

    async def metrics_snapshot(self) -> dict[str, Any]:
        snapshot: dict[str, Any] = await self.handle.metrics_snapshot.remote()
        return snapshot

    async def stats_snapshot(self) -> list[dict[str, Any]]:
        snapshot: list[dict[str, Any]] = await self.handle.stats_snapshot.remote()
        return snapshot


def replica_client(app: str) -> ReplicaClient:
    """The client of application ``app``'s model deployment."""
    from ray import serve

    deployment = HOST_DEPLOYMENT if app == HOST_APP else MODEL_DEPLOYMENT
    return ReplicaClient(serve.get_deployment_handle(deployment, app_name=app))


__all__ = [
    "GroupApps",
    "Member",
    "ReplicaClient",
    "ServerClient",
    "ServerHeldCount",
    "ServerHolds",
    "ServerRegions",
    "replica_client",
    "server_error",
]
