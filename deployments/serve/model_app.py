"""The Serve deployment of one model: its replica answers the model's HTTP routes itself."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncGenerator
from typing import Any

from ray import serve

import ensembles
from deployments.backends.python_api.context import as_stub_process
from deployments.backends.python_api.logger import log_to_stderr
from deployments.inference import InferRequest, InferResponse
from deployments.protocol.http import ModelHTTPApp
from deployments.protocol.shared_memory import SharedMemory
from deployments.replica import replica_dataplane
from deployments.runtime import batch_execute, response_cache
from deployments.runtime.model import ModelRuntime
from deployments.runtime.router import REPLICA_SNAPSHOT, Ranks, Router
from deployments.runtime.stats import PushGate, keep_latency_windows
from deployments.serve import grpc_ingress, hooks, ingress, local_sockets, logs, ray_metrics, reloads, spare
from deployments.serve.devices import pin_replica_gpu
from deployments.serve.names import hosted_key, model_app_name, model_route, stats_path
from deployments.serve.peers import RemoteModels, ReplicaCalls, ReplicaDirectory
from deployments.serve.rate_limiter import rate_gate
from deployments.serve.response_writes import coalesce_response_writes
from deployments.serve.server_api import ServerClient, ServerHolds, ServerRegions, summed_stats
from deployments.serve.traces import RemoteTraces, follow_traces
from deployments.settings import ServerSettings, compile_header_pattern
from deployments.tracing import configure as configure_tracing
from repository_loader.errors import Unavailable
from repository_loader.model import InstanceKind, ModelDescription
from repository_loader.revision import uncounted, version_signatures

logger = logging.getLogger("ray.serve")


def _rank_number(rank: Any) -> int:
    """Serve's rank of a replica within its deployment: a ``ReplicaRank`` (its ``rank``), or the number."""
    return int(getattr(rank, "rank", rank))


