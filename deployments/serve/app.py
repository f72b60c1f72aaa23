"""The Ray Serve layer: the ``/v2`` server application and one application per model.

``serve run serve_config.yaml`` starts :func:`build_app`'s server deployment.
Its replica reads the repository and deploys every model as its own Serve
applications, one per instance group, exactly as the deployment plan's entries
for it say (``repository_loader.plan``), then answers health, server metadata, the
repository API and statistics across models through the one data plane
(``deployments.protocol.dataplane.ModelDataPlane``) over the model controller.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from ray import serve

from deployments.backends.python_api.logger import log_to_stderr
from deployments.control import ModelController
from deployments.custom_metrics import merge_snapshots as merge_custom_metrics
from deployments.protocol import metrics_http
from deployments.protocol.dataplane import ModelDataPlane, ServedModel
from deployments.protocol.log_settings import LogBoard
from deployments.protocol.region_table import Answer, Region, RegionTable, TableState
from deployments.protocol.shared_memory import SharedMemory
from deployments.runtime.batch_execute import HoldBoard
from deployments.runtime.metrics import HostGauges, merge_model_metrics, render_triton, settled
from deployments.runtime.rate_limit import check_limits
from deployments.runtime.router import Router
from deployments.runtime.stats import merge_snapshots
from deployments.serve import hooks, logs, request_path, spare
from deployments.serve.model_app import ModelDeployment
from deployments.serve.names import (
    MODEL_DEPLOYMENT,
    SERVER_APP,
    SERVER_DEPLOYMENT,
    is_group_app,
    model_app_name,
)
from deployments.serve.peers import RemoteModels, ReplicaCalls, ReplicaDirectory, ServedElsewhere, own_app
from deployments.serve.rate_limiter import limiter_actor
from deployments.serve.reloads import Order, ReloadBoard
from deployments.serve.server_api import GroupApps, Member, ReplicaClient, replica_client
from deployments.serve.traces import TraceBoard
from deployments.settings import LogSettings, ServerSettings, compile_header_pattern
from deployments.timeouts import within
from deployments.tracing import TraceState
from deployments.tracing import configure as configure_tracing
from deployments.tracing.control import LocalTraces
from repository_loader.errors import ServerError, Unavailable
from repository_loader.model import ModelDescription
from repository_loader.plan import (
    HOST_APP,
    MODEL_APP_PREFIX,
    ClusterResources,
    DeploymentEntry,
    DeploymentPlan,
    fitted,
    hosts_hint,
    keep_shares,
    plan_deployments,
    pooled,
    within_cpus,
)
from repository_loader.revision import code_version, files_digest

logger = logging.getLogger("ray.serve")
# what an operator must see where the server runs (stderr, Triton's format: the launching console)
console = logging.getLogger(__name__)

Snapshots = dict[str, dict[str, list[dict[str, Any]]]]


class RayDeployer:
    """Applies the deployment plan's entries to the running Serve instance, one model at a time: one
    Serve application per instance group of the model."""

    def __init__(self, settings: ServerSettings, resources: ClusterResources, instance: str = "") -> None:
        self.settings = settings
        self.resources = resources
        # this server's record in the cluster's key-value store (none without an instance: kept here)
        self._unloads_key = f"{instance}/unloaded" if instance else ""
        self._unloads: set[str] = set()
        self.plan: DeploymentPlan | None = None
        self.models: dict[str, ModelDescription] = {}
        self.deployed: dict[str, tuple[DeploymentEntry, ...]] = {}  # model -> its entries, group order
        self.planned_from: dict[str, ModelDescription] = {}  # the descriptions ``plan`` was made from
        self.board = ReloadBoard()  # reloads inside the running replicas (deployments/serve/reloads.py)
        # pooled models (served by the model host, docs/hosts.md): each with its generation, which a
        # new load or a reload raises, so that hosts forget what they loaded before
        self.pooled: dict[str, tuple[ModelDescription, int]] = {}
        self._generation = 0
        self._host_started = False
        self._host_lock = asyncio.Lock()
        self.on_delete: list[Callable[[str], None]] = []  # called with a model's name as it is deleted

    def _plan(self, models: Mapping[str, ModelDescription]) -> DeploymentPlan:
        return plan_deployments(
            models, self.resources, self.settings.control_app_cpus, self.settings.host_policy
        )

    def is_pooled(self, model: ModelDescription) -> bool:
        """Whether ``model`` goes to the hosts when deployed now (an ensemble: where every model it
        reaches is pooled among the models known, ``repository_loader.plan.pooled``)."""
        known = {**self.models, model.name: model}
        return pooled(model, fitted(self.settings.host_policy, self.resources), known)

    async def _ensure_host(self) -> None:
        """The model host application, started once (a restarted server finds it running); the loads
        of a start, which run together, wait for the one that starts it."""
        async with self._host_lock:
            if not self._host_started:
                await self._start_host()

    async def _start_host(self) -> None:
        host = self._plan({}).host
        assert host is not None
        applications = (await asyncio.to_thread(hooks.serve_status)).applications
        if host.app_name not in applications:

            def build() -> Any:
                # imported here, under run_application's lock: the module's @serve.deployment serializes
                # the request router (hooks: deployment_import_serializes_routers)
                from deployments.serve.model_host import ModelHostDeployment

                options = host.serve_options()
                options["ray_actor_options"] = spare.with_model_runtime_env(options["ray_actor_options"])
                return ModelHostDeployment.options(  # type: ignore[attr-defined]
                    logging_config={"enable_access_log": self.settings.access_log},
                    graceful_shutdown_timeout_s=self.settings.exit_timeout_secs,
                    **options,
                ).bind(self.settings, host.memory_bytes, host.gpu_memory_bytes)

            await asyncio.to_thread(hooks.run_application, build, host.app_name, host.route_prefix)
        await self._wait_running({host.app_name: host.serve_options()["ray_actor_options"]})
        self._host_started = True

    async def _pool(self, model: ModelDescription) -> None:
        """Serve ``model`` from the model host: its own applications (if it had any) go."""
        await self._ensure_host()
        self._generation += 1
        self.pooled[model.name] = (model, self._generation)
        self.models[model.name] = model
        if model.name in self.deployed:
            applications = await self._applications(model.name)
            self.deployed.pop(model.name, None)
            await self._delete_applications(applications)

    def routing_slots(self) -> dict[str, int]:
        """The ``routing_slots`` of each deployed model that has them, by its application (the one its
        groups' replicas are merged into in HAProxy), for the HAProxy shim."""
        return {
            entries[0].app_name: slots
            for entries in self.deployed.values()
            if entries and (slots := entries[0].routing_slots) is not None
        }

    def prepare(self, models: dict[str, ModelDescription]) -> None:
        hint = hosts_hint(models, self.settings.host_policy)
        if hint is not None:
            console.warning(hint)
        self.plan = self._plan(models)
        self.models = dict(models)
        self.planned_from = dict(models)

    def entries(self, model: ModelDescription) -> tuple[DeploymentEntry, ...]:
        """The model's entries of the plan, one per instance group; a model loaded or changed since is
        planned beside every model this deployer knows, by the same function (so its CPU share is the
        others', not a whole CPU)."""
        planned = self.plan.for_model(model.name) if self.plan is not None else ()
        if planned and self.planned_from.get(model.name) == model:
            return planned
        plan = self._plan({**self.models, model.name: model})
        if plan.problems.get(model.name):
            raise Unavailable("; ".join(plan.problems[model.name]))
        found = plan.for_model(model.name)
        if not found:
            raise Unavailable(f"model '{model.name}' could not be planned")
        others = [e for name, entries in self.deployed.items() if name != model.name for e in entries]
        used = sum(e.num_replicas * e.resources.num_cpus for e in others)
        free = self.resources.num_cpus - self.settings.control_app_cpus - used
        running = self.deployed.get(model.name)
        placed = within_cpus(found, free)
        return placed if not running else keep_shares(running, placed, free)

    def group_apps(self, name: str) -> GroupApps:
        """The applications model ``name`` is deployed as, one per instance group that takes requests in
        rank order, with their replica counts (``deployments.serve.peers.RemoteModels`` spreads calls
        over them)."""
        if name in self.pooled:
            host = self._plan({}).host
            return ((HOST_APP, host.num_replicas if host is not None else 1),)
        entries = self.deployed.get(name)
        if not entries:
            return own_app(name)
        # a passive group takes no calls; where every group is, the model's own answers UNAVAILABLE
        taking = [e for e in entries if not e.passive] or entries[:1]
        return tuple((e.app_name, e.num_replicas) for e in taking)

    async def reload(self, old: ModelDescription, new: ModelDescription) -> None:
        """A serving model moved to ``new``: inside its running replicas when it keeps their shape
        (groups, counts, kinds, resources), so it is never unserved and ``old`` serves on if ``new``
        fails; else by redeploying its applications. A redeploy that changes only instance counts
        keeps the deployments' Serve versions and the running replicas' CPU shares, so Serve adds or
        removes replicas and the others serve on (``repository_loader.revision``); any other
        redeploy replaces every replica (Serve stops a one-replica application's old replica before
        the new one starts)."""
        self._check_rate_limits(new)
        if self.is_pooled(new):
            await self._pool(new)  # hosts load the new description on the model's next request
            return
        entries = self.entries(new)
        current = self.deployed.get(new.name)
        if current is not None and _same_shape(current, entries):
            composing = self._composing(new) if new.is_ensemble else None
            timeout = self.settings.deploy_timeout_s
            replicas = sum(e.num_replicas for e in current)  # every group's replicas follow the order
            await self.board.swap(new, replicas, timeout, composing)
            self.models[new.name] = new
            return
        await self.deploy(new)

    def _check_rate_limits(self, model: ModelDescription) -> None:
        """With the rate limiter on, a model an instance of which needs more of a resource than
        ``--rate-limit-resource`` gives is refused: it could never execute."""
        if self.settings.rate_limit != "off":
            check_limits(model, self.settings.rate_limit_resources)

    async def deploy(self, model: ModelDescription) -> None:
        self._check_rate_limits(model)
        if self.is_pooled(model):
            await self._pool(model)
            return
        self.pooled.pop(model.name, None)
        entries = self.entries(model)
        self.board.forget(model.name)
        self.models[model.name] = model
        composing = self._composing(model) if model.is_ensemble else None
        # applications the model had and no longer has (a reload with fewer instance groups)
        leftover = await self._applications(model.name) - {e.app_name for e in entries}
        # An access-log line per request costs a trivial model about a tenth of its throughput.
        logging_config = {"enable_access_log": self.settings.access_log}
        previous = self.deployed.get(model.name)
        files = await asyncio.to_thread(files_digest, model.path)
        self.deployed[model.name] = entries  # before its replicas start: HAProxy asks how to route it then
        try:
            for entry in entries:
                version = code_version(model, files, self._built_with(entry, composing))

                def build(entry: DeploymentEntry = entry, version: str = version) -> Any:
                    options = entry.serve_options()
                    options["ray_actor_options"] = spare.with_model_runtime_env(options["ray_actor_options"])
                    deployment = ModelDeployment.options(  # type: ignore[attr-defined]
                        logging_config=logging_config,
                        graceful_shutdown_timeout_s=self.settings.exit_timeout_secs,
                        **options,
                    )
                    # a stable version: a count-only change scales the deployment (repository_loader.revision)
                    return hooks.with_version(deployment, version).bind(
                        model, settings=self.settings, composing=composing, **entry.init_kwargs
                    )

                await asyncio.to_thread(hooks.run_application, build, entry.app_name, entry.route_prefix)
        except BaseException:
            if previous is None:
                self.deployed.pop(model.name, None)
            else:
                self.deployed[model.name] = previous
            raise
        try:
            await self._wait_running({e.app_name: e.ray_actor_options for e in entries})
            statuses = await asyncio.gather(*(self._load_status(e) for e in entries))
        finally:
            await self._delete_applications(leftover)
        errors = [status["error"] for status in statuses if status["error"]]
        if errors:
            raise Unavailable(errors[0])
        if previous is not None:  # replicas a count change kept were built from the old description
            replicas = sum(e.num_replicas for e in entries)
            await self.board.describe(model, replicas, min(self.settings.deploy_timeout_s, 10.0))

    def _built_with(
        self, entry: DeploymentEntry, composing: dict[str, ModelDescription] | None
    ) -> dict[str, Any]:
        """The constructor arguments of ``entry``'s replicas that hold for every count of the model
        (what its Serve version holds besides the model, ``repository_loader.revision``)."""
        holds = bool(self.settings.delay_scheduler or self.settings.backlog_delay_scheduler)
        return {
            "group": entry.group_index,
            "passive": entry.passive,
            "kind": entry.instance_kind,
            "settings": self.settings,
            "composing": composing,
            # the testing hook's shared holds exist only in a model of more than one replica
            "shared_holds": holds and entry.model_replicas > 1,
        }

    async def _load_status(self, entry: DeploymentEntry) -> dict[str, Any]:
        handle = serve.get_deployment_handle(entry.deployment_name, app_name=entry.app_name)
        return await ReplicaClient(handle).load_status()

    def _composing(self, model: ModelDescription) -> dict[str, ModelDescription]:
        """Every deployed model an ensemble reaches, nested ensembles included."""
        from repository_loader.ensemble_rules import composing_models

        reached = composing_models(model, self.models)
        return {name: self.models[name] for name in reached if name in self.models}

    async def _wait_running(self, asks: Mapping[str, Mapping[str, Any]]) -> None:
        """Until every application in ``asks`` (its replicas' ``ray_actor_options``) runs;
        :class:`Unavailable` when one fails, when its replicas find no node with the resources they
        need for ``placement_timeout_s`` after Serve says so (a fixed cluster that is full: waiting
        longer would hold model control for nothing), or after ``deploy_timeout_s``.

        Serve's message is the same for a replica whose node has the resources but starts its
        worker process late (a node starts as many at once as it has CPUs, and a busy node takes
        seconds each): the clock runs only while Ray also lists the replica's resources among the
        demands no node can grant."""
        timeout = self.settings.deploy_timeout_s
        deadline = time.monotonic() + timeout
        waiting = list(asks)
        unscheduled_since: dict[str, float] = {}
        while time.monotonic() < deadline:
            applications = (await asyncio.to_thread(hooks.serve_status)).applications
            demands: list[dict[str, float]] | None = None
            for name in list(waiting):
                app = applications.get(name)
                status = str(getattr(app, "status", "")) if app else ""
                if status.endswith("RUNNING"):
                    waiting.remove(name)
                elif status.endswith("DEPLOY_FAILED") or status.endswith("UNHEALTHY"):
                    raise Unavailable(getattr(app, "message", "") or f"application {name} failed to deploy")
                elif (message := hooks.unscheduled_message(app)) is None:
                    unscheduled_since.pop(name, None)
                else:
                    if demands is None:
                        try:
                            demands = await asyncio.to_thread(hooks.pending_resource_demands)
                        except Exception as exc:  # the GCS busy or restarting: decide on a later round
                            logger.debug("Ray's pending demands not read: %s", exc)
                            demands = UNREAD
                    if demands is UNREAD:
                        continue
                    if not any(same_resources(asks[name], demand) for demand in demands):
                        unscheduled_since.pop(name, None)  # placed; its worker process is starting
                    elif time.monotonic() - unscheduled_since.setdefault(name, time.monotonic()) > (
                        self.settings.placement_timeout_s
                    ):
                        raise Unavailable(f"no node has the resources its replicas need: {message}")
            if not waiting:
                return
            await asyncio.sleep(0.5)
        raise Unavailable(f"application {waiting[0]} did not start within {timeout:.0f}s")

    def needs_gpu(self, model: ModelDescription) -> bool:
        if self.is_pooled(model):  # pooled models run on the hosts, planned as a whole
            return False
        try:
            return any(e.resources.num_gpus > 0 for e in self.entries(model))
        except ServerError:  # it cannot be placed: its deploy says why
            return False

    async def running(self) -> dict[str, ModelDescription]:
        """Models whose first application runs in Serve now and that this deployer did not deploy,
        described by one of their replicas; adopted with the applications of all their groups."""
        applications = (await asyncio.to_thread(hooks.serve_status)).applications
        found: dict[str, ModelDescription] = {}
        for app_name, app in applications.items():
            if not app_name.startswith(MODEL_APP_PREFIX) or is_group_app(app_name):
                continue
            if not str(getattr(app, "status", "")).endswith("RUNNING"):
                continue
            try:
                model = await within(replica_client(app_name).description(), 30)
            except Exception as exc:  # a replica that cannot answer: its model is loaded again, or not
                logger.warning("application %s did not describe its model: %s", app_name, exc)
                continue
            if model.name in self.deployed or model_app_name(model.name) != app_name:
                continue
            found[model.name] = model
            self.models[model.name] = model
            groups = [name for name in applications if name == app_name or is_group_app(name, model.name)]
            try:
                self.deployed[model.name] = tuple(e for e in self.entries(model) if e.app_name in groups)
            except ServerError:
                self.deployed[model.name] = ()
        return found

    async def unloaded(self) -> set[str]:
        if self._unloads_key:
            value = await asyncio.to_thread(hooks.kv_get, self._unloads_key)
            self._unloads = set(json.loads(value)) if value else set()
        return set(self._unloads)

    async def record_unloaded(self, name: str, unloaded: bool) -> None:
        changed = (self._unloads | {name}) if unloaded else (self._unloads - {name})
        if changed == self._unloads:
            return
        if self._unloads_key:
            await asyncio.to_thread(hooks.kv_put, self._unloads_key, json.dumps(sorted(changed)).encode())
        self._unloads = changed

    async def unserved(self) -> dict[str, str]:
        """Deployed models none of whose applications has a running replica now, with Serve's reason
        (a lost node: replicas waiting to be placed again, or for resources no live node has)."""
        if not self.deployed:
            return {}
        applications = (await asyncio.to_thread(hooks.serve_status)).applications
        found: dict[str, str] = {}
        for name, entries in self.deployed.items():
            deployments = [
                d
                for e in entries
                if (app := applications.get(e.app_name)) is not None
                for d in app.deployments.values()
            ]
            counts = [
                (str(getattr(k, "value", k)).lower(), n)
                for d in deployments
                for k, n in d.replica_states.items()
            ]
            if not deployments or any(state == "running" and n for state, n in counts):
                continue
            states = ", ".join(f"{n} {state}" for state, n in counts if n)
            why = next((d.message for d in deployments if d.message), "")
            found[name] = f"no running replica ({states or 'none'})" + (f": {why}" if why else "")
        return found

    async def _applications(self, name: str) -> set[str]:
        """Every Serve application of model ``name``: those deployed for it, its own, and the instance
        group applications Serve runs under its name (left by an earlier start of the server), never
        an application of another model."""
        running = (await asyncio.to_thread(hooks.serve_status)).applications
        found = {e.app_name for e in self.deployed.get(name, ())} | {model_app_name(name)}
        found |= {app for app in running if is_group_app(app, name)}
        others = {e.app_name for model, entries in self.deployed.items() if model != name for e in entries}
        others |= {model_app_name(model) for model in self.models if model != name}
        return found - others

    async def _delete_applications(self, names: set[str]) -> None:
        """Delete the applications ``names``, the model's own (its route) last."""
        for app in sorted(names, key=lambda app: (not is_group_app(app), app)):
            await asyncio.to_thread(hooks.delete_application, app)

    async def delete(self, name: str) -> None:
        for forget in self.on_delete:
            forget(name)
        self.board.forget(name)
        if self.pooled.pop(name, None) is not None and name not in self.deployed:
            return  # hosts forget it within a pool refresh
        applications = await self._applications(name)
        self.deployed.pop(name, None)
        await self._delete_applications(applications)


UNREAD: list[dict[str, float]] = []
"""Ray's pending demands could not be read this round (its own object: compared by identity)."""


def ray_resources(actor_options: Mapping[str, Any]) -> dict[str, float]:
    """Ray's resource names and amounts for an actor's options (``num_cpus`` is ``CPU``, and so on),
    without the zero ones: the shape Ray reports for the actor's resource request."""
    named = {
        "CPU": actor_options.get("num_cpus") or 0,
        "GPU": actor_options.get("num_gpus") or 0,
        "memory": actor_options.get("memory") or 0,
        **(actor_options.get("resources") or {}),
    }
    return {key: float(value) for key, value in named.items() if value}


def same_resources(actor_options: Mapping[str, Any], demand: Mapping[str, float]) -> bool:
    """Whether Ray's resource request ``demand`` is the one an actor with ``actor_options`` makes."""
    asked = ray_resources(actor_options)
    shown = {key: value for key, value in demand.items() if value}
    return asked.keys() == shown.keys() and all(abs(asked[k] - shown[k]) < 1e-4 for k in asked)


def _same_shape(a: tuple[DeploymentEntry, ...], b: tuple[DeploymentEntry, ...]) -> bool:
    """Whether a model planned as ``b`` can run on the replicas started as ``a``: the same groups, each
    with the same count, kind, GPUs and autoscaling (a CPU share that moved because other models came or went
    does not count)."""

    def shape(entries: tuple[DeploymentEntry, ...]) -> list[tuple[Any, ...]]:
        return [
            (e.app_name, e.num_replicas, e.kind, e.resources.num_gpus, e.replica_gpu_ids, e.autoscaling)
            for e in entries
        ]

    return shape(a) == shape(b)


SERVER_HEALTH_CHECK_PERIOD_S = 0.25


# The constructor loads the initial models (Triton opens its endpoints after that); a failure with
# exit_on_error is final, not retried.
@serve.deployment(
    name=SERVER_DEPLOYMENT,
    # the setup hook in its runtime_env: a worker started for it imports its modules first (spare.py)
    ray_actor_options={"num_cpus": 0.05, "runtime_env": spare.SERVER_RUNTIME_ENV},
    max_ongoing_requests=1000,
    max_constructor_retry_count=1,
    # a dead server replica is found within a quarter of a second (Serve's default period: 10 s; a
    # model replica's: 1 s): Serve learns of it at its next check. /v2 answers 503 from then until the
    # new one has adopted what runs. One replica, so the checks cost the controller little
    health_check_period_s=SERVER_HEALTH_CHECK_PERIOD_S,
    health_check_timeout_s=10.0,
)
@serve.ingress()
class ServerDeployment:
    async def __init__(self, settings: ServerSettings, instance: str = "") -> None:  # type: ignore[misc]  # Serve awaits it
        """``instance`` names this server (one per ``serve run`` / ``serve deploy``, kept by Serve across
        restarts of this replica): what the server keeps in the cluster is under that name."""
        import ray

        from deployments.serve import local_sockets
        from deployments.serve.response_writes import coalesce_response_writes

        coalesce_response_writes()
        # HAProxy on this node reaches the replica through a Unix socket
        local_sockets.install(settings.replica_http == "own", settings.busy_poll_us)
        # the log settings: the flags, or what a previous replica of this server was told to change
        self._logs_key = f"{instance}/log_settings" if instance else ""
        kept = await asyncio.to_thread(hooks.kv_get, self._logs_key) if self._logs_key else None
        self.logs = LogBoard(logs.decode(kept, settings.log_settings), log_to_stderr, self._record_logs)
        log_to_stderr(self.logs.current)
        cluster = ray.cluster_resources()
        resources = ClusterResources(
            num_cpus=float(cluster.get("CPU", 1)), num_gpus=int(cluster.get("GPU", 0))
        )
        self.deployer = RayDeployer(settings, resources, instance)
        # the rate limiter's pools (docs/rate_limiter.md), held here so that they outlive any model replica
        self._rate_limiter = (
            None if settings.rate_limit == "off" else await asyncio.to_thread(limiter_actor, settings)
        )
        self._stats: Snapshots = {}
        self._sequence_members: dict[str, dict[int, Member]] = {}
        self._holds = HoldBoard()  # TRITONSERVER_DELAY_SCHEDULER over a model's replicas (testing)
        # the server reads its deployer for a model's instance groups on every call (no Ray call)
        self._calls = ReplicaCalls(ReplicaDirectory())
        self._models = RemoteModels(
            self._group_apps, refresh_s=0.0, calls=self._calls if settings.direct_routes else None
        )
        self.controller = ModelController(settings, self.deployer, remote=self._remote)
        self._metrics: dict[str, dict[str, dict[str, Any]]] = {}  # pushed metrics snapshots: model, replica
        self._pushed_at: dict[str, dict[str, float]] = {}  # when each of those came: model, replica
        self._retired: dict[str, set[str]] = {}  # model -> replicas of its deleted deployments
        self.deployer.on_delete.append(self._forget_pushes)
        self._host_gauges = HostGauges()
        self._host_status: dict[str, tuple[float, dict[str, Any]]] = {}  # model host replica -> its push
        self._metrics_server = start_metrics(settings, self.render_metrics)
        self._grpc_answers = not settings.allow_grpc  # until its port answers through HAProxy
        self._regions = RegionTable()  # system shared memory: registered here, mapped where used
        # the trace settings live here; replicas follow them (deployments.serve.traces)
        self._trace_board = TraceBoard()
        self._traces = LocalTraces(settings.trace, changed=self._trace_board.publish)
        self._trace_board.state = self._traces.state
        configure_tracing(settings.trace, take=self._traces.take)
        self.dataplane = ModelDataPlane(
            self.controller,
            Router(remote=self._models),
            notices=request_path.request_path_notice(logger),
            front_ends_ready=lambda: self._grpc_answers,
            server_name=settings.server_id,
            logs=self.logs,
            shared_memory=SharedMemory(self._regions),
            traces=self._traces,
            key_for=self.controller.key_for if settings.model_namespacing else None,
        )
        self._start = asyncio.get_running_loop().create_task(self._startup())
        await asyncio.shield(self._start)  # live only once the initial models settled
        self._grpc_watch: asyncio.Task[None] | None = None
        if await start_grpc(self.dataplane, settings):
            self._grpc_watch = asyncio.get_running_loop().create_task(self._watch_grpc(settings))
        else:
            self._grpc_answers = True  # no gRPC to wait for
        # an idle worker on this node for this server's next replica (docs/recovery.md)
        self._spare = (
            asyncio.get_running_loop().create_task(spare.keep_spare()) if settings.spare_worker else None
        )

    async def _watch_grpc(self, settings: ServerSettings) -> None:
        """Ready only once gRPC answers too: HAProxy takes up this replica's gRPC port a moment after
        its HTTP routes answer, and a client told "ready" must be answered on either protocol."""
        from deployments.serve.grpc_ingress import wait_until_answering

        while not await asyncio.to_thread(
            wait_until_answering, settings.grpc_host, settings.grpc_port, 5.0, settings.grpc_restricted_api
        ):
            logger.info("waiting for the gRPC port %d to answer before reporting ready", settings.grpc_port)
        self._grpc_answers = True

    def _record_logs(self, settings: LogSettings) -> None:
        if self._logs_key:
            hooks.kv_put(self._logs_key, logs.encode(settings))

    async def log_settings(self, applied: LogSettings | None, timeout_s: float) -> LogSettings | None:
        """A replica's long poll for the log settings (``deployments.serve.logs.follow``)."""
        return await self.logs.wait(applied, timeout_s)

    async def _group_apps(self, name: str) -> GroupApps:
        return self.deployer.group_apps(name)

    def pooled(self, name: str) -> tuple[ModelDescription, int] | None:
        """A pooled model's description and generation (asked by model hosts on its first request);
        None where ``name`` is not pooled."""
        return self.deployer.pooled.get(name)

    def pool_generations(self) -> dict[str, int]:
        """The generation of every pooled model (model hosts forget what no longer matches)."""
        return {name: generation for name, (_, generation) in self.deployer.pooled.items()}

    def model_apps(self, name: str) -> GroupApps:
        """The applications of model ``name``, one per instance group, with their replica counts
        (asked by model replicas, ``deployments.serve.peers.RemoteModels``)."""
        return self.deployer.group_apps(name)

    def _remote(self, model: ModelDescription) -> ServedModel:
        pushed = self._stats.setdefault(model.name, {})
        return ServedElsewhere(
            model, self._models, pushed, ask_replica=model.name not in self.deployer.pooled
        )

    async def _startup(self) -> None:
        try:
            await self.controller.start()
        except Exception as exc:
            if isinstance(exc, ServerError):
                logger.error("model repository: %s", exc.message)
            else:
                logger.exception("model repository failed to load")
            if self.deployer.settings.exit_on_error:
                for name in list(self.deployer.deployed):
                    await self.deployer.delete(name)
                raise RuntimeError(getattr(exc, "message", str(exc))) from None

    async def trace_settings(self, model: str | None) -> dict[str, Any]:
        """The trace settings as Triton answers them (asked by model replicas' front ends)."""
        return await self.dataplane.trace_settings(model)

    async def trace_update(self, model: str | None, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply trace setting changes a replica's front end read (reading them again leaves them as
        they are); answered once the replicas hold them."""
        return await self.dataplane.update_trace_settings(model, changes)

    async def trace_take(self, model: str) -> bool:
        """Use up one trace of ``model``'s ``trace_count`` (a replica is about to trace a request)."""
        return await self._traces.take(model)

    async def trace_state(self, replica: str, seen: int, timeout_s: float) -> TraceState | None:
        """A replica's long poll for the trace settings (``deployments.serve.traces.follow_traces``)."""
        return await self._trace_board.wait(replica, seen, timeout_s)

    async def hold_report(
        self, model: str, reporter: str, queued: int, backlogged: int, requests: int, backlog: int
    ) -> bool:
        """A held scheduler's counts (``ServerHolds``): whether its model's totals reach the hold."""
        return self._holds.report(model, reporter, queued, backlogged, requests, backlog)

    async def hold_forget(self, model: str, reporter: str) -> None:
        self._holds.forget(model, reporter)

    async def reload_order(self, model: str, seen: tuple[int, str], timeout_s: float) -> Order | None:
        """A model replica's long poll for reload orders (``deployments.serve.reloads.follow``)."""
        return await self.deployer.board.wait(model, seen, timeout_s)

    async def reload_report(
        self, model: str, generation: int, replica: str, phase: str, error: str | None
    ) -> None:
        await self.deployer.board.report(model, generation, replica, phase, error)

    def __serve_build_asgi_app__(self) -> Any:
        from deployments.protocol.http import ServerHTTPApp
        from deployments.serve.haproxy_shim import ROUTING_PATH

        app = ServerHTTPApp(self.dataplane, limits=self.deployer.settings.limits)
        app.restricted = self.deployer.settings.http_restricted_api
        app.header_forward = compile_header_pattern(self.deployer.settings.http_header_forward_pattern)
        deployer = self.deployer

        async def with_routing(scope: Any, receive: Any, send: Any) -> None:
            """``GET`` :data:`ROUTING_PATH`: how HAProxy balances each model (the shim asks when Serve
            starts or reloads it); everything else is the server's HTTP API."""
            if scope.get("type") == "http" and scope.get("path") == ROUTING_PATH:
                body = json.dumps({"routing_slots": deployer.routing_slots()}).encode()
                headers = [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
            await app(scope, receive, send)

        return with_routing

    def report_stats(self, model: str, replica: str, snapshot: list[dict[str, Any]]) -> None:
        if replica in self._retired.get(model, ()):
            return  # a late push of a replica of a deleted deployment: its counts went with it
        self._stats.setdefault(model, {})[replica] = snapshot

    def _forget_pushes(self, model: str) -> None:
        """``model`` is deleted (unloaded, or failed to load): its replicas' counts go with it, so a
        load afterwards starts its statistics and metrics at zero, as Triton's does. Its replicas (not
        the model hosts', which serve other models and may load it again) are retired: a push they
        send while they stop is dropped."""
        replicas = {*self._metrics.pop(model, {}), *self._stats.get(model, {})} - set(self._host_status)
        self._pushed_at.pop(model, None)
        self._retired.setdefault(model, set()).update(replicas)
        self._stats.get(model, {}).clear()  # in place: a served model's view holds this mapping

    def report_host(self, replica: str, status: dict[str, Any]) -> None:
        """A model host replica's push (``replica``: its statistics key): the statistics and request
        metrics of the models whose own changed, what it holds and its counters (``/metrics``, kept
        while the replica reports within a few heartbeats)."""
        for model, snapshot in status.pop("stats", {}).items():
            self.report_stats(model, replica, snapshot)
        for model, metrics in status.pop("metrics", {}).items():  # no statistics: those come above
            self._metrics.setdefault(model, {})[replica] = metrics
        self._host_status[replica] = (time.monotonic(), status)  # also how recent its models' pushes are

    def report_metrics(self, model: str, replica: str, snapshot: dict[str, Any]) -> None:
        """A replica's push: its ``ModelRuntime.metrics_snapshot()`` (statistics included)."""
        if replica in self._retired.get(model, ()):
            return
        self._metrics.setdefault(model, {})[replica] = snapshot
        self._pushed_at.setdefault(model, {})[replica] = time.monotonic()
        self.report_stats(model, replica, snapshot["stats"])
        if "load_error" in snapshot:
            self.controller.replica_loaded(model, replica, snapshot["load_error"])

    async def render_metrics(self) -> str:
        """Triton's ``/metrics`` text: every served model's counters summed over its replicas (pushed, or
        asked of a single replica now) and the copies ensembles host, and every custom metric family."""
        names = self.controller.served()
        gathered = await asyncio.gather(*(self._model_metrics(name) for name in names))
        custom = [snapshot.get("custom", []) for snapshots in gathered for snapshot in snapshots]
        models = {
            name: merge_model_metrics(snapshots) for name, snapshots in zip(names, gathered, strict=True)
        }
        current = self._alive_since()
        hosts = [status for seen, status in self._host_status.values() if seen >= current]
        custom += [status.get("custom", []) for status in hosts]  # the pooled models' own families
        return render_triton(
            models,
            merge_custom_metrics(custom),
            self._host_gauges.read(),
            self.deployer.settings.metrics_config,
            hosts,
        )

    async def _model_metrics(self, name: str) -> list[dict[str, Any]]:
        """The model's snapshots by replica: each replica's counts asked now, and the last push of a
        replica that does not answer (one that is busy, restarting, or died: its counts stay counted).
        A replica silent for three heartbeats is gone: nothing is pending on it any more."""
        alive = self._alive_since()
        snapshots = {
            replica: snapshot if self._last_heard(name, replica) >= alive else settled(snapshot)
            for replica, snapshot in self._metrics.get(name, {}).items()
        }
        if name not in self.deployer.pooled:  # a pooled model has no replica of its own: its hosts push
            try:
                fresh = await self._models.replica_snapshots(name)
                if not fresh:  # no direct lane: one replica through its deployment handle
                    client = self._models.client(name)
                    one = await within(client.metrics_snapshot(), METRICS_ASK_TIMEOUT_S)
                    fresh = {one.get("replica", ""): one}
                snapshots.update(fresh)
            except Exception as exc:  # a replica restarting or busy: its last push stands for it
                logger.debug("metrics of model '%s' not asked: %s", name, exc)
        hosted = await self._models.hosted_now(name, self._stats.get(name, {}))
        return list(snapshots.values()) + [{"stats": s} for s in hosted.values()]

    def _alive_since(self) -> float:
        """A replica last heard from before this (three heartbeats ago) is counted as gone."""
        return time.monotonic() - 3 * self.deployer.settings.stats_heartbeat_s

    def _last_heard(self, model: str, replica: str) -> float:
        """When ``replica`` last pushed: a model host pushes a model's metrics when they change and
        its own status every heartbeat; a model replica pushes its metrics every heartbeat."""
        host = self._host_status.get(replica)
        return host[0] if host is not None else self._pushed_at.get(model, {}).get(replica, 0.0)

    async def control_load(self, name: str, config: str, files: dict[str, bytes]) -> None:
        """BLS ``pb_utils.load_model``: the repository API's load, with its checks and model control mode."""
        parameters: dict[str, Any] = {key: base64.b64encode(data).decode() for key, data in files.items()}
        if config:
            parameters["config"] = config
        await self.controller.load(name, parameters)

    async def control_unload(self, name: str, unload_dependents: bool) -> None:
        """BLS ``pb_utils.unload_model``."""
        await self.controller.unload(name, {"unload_dependents": unload_dependents})

    async def control_is_ready(self, name: str, version: str) -> bool:
        """BLS ``pb_utils.is_model_ready``."""
        try:
            return bool(self.controller.get(name).is_ready(version))
        except ServerError:
            return False

    async def cluster_stats(
        self,
        model: str,
        replica: str,
        snapshot: list[dict[str, Any]],
        remember: bool = True,
        siblings: dict[str, list[dict[str, Any]]] | None = None,
    ) -> list[dict[str, Any]]:
        """``snapshot`` summed with everything else held for ``model``, where ``siblings`` (replica id
        -> statistics, asked just now) stand in for those replicas' pushes, and the copies ensembles
        host are asked of their replicas now; ``remember`` keeps them (replicas that push every
        second), a single replica's is used for this answer only."""
        hosted = await self._models.hosted_now(model, self._stats.get(model, {}))
        fresh = {**hosted, **(siblings or {}), replica: snapshot}
        if remember:
            for key, stats in fresh.items():
                self.report_stats(model, key, stats)
        held = {key: s for key, s in self._stats.get(model, {}).items() if key not in fresh}
        return merge_snapshots([*fresh.values(), *held.values()])

    def sequence_register(self, model: str, rank: int, member: Member) -> None:
        """A replica of a stateful model: which replica holds its rank (application, actor name)."""
        self._sequence_members.setdefault(model, {})[rank] = member

    def sequence_members(self, model: str) -> dict[int, Member]:
        """Which replica holds each rank of a stateful model (``deployments.serve.peers.ReplicaDirectory``)."""
        return dict(self._sequence_members.get(model, {}))

    async def index(self) -> list[dict[str, Any]]:
        return await self.controller.index()

    async def describe(self, name: str, version: str) -> ModelDescription:
        """A served model's description (a model replica answering a stream's request for another model)."""
        return await self.dataplane.model_description(name, version)

    async def model_statistics(self, name: str, version: str) -> dict[str, Any]:
        """A served model's statistics extension document (a model host answering for a model it
        does not pool, ``deployments.replica.ServedElsewhere``)."""
        return await self.dataplane.model_statistics(name, version)

    def deployed_plan(self) -> dict[str, list[dict[str, Any]]]:
        """The plan entries each deployed model's applications were started from (one per instance
        group, in group order), by model."""
        return {name: [e.to_dict() for e in entries] for name, entries in self.deployer.deployed.items()}

    def is_started(self) -> bool:
        return self._start.done()

    # --- system shared memory: the one table of regions (deployments.protocol.shared_memory) ---

    async def shm_region(self, name: str, follower: str) -> tuple[Region, int]:
        """A model replica maps region ``name`` and follows the table from now."""
        return await self._regions.region(name, follower)

    async def shm_follow(
        self, follower: str, seen: int, timeout_s: float, answer: Answer | None = None
    ) -> TableState:
        """A model replica's long poll: the table's state once past ``seen`` or asking a question;
        ``answer`` answers the question asked last (which regions its requests use)."""
        return await self._regions.follow(follower, seen, timeout_s, answer)

    async def shm_register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        await self._regions.register(name, key, offset, byte_size)

    async def shm_unregister(self, name: str) -> None:
        await self._regions.unregister(name)

    async def shm_status(self, name: str) -> list[dict[str, Any]]:
        return await self._regions.status(name)

    async def __del__(self) -> None:
        watch = getattr(self, "_grpc_watch", None)
        if watch is not None:
            watch.cancel()
        calls = getattr(self, "_calls", None)  # None too where the constructor failed before it
        if calls is not None:
            await calls.close()


async def start_grpc(dataplane: ModelDataPlane, settings: ServerSettings) -> bool:
    """Answer the KServe v2 gRPC service over the server's data plane where ``allow_grpc`` is on.

    Serve serves gRPC with this server's servicer function (``grpc_options``): HAProxy binds the port,
    sends each ``ModelInfer`` and stream to the replicas of the model it names, and everything else
    here (``deployments.serve.grpc_ingress``). Without those ``grpc_options`` there is no gRPC: an
    error in the log says how to turn it on. Returns whether gRPC is served."""
    if not settings.allow_grpc:
        return False
    from deployments.serve import grpc_ingress

    port, servicers = await hooks.serve_grpc_servicers()
    if port > 0 and grpc_ingress.SERVICER_FUNCTION in servicers:
        grpc_ingress.serve_grpc(dataplane, grpc_ingress.grpc_options(settings))
        logger.info(
            "gRPC service on Serve's gRPC port %d (inference answered by each model's replicas)", port
        )
        return True
    logger.error(
        "gRPC is off: Serve's grpc_options do not name %s; set grpc_options as serve_config.yaml "
        "does (port %d) to serve gRPC",
        grpc_ingress.SERVICER_FUNCTION,
        settings.grpc_port,
    )
    return False


METRICS_ASK_TIMEOUT_S = 2.0  # how long a scrape waits for the replica it asks


def start_metrics(settings: ServerSettings, render: metrics_http.Render) -> Any:
    """Triton's metrics endpoint on ``settings.metrics_host:metrics_port`` (None when ``allow_metrics`` is
    off). The port is bound here, so a port in use fails the replica at once."""
    if not settings.allow_metrics:
        return None
    sock = metrics_http.bind(settings.metrics_host, settings.metrics_port)
    task = asyncio.get_running_loop().create_task(metrics_http.start_metrics_server(sock, render))
    logger.info("metrics endpoint listening on %s:%d/metrics", settings.metrics_host, settings.metrics_port)
    return task


def build_app(args: dict[str, Any]) -> Any:
    """Application builder for ``serve run`` / ``serve deploy`` (``import_path: deployments.serve.app:build_app``).

    ``args`` are read once into :class:`~deployments.settings.ServerSettings` (see its
    ``from_args`` for the names: ``model_repository`` (required), ``model_control_mode``,
    ``load_model``, ``model_config_name``, ``disable_auto_complete_config``, ``strict_readiness``,
    ``access_log``, ...).
    """
    return bind_server(ServerSettings.from_args(args))


def bind_server(settings: ServerSettings) -> Any:
    """The server application for ``settings``, named afresh: a server deployed again starts clean,
    while a restart of its replica (the same arguments) finds what this one kept."""
    return ServerDeployment.bind(settings, instance=uuid.uuid4().hex)  # type: ignore[attr-defined]


__all__ = ["MODEL_DEPLOYMENT", "SERVER_APP", "RayDeployer", "ServerDeployment", "bind_server", "build_app"]
