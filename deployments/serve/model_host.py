"""The model host deployment: each replica serves every pooled model, loaded on its first request.

One Serve application (``repository_loader.plan.HostEntry``, ``triton-hosts``) at ``/v2/models``, the
longest-prefix fallback of the model routes: a model with a deployment of its own keeps its own route,
and HAProxy sends every other model's requests to a host replica (``deployments.serve.haproxy_shim``
hashes the model name consistently over the host replicas, so a model sticks to one of them while
that one is not overloaded). Inside, :class:`~deployments.runtime.host.ModelHost` loads and evicts
(docs/hosts.md); the router (``deployments.runtime.router``) runs every pooled model here and sends
calls for other models to their replicas, as any replica does.

Which models are pooled is the server application's: a host asks it for a model's description on
that model's first request, and every ``POOL_REFRESH_S`` for the generation of every pooled model,
forgetting models that were unloaded or changed since (they load again, as changed, on their next
request). Statistics of every model the replica ran are pushed to the server application like a
model replica's, so ``/v2/models/stats`` and ``/metrics`` count pooled models.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncGenerator
from typing import Any

import ray
from ray import serve

import ensembles
from deployments import custom_metrics
from deployments.backends.python_api.context import as_stub_process
from deployments.backends.python_api.logger import log_to_stderr
from deployments.inference import InferRequest, InferResponse
from deployments.protocol.http import ServerHTTPApp
from deployments.protocol.shared_memory import SharedMemory
from deployments.replica import host_dataplane
from deployments.runtime import batch_execute, response_cache
from deployments.runtime.gpu_memory import GpuMemory, gpu_budgets
from deployments.runtime.host import ModelHost
from deployments.runtime.model import ModelRuntime
from deployments.runtime.stats import PushGate, keep_latency_windows
from deployments.serve import grpc_ingress, hooks, ingress, local_sockets, logs, ray_metrics, spare
from deployments.serve.names import hosted_key
from deployments.serve.peers import RemoteModels, ReplicaCalls, ReplicaDirectory
from deployments.serve.response_writes import coalesce_response_writes
from deployments.serve.server_api import ServerClient, ServerRegions, summed_stats
from deployments.serve.traces import RemoteTraces, follow_traces
from deployments.settings import ServerSettings, compile_header_pattern
from deployments.tracing import configure as configure_tracing
from repository_loader.model import InstanceKind, ModelDescription
from repository_loader.plan import HOST_APP, HOST_ROUTE, pooled_instances

logger = logging.getLogger("ray.serve")

POOL_REFRESH_S = 2.0  # how often a host compares its models with the server's pool
HOST_KEY = HOST_APP  # the statistics key suffix of a host replica's pushes


@serve.deployment(
    name="host", health_check_period_s=1.0, health_check_timeout_s=10.0, graceful_shutdown_timeout_s=5.0
)
@serve.ingress()
class ModelHostDeployment:
    """A model host replica (see the module's description)."""

    async def __init__(  # type: ignore[misc]
        self, settings: ServerSettings, memory_bytes: int, gpu_memory_bytes: int = 0
    ) -> None:
        coalesce_response_writes()
        # HAProxy on this node reaches the replica through a Unix socket
        local_sockets.install(settings.replica_http == "own", settings.busy_poll_us)
        ensembles.register()  # pooled ensembles run here
        log_to_stderr(settings.log_settings)
        as_stub_process()  # sys.argv as model code sees it under tritonserver
        ray_metrics.export_to_ray()
        keep_latency_windows(settings.metrics_config.summary_latencies)  # the latency summaries' durations
        response_cache.configure(settings.response_cache_bytes)
        batch_execute.hold_first_batches(settings.delay_scheduler, settings.backlog_delay_scheduler)
        self.settings = settings
        context = serve.get_replica_context()
        self.replica_id = context.replica_id.unique_id if context else str(os.getpid())
        own: Any = context.rank if context else 0  # a ReplicaRank (its ``rank``), or the number itself
        self._index = int(getattr(own, "rank", own) or 0)
        self.server = ServerClient()
        self._calls = ReplicaCalls(ReplicaDirectory(self.server))
        self.remote = RemoteModels(calls=self._calls if settings.direct_routes else None, server=self.server)
        self._generations: dict[str, int] = {}
        # a replica given GPUs runs pooled KIND_GPU models on its first one, and measures them (their
        # contexts made first) to keep a budget on each
        self._on_gpus = bool(ray.get_gpu_ids())
        self._gpus = GpuMemory.open() if self._on_gpus else None
        if self._on_gpus and self._gpus is None:
            logger.warning(
                "model host: GPUs %s given, but no CUDA driver to measure them: no GPU budget",
                ray.get_gpu_ids(),
            )
        self.host = ModelHost(
            self._describe,
            self._runtime,
            memory_bytes,
            measure_gpus=self._gpus.used if self._gpus else None,
            gpu_budget_bytes=gpu_budgets(self._gpus, gpu_memory_bytes) if self._gpus else None,
            describe_elsewhere=self._describe_elsewhere,
        )
        self.shared_memory = SharedMemory(ServerRegions(self.server), follower=self.replica_id)
        traces = RemoteTraces(self.server)
        configure_tracing(settings.trace, take=traces.take)
        dataplane = host_dataplane(
            self.host,
            cluster_stats=self._cluster_stats,
            remote=self.remote,
            describe_elsewhere=self.server.describe,
            shared_memory=self.shared_memory,
            traces=traces,
            statistics_elsewhere=self.server.model_statistics,
        )
        self.router = dataplane.router
        self._app = ServerHTTPApp(dataplane, limits=settings.limits)
        self._app.restricted = settings.http_restricted_api
        self._app.header_forward = compile_header_pattern(settings.http_header_forward_pattern)
        ingress.serve_directly(HOST_ROUTE, self._app, enabled=settings.direct_routes)
        if settings.allow_grpc:  # ModelInfer calls for pooled models, routed by HAProxy
            grpc_ingress.serve_grpc(dataplane, grpc_ingress.grpc_options(settings))
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._follow_pool()),
            loop.create_task(self._push_stats()),
            loop.create_task(logs.follow(self.server, settings.log_settings, log_to_stderr)),
            loop.create_task(follow_traces(self.server, self.replica_id)),
            loop.create_task(ray_metrics.export_gauges(self._pending)),
        ]
        if settings.spare_worker:  # an idle worker on this node for the next replica (docs/recovery.md)
            self._tasks.append(loop.create_task(spare.keep_spare()))

    def _pending(self) -> dict[tuple[str, str], int]:
        """Pending requests of each resident model's versions."""
        return {
            (name, str(version)): runtime.pending
            for name, resident in self.host.resident.items()
            for version, runtime in resident.runtime.versions.items()
        }

    def __serve_build_asgi_app__(self) -> Any:
        return self._app

    def record_autoscaling_stats(self) -> dict[str, float]:
        """What Serve's autoscaling of the hosts scales on (``model_host_max_replicas``): the requests
        inside this host replica, over every path, cold loads included."""
        return {hooks.RUNNING_REQUESTS_KEY: float(self.host.ongoing)}

    def _runtime(self, model: ModelDescription, **ensemble: Any) -> ModelRuntime:
        """A pooled ``KIND_GPU`` model runs on this replica's first GPU, whichever its group names; an
        ensemble gets its steps' descriptions (``ensemble``: ``ModelRuntime``'s keywords)."""
        on_gpu = self._on_gpus and any(g.kind == InstanceKind.GPU for g in model.instance_groups)
        return ModelRuntime(
            model,
            InstanceKind.GPU if on_gpu else InstanceKind.CPU,
            0,
            executor=self.router,
            instance_name=f"{model.name}_0_{self._index}",
            instances=pooled_instances(model),
            **ensemble,
        )

    async def _cluster_stats(self, name: str, version: str) -> dict[str, Any]:
        """A pooled model's statistics: this host's own, counted now, summed with what the other host
        replicas pushed last (HAProxy's hash sends a model to one host replica, but a busy one's
        overflow, or a lost node's models, go to another); this host's alone where the server does
        not answer."""
        key = hosted_key(self.replica_id, HOST_KEY)
        return await summed_stats(self.server, name, key, self.host.statistics(name), version, remember=False)

    async def _describe_elsewhere(self, name: str) -> ModelDescription:
        return await self.server.describe(name, "")

    async def _describe(self, name: str) -> ModelDescription | None:
        found = await self.server.pooled(name)
        if found is None:
            return None
        model, generation = found
        self._generations[name] = generation
        return model

    async def _follow_pool(self) -> None:
        """Forget models the server no longer pools as this host knows them (unloaded, or reloaded)."""
        while True:
            await asyncio.sleep(POOL_REFRESH_S)
            try:
                current = await self.server.pool_generations()
            except Exception as exc:  # the server may be restarting
                logger.debug("model host: pool not read: %s", exc)
                continue
            for name, generation in list(self._generations.items()):
                if current.get(name) != generation:
                    self._generations.pop(name, None)
                    await self.host.forget(name)

    async def _push_stats(self) -> None:
        """This replica's status, and the statistics and request metrics (failures, pending requests)
        of every model whose own changed since the last push (cumulative over its loads), in one
        call; a heartbeat without change."""
        gate = PushGate(self.settings.stats_heartbeat_s)
        sent: dict[str, list[dict[str, Any]]] = {}
        sent_metrics: dict[str, dict[str, Any]] = {}
        while True:
            await asyncio.sleep(self.settings.stats_push_interval_s)
            current = {name: self.host.statistics(name) for name in self.host.served()}
            changed = {name: stats for name, stats in current.items() if sent.get(name) != stats}
            metrics = {name: self.host.request_metrics(name) for name in self.host.served()}
            moved = {name: m for name, m in metrics.items() if sent_metrics.get(name) != m}
            status = {**self.host_status(), "stats": changed, "metrics": moved}
            if not changed and not moved and not gate.due(status):
                continue
            try:
                await self.server.report_host(hosted_key(self.replica_id, HOST_KEY), status)
                sent.update(changed)
                sent_metrics.update(moved)
                gate.sent(status)
            except Exception as exc:  # the server may be restarting; try again next round
                logger.debug("stats push failed: %s", exc)

    # --- what other replicas and the server call (``deployments.serve.server_api.ReplicaClient``) ----

    async def infer_internal(self, request: InferRequest) -> InferResponse:
        return await self.router.infer(request)

    async def infer_stream_internal(self, request: InferRequest) -> AsyncGenerator[InferResponse, None]:
        stream = self.router.stream(request)
        try:
            async for response in stream:
                yield response
        finally:
            await stream.aclose()

    def host_status(self) -> dict[str, Any]:
        """What this host holds: resident models with their footprints, its counters, and the custom
        metric families its models made."""
        return {
            "replica": self.replica_id,
            "budget_bytes": self.host.budget_bytes,
            "accounted_bytes": self.host.accounted_bytes(),
            "resident": {name: r.footprint for name, r in self.host.resident.items()},
            "gpu_budget_bytes": self.host.gpu_budget_bytes,
            "resident_gpu": {name: sum(r.gpu_footprint.values()) for name, r in self.host.resident.items()},
            "counters": {name: c.as_dict() for name, c in self.host.counters.items()},
            "custom": custom_metrics.snapshot(),  # its models' custom metric families, one process's
        }

    async def __del__(self) -> None:
        ingress.withdraw(HOST_ROUTE)
        grpc_ingress.withdraw()
        for task in self._tasks:
            task.cancel()
        await self._calls.close()
        await self.shared_memory.aclose()
        await self.host.close()


__all__ = ["ModelHostDeployment"]