# Recovery (docs/recovery.md): Serve checks each replica every second, so a dead or hung one is replaced
# within about a second plus the model's load time; an unload waits at most 5 s for requests still running.
@serve.deployment(
    name="model", health_check_period_s=1.0, health_check_timeout_s=10.0, graceful_shutdown_timeout_s=5.0
)
@serve.ingress()
class ModelDeployment:
    """Loads the model (every selected version, warmup included) before it reports ready.

    Built from a deployment plan entry of the model (``DeploymentEntry.init_kwargs``), one per
    instance group: the instance kind its replicas run as, how many replicas the model has over all
    its groups, the model's rank of this deployment's first replica, and the GPU each rank of this
    deployment targets (None: no GPU). Every group's replica answers the model's own routes
    (``/v2/models/<m>``) through the direct lane, which is how HAProxy reaches the replicas of
    later groups (``deployments.serve.haproxy_shim``).
    """

    async def __init__(  # type: ignore[misc]  # Serve awaits an async constructor
        self,
        model: ModelDescription,
        settings: ServerSettings,
        instance_kind: str = "KIND_CPU",
        replicas: int = 1,
        composing: dict[str, ModelDescription] | None = None,
        gpu_ids: list[int | None] | None = None,
        rank_offset: int = 0,
        group_index: int = 0,
        passive: bool = False,
    ) -> None:
        coalesce_response_writes()
        # HAProxy on this node reaches the replica through a Unix socket
        local_sockets.install(settings.replica_http == "own", settings.busy_poll_us)
        log_to_stderr(settings.log_settings)  # pb_utils.Logger lines into the replica's worker log
        as_stub_process()  # sys.argv as model code sees it under tritonserver
        ensembles.register()  # an ensemble's replica runs the ensemble backend
        ray_metrics.export_to_ray()  # Triton's counters of this process's models, through Ray
        keep_latency_windows(settings.metrics_config.summary_latencies)  # the latency summaries' durations
        response_cache.configure(settings.response_cache_bytes)  # one cache for the models of this process
        self.model = model
        self.settings = settings
        self._route = model_route(model.name)
        self.replicas = replicas
        self.rank_offset = rank_offset
        kind = InstanceKind(instance_kind)
        context = serve.get_replica_context()
        self.visible_gpus = pin_replica_gpu(gpu_ids or [], context) if kind == InstanceKind.GPU else None
        self.replica_id = context.replica_id.unique_id if context else str(os.getpid())
        self.instance_name = instance_name(model, group_index, context)
        # every other replica is reached through one directory and one session; the router decides
        self.server = ServerClient()
        # a testing hook: a model's replicas are Triton's instances of it, whose queues it counts together
        shared = ServerHolds(self.server, self.replica_id) if replicas > 1 else None
        batch_execute.hold_first_batches(settings.delay_scheduler, settings.backlog_delay_scheduler, shared)
        self._directory = ReplicaDirectory(self.server)
        self._calls = ReplicaCalls(self._directory)
        remote = RemoteModels(calls=self._calls if settings.direct_routes else None, server=self.server)
        self._remote = remote
        self._ranks: Ranks | None = None
        sequences = model.sequence_batching is not None and not model.sequence_batching.iterative
        if sequences and context is not None and not passive:  # a passive instance owns no sequence
            # ranked over the replicas of every instance group of the model: one owner per sequence (an
            # iterative sequence is one request, which any replica can run); a model of one replica is
            # ranked too, for a count change that keeps it
            self._ranks = Ranks(model.name, rank_offset + _rank_number(context.rank), replicas)
        # a passive instance runs none of its model's requests (repository_loader.plan, "passive")
        taking = any(not g.passive for g in model.instance_groups)
        self.router = Router(
            remote=remote,
            ranks=self._ranks,
            owners=self._calls,
            passive={model.name: taking} if passive else None,
        )
        self._group_index = group_index
        self.runtime = ModelRuntime(
            model,
            instance_kind=kind,
            device_id=0,
            executor=self.router,
            instance_name=self.instance_name,
            composing=composing,
            gate=self._gate(model),
        )
        self.load_error: str | None = None
        try:
            await self.runtime.load()
        except Exception as exc:  # reported to the server, which marks the model UNAVAILABLE
            self.load_error = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
            logger.error("model '%s' failed to load: %s", model.name, self.load_error)
        # every replica pushes: the server keeps a dead replica's last snapshot, so statistics and metrics
        # stay cumulative across replica restarts
        self._push_task: asyncio.Task[None] | None = asyncio.get_running_loop().create_task(
            self._push_stats()
        )
        self._gauges = asyncio.get_running_loop().create_task(ray_metrics.export_gauges(self._pending))
        self.shared_memory = SharedMemory(ServerRegions(self.server), follower=self.replica_id)
        traces = RemoteTraces(self.server)
        configure_tracing(settings.trace, take=traces.take)
        self._traces = asyncio.get_running_loop().create_task(follow_traces(self.server, self.replica_id))
        dataplane = replica_dataplane(
            self.runtime,
            self._cluster_stats,
            self.router,
            self.server.describe,
            self.shared_memory,
            traces=traces,
        )
        self._app = ModelHTTPApp(dataplane, model.name, settings.limits)
        # a later instance group's replica answers the model's routes only directly: Serve would refuse
        # them as outside its own application's route
        own_group = context is None or context.app_name == model_app_name(model.name)
        self._asgi = self._answering_snapshots(self._app)
        ingress.serve_directly(self._route, self._asgi, enabled=settings.direct_routes or not own_group)
        self._app.restricted = settings.http_restricted_api
        self._app.header_forward = compile_header_pattern(settings.http_header_forward_pattern)
        self._kind = kind
        self._reloads = asyncio.get_running_loop().create_task(self._follow_reloads())
        self._logs = asyncio.get_running_loop().create_task(
            logs.follow(self.server, settings.log_settings, log_to_stderr)
        )
        self._publish: asyncio.Task[None] | None = None
        if self._ranks is not None and context is not None:
            self._publish = asyncio.get_running_loop().create_task(self._publish_rank(context.app_name))
        if settings.allow_grpc:  # ModelInfer calls and streams that start with this model, routed by HAProxy
            grpc_ingress.serve_grpc(dataplane, grpc_ingress.grpc_options(settings))
        # an idle worker on this node for the next model replica (docs/recovery.md, "Spare workers")
        self._spare = (
            asyncio.get_running_loop().create_task(spare.keep_spare()) if settings.spare_worker else None
        )

    def _gate(self, model: ModelDescription) -> Any:
        """What each execution of this replica's instance holds (docs/rate_limiter.md); None: nothing."""
        groups = model.instance_groups
        if self.settings.rate_limit == "off" or self._group_index >= len(groups):
            return None
        gpus = (self.visible_gpus or "").split(",")
        device = int(gpus[0]) if gpus[0].isdigit() else 0
        gate = rate_gate(self.settings, groups[self._group_index], self.replica_id, device)
        return None if gate is None else gate.execution

    def __serve_build_asgi_app__(self) -> Any:
        return self._asgi

    def _answering_snapshots(self, app: Any) -> Any:
        """``app``, with a sibling's request for this replica's own counts answered before it: a
        statistics or metrics read sums every replica's counts as they are at that moment."""

        path = stats_path(self.model.name)

        async def asgi(scope: Any, receive: Any, send: Any) -> None:
            if (
                scope["type"] == "http"
                and scope["path"] == path
                and any(k == REPLICA_SNAPSHOT for k, _ in scope["headers"])
            ):
                # with the statistics of the models this replica hosts for its ensemble (read now too)
                body = json.dumps(
                    {**self.metrics_snapshot(), "hosted": self.runtime.hosted_statistics()}
                ).encode()
                headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
            await app(scope, receive, send)

        return asgi

    async def _publish_rank(self, app: str, timeout_s: float = 120.0) -> None:
        """Register which replica holds this rank (docs/sequence.md), once the server answers."""
        import ray

        assert self._ranks is not None
        actor = ray.get_runtime_context().get_actor_name() or ""
        deadline = time.monotonic() + timeout_s
        while True:
            rank = self._ranks.rank
            try:
                await self._directory.register_rank(self.model.name, rank, (app, actor))
                return
            except Exception as exc:  # the server may be starting
                if time.monotonic() > deadline:
                    logger.error("model '%s': rank %d not registered: %s", self.model.name, rank, exc)
                    return
                await asyncio.sleep(0.2)

    async def reconfigure(self, user_config: Any, rank: Any = None) -> None:
        """Serve's call after it renumbered its replicas (hook ``reconfigure_rank``): after a count
        change removed some, a replica serving on may take a lower rank. A stateful model's replica
        then owns that rank's sequences from now on (those it holds stay here; docs/sequence.md)."""
        ranks, context = self._ranks, serve.get_replica_context()
        if ranks is None or rank is None or context is None:
            return
        number = self.rank_offset + _rank_number(rank)
        if number == ranks.rank:
            return
        logger.info(
            "model '%s': this replica now holds rank %d (was %d)", self.model.name, number, ranks.rank
        )
        ranks.rank = number
        if self._publish is not None:
            self._publish.cancel()
        self._publish = asyncio.get_running_loop().create_task(self._publish_rank(context.app_name))

    def sequence_routing(self) -> dict[str, int]:
        """This replica's rank, how many sequence requests it answered itself / sent to their owner, and
        how many new sequences it lent to another replica for want of a free slot."""
        if self._ranks is None:
            return {}
        return {
            "rank": self._ranks.rank,
            "local": self.router.answered_here,
            "forwarded": self.router.sent_to_owner,
            "lent": self.router.lent_count,
        }

    async def _follow_reloads(self) -> None:
        """Reloads ordered by the server: a new description loaded beside this one, then swapped in."""
        await reloads.follow(
            self.model.name,
            self.replica_id,
            self.server,
            self._prepare_runtime,
            self._commit_runtime,
            self._discard_runtime,
            self._describe,
        )

    async def _prepare_runtime(
        self, model: ModelDescription, composing: dict[str, ModelDescription] | None
    ) -> ModelRuntime:
        # the versions whose files and configuration did not change serve on as loaded (Triton's reload)
        signatures = await asyncio.to_thread(version_signatures, model)
        keep = self.runtime.reusable(model, signatures) if self.load_error is None else {}
        runtime = ModelRuntime(
            model,
            instance_kind=self._kind,
            device_id=0,
            executor=self.router,
            instance_name=self.instance_name,
            composing=composing,
            gate=self._gate(model),
            keep=keep,
            signatures=signatures,
        )
        try:
            await runtime.load()  # every other version, warmup included
        except BaseException:
            await runtime.close()
            raise
        return runtime

    async def _commit_runtime(self, runtime: ModelRuntime) -> None:
        old = self.runtime
        self.runtime, self.model, self.load_error = runtime, runtime.model, None
        self._app.dataplane.registry.swap(runtime)  # type: ignore[attr-defined]
        self.router.serve(runtime.model.name, runtime)
        runtime.take_over(old)  # the versions it kept are its own now: closing the old one spares them
        logger.info("model '%s' now serves versions %s", runtime.model.name, list(runtime.model.versions))
        await asyncio.sleep(1.0)  # requests already inside the old runtime finish there
        await old.close()

    async def _discard_runtime(self, runtime: ModelRuntime) -> None:
        await runtime.close()

    async def _describe(self, model: ModelDescription, replicas: int) -> None:
        """The model's new description after its instance counts changed (this replica stays): what
        its config reports, and for a stateful model the number of ranks new sequences are spread
        over; a description that differs in more is not this replica's to take."""
        if uncounted(model) != uncounted(self.runtime.model):
            logger.warning("model '%s': a new description that changes more than counts, ignored", model.name)
            return
        self.runtime.model = self.model = model
        if self._ranks is not None and replicas > 0:
            self._ranks.world_size = self.replicas = replicas

    def load_status(self) -> dict[str, Any]:
        return {"ready": self.load_error is None and self.runtime.is_ready(), "error": self.load_error}

    def description(self) -> ModelDescription:
        return self.runtime.model

    def answered_directly(self) -> int | None:
        """HTTP requests this replica answered without Serve's wrapper (None: the lane is off)."""
        return ingress.answered_directly(self._route)

    async def infer_internal(self, request: InferRequest) -> InferResponse:
        if self.load_error is not None:
            raise Unavailable(f"model '{self.model.name}' is unavailable: {self.load_error}")
        return await self.router.infer(request)

    async def infer_stream_internal(self, request: InferRequest) -> AsyncGenerator[InferResponse, None]:
        """Every response of ``request`` as the model sends it (a decoupled model: 0..N, the last
        ``final``). Called with ``handle.options(stream=True)``; a caller that cancels the stream
        cancels the request (the Python model sees ``request.is_cancelled()``)."""
        if self.load_error is not None:
            raise Unavailable(f"model '{self.model.name}' is unavailable: {self.load_error}")
        stream = self.router.stream(request)
        try:
            async for response in stream:
                yield response
        finally:
            await stream.aclose()

    def record_autoscaling_stats(self) -> dict[str, float]:
        """What Serve's autoscaling scales on, where the model's config turns it on
        (``repository_loader.autoscaling``): the requests inside this replica, over every path
        (the direct lane Serve's own count misses, handle calls, streams)."""
        return {hooks.RUNNING_REQUESTS_KEY: float(self.runtime.ongoing)}

    def stats_snapshot(self) -> list[dict[str, Any]]:
        return self.runtime.statistics()

    def metrics_snapshot(self) -> dict[str, Any]:
        """What Triton's metrics endpoint prints of this replica, named by the replica (pushed every
        second, and asked of one replica on each scrape so that its counters are current)."""
        return {**self.runtime.metrics_snapshot(), "replica": self.replica_id, "load_error": self.load_error}

    def _pending(self) -> dict[tuple[str, str], int]:
        return {(self.model.name, str(v)): r.pending for v, r in self.runtime.versions.items()}

    def check_health(self) -> None:
        if self.load_error is None and not self.runtime.is_ready():
            raise RuntimeError(f"model '{self.model.name}' is not ready")
        hung = self.runtime.hung()
        if hung is not None:  # Serve replaces this replica: the model's thread cannot be taken back
            raise RuntimeError(hung)

    async def _push_stats(self) -> None:
        """This replica's statistics and metrics, and those of the models an ensemble hosts in this
        replica (they count toward those models' own): checked every ``stats_push_interval_s``, pushed
        when they changed or ``stats_heartbeat_s`` after the last push. An idle replica costs the
        server one call per heartbeat, not one a second."""
        gate = PushGate(self.settings.stats_heartbeat_s)
        while True:
            await asyncio.sleep(self.settings.stats_push_interval_s)
            current = (self.metrics_snapshot(), self.runtime.hosted_statistics())
            if not gate.due(current):
                continue
            try:
                await self.server.report_metrics(self.model.name, self.replica_id, current[0])
                for name, snapshot in current[1].items():
                    await self.server.report_stats(
                        name, hosted_key(self.replica_id, self.model.name), snapshot
                    )
                gate.sent(current)
            except Exception as exc:  # the server may be restarting; try again next round
                logger.debug("stats push failed: %s", exc)

    async def _cluster_stats(self, name: str, version: str) -> dict[str, Any]:
        """This replica's statistics summed with those of the model's other replicas, asked now (what a
        replica that does not answer pushed last stands for it), and copies hosted by ensembles; this
        replica's alone where the server does not answer."""
        import ray

        siblings = await self._remote.replica_snapshots(
            name, skip=ray.get_runtime_context().get_actor_name() or ""
        )
        asked = {replica: snapshot["stats"] for replica, snapshot in siblings.items()}
        return await summed_stats(
            self.server, name, self.replica_id, self.stats_snapshot(), version, remember=True, siblings=asked
        )

    async def __del__(self) -> None:
        ingress.withdraw(self._route)
        grpc_ingress.withdraw()
        self._reloads.cancel()
        self._logs.cancel()
        self._traces.cancel()
        self._gauges.cancel()
        if self._publish is not None:
            self._publish.cancel()
        await self._calls.close()
        await self.shared_memory.aclose()
        if self._push_task is not None:
            self._push_task.cancel()
        if self.runtime.hung() is None:  # a hung model's thread never returns: the process just ends
            await self.runtime.close()


def instance_name(model: ModelDescription, group_index: int, context: Any) -> str:
    """Triton's name of this replica's model instance, ``<group name>_<index>``: the name of the
    model's ``group_index``-th instance group (Triton's default ``<model>_<group index>``), the index
    from the replica's rank in its group."""
    groups = model.instance_groups
    named = groups[group_index].name if group_index < len(groups) else ""
    group = named or f"{model.name}_{group_index}"
    if context is None:
        return f"{group}_0"
    own: Any = context.rank
    return f"{group}_{int(getattr(own, 'rank', own) or 0)}"
