"""The Ray Serve layer: the ``/v2`` server application and one application per model.

``serve run serve_config.yaml`` starts :func:`build_app`'s server deployment.
Its replica reads the repository and deploys every model as its own Serve
application at ``/v2/models/<name>`` (the model's replica answers HTTP itself:
one hop), then answers health, server metadata, the repository API and
statistics across models.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ray import serve

from deployments.control import ControllerOptions, ModelController
from deployments.inference import InferRequest, InferResponse
from deployments.protocol.dataplane import server_metadata_document
from deployments.runtime.stats import merge_snapshots
from deployments.serve.model_app import ModelDeployment
from deployments.serve.names import MODEL_DEPLOYMENT, SERVER_APP, is_hosted_key, model_app_name, model_route
from repository_loader.errors import InvalidArgument, ServerError, Unavailable
from repository_loader.model import ModelDescription, ModelState
from repository_loader.plan import ClusterResources, DeploymentEntry, DeploymentPlan, plan_deployments

logger = logging.getLogger("ray.serve")

DEPLOY_TIMEOUT_S = 600.0


def deployment_options(entries: tuple[DeploymentEntry, ...]) -> dict[str, Any]:
    """Serve options of a model's deployment, from its entries of the deployment plan.

    One application serves every selected version of a model; its replicas are
    the instances of the latest version's instance groups (sizes from the first).
    """
    if not entries:
        raise Unavailable("the deployment plan has no entry for this model")
    latest = max(e.version for e in entries)
    groups = [e for e in entries if e.version == latest]
    first = groups[0]
    replicas = sum(e.num_replicas for e in groups)
    return {
        "num_replicas": replicas,
        "max_ongoing_requests": first.max_ongoing_requests,
        "ray_actor_options": {"num_cpus": first.resources.num_cpus, "num_gpus": first.resources.num_gpus},
        "init_kwargs": {
            "instance_kind": _kind(first.kind),
            "replicas": replicas,
            "gpu_ids": [gpu for e in groups for gpu in e.replica_gpu_ids],
        },
    }


def _kind(kind: str) -> str:
    return kind if kind in ("KIND_GPU", "KIND_CPU", "KIND_MODEL") else "KIND_CPU"


class RayDeployer:
    """Deploys and deletes model applications on the running Serve instance."""

    def __init__(self, num_cpus: float, num_gpus: int, access_log: bool = False) -> None:
        self.resources = ClusterResources(num_cpus=num_cpus, num_gpus=num_gpus)
        self.access_log = access_log
        self.plan: DeploymentPlan | None = None
        self.models: dict[str, ModelDescription] = {}

    def prepare(self, models: dict[str, ModelDescription]) -> None:
        self.plan = plan_deployments(models, self.resources)
        self.models = dict(models)

    def _entries(self, model: ModelDescription) -> tuple[DeploymentEntry, ...]:
        if self.plan is not None:
            problems = self.plan.problems.get(model.name)
            if problems:
                raise Unavailable("; ".join(problems))
            entries = self.plan.for_model(model.name)
            if entries and all(e.version in model.versions for e in entries):
                return entries
        plan = plan_deployments({model.name: model}, self.resources)
        if plan.problems.get(model.name):
            raise Unavailable("; ".join(plan.problems[model.name]))
        return plan.for_model(model.name)

    async def deploy(self, model: ModelDescription) -> None:
        from ray.serve.api import _run

        opts = deployment_options(self._entries(model))
        init = opts.pop("init_kwargs", {})
        self.models[model.name] = model
        if model.is_ensemble:
            init["composing"] = self._composing(model)
        # An access-log line per request costs a trivial model about a tenth of its throughput.
        logging_config = {"enable_access_log": self.access_log}
        app = ModelDeployment.options(name=MODEL_DEPLOYMENT, logging_config=logging_config, **opts).bind(
            model, **init
        )
        name = model_app_name(model.name)
        await asyncio.to_thread(_run, app, name=name, route_prefix=model_route(model.name), _blocking=False)
        await self._wait_running(name)
        handle = serve.get_deployment_handle(MODEL_DEPLOYMENT, app_name=name)
        status = await handle.load_status.remote()
        if status["error"]:
            raise Unavailable(status["error"])

    def _composing(self, model: ModelDescription) -> dict[str, ModelDescription]:
        """Every model an ensemble reaches, nested ensembles included."""
        found: dict[str, ModelDescription] = {}
        todo = [s.model_name for s in model.ensemble_steps]
        while todo:
            name = todo.pop()
            if name in found or name not in self.models:
                continue
            found[name] = self.models[name]
            todo.extend(s.model_name for s in found[name].ensemble_steps)
        return found

    async def _wait_running(self, name: str) -> None:
        deadline = time.monotonic() + DEPLOY_TIMEOUT_S
        while time.monotonic() < deadline:
            app = (await asyncio.to_thread(serve.status)).applications.get(name)
            status = str(getattr(app, "status", "")) if app else ""
            if status.endswith("RUNNING"):
                return
            if status.endswith("DEPLOY_FAILED") or status.endswith("UNHEALTHY"):
                raise Unavailable(getattr(app, "message", "") or f"application {name} failed to deploy")
            await asyncio.sleep(0.5)
        raise Unavailable(f"application {name} did not start within {DEPLOY_TIMEOUT_S:.0f}s")

    async def delete(self, name: str) -> None:
        await asyncio.to_thread(serve.delete, model_app_name(name), _blocking=True)


class ServerDataPlane:
    """The server application's data plane: health, metadata, repository, cross-model stats.

    Model routes reach this app only when the model has no application (unknown,
    failed or unloaded); those requests get NotFound or Unavailable.
    """

    def __init__(
        self, controller: ModelController, stats: dict[str, dict[str, list[dict[str, Any]]]]
    ) -> None:
        self.controller = controller
        self._stats = stats

    async def server_metadata(self) -> dict[str, Any]:
        return server_metadata_document()

    async def live(self) -> bool:
        return True

    async def ready(self) -> bool:
        return self.controller.ready()

    async def model_ready(self, name: str, version: str = "") -> bool:
        self.controller.require(name)
        return False

    async def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        raise self.controller.unavailable(name)

    async def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        entry = self.controller.require(name)
        if entry.model is None:
            raise self.controller.unavailable(name)
        return dict(entry.model.config_json)

    async def model_description(self, name: str, version: str = "") -> ModelDescription:
        raise self.controller.unavailable(name)

    async def infer(self, request: InferRequest) -> InferResponse:
        raise self.controller.unavailable(request.model_name)

    async def model_statistics(self, name: str | None = None, version: str = "") -> dict[str, Any]:
        if name is not None:
            raise self.controller.unavailable(name)
        names = [n for n, e in sorted(self.controller.entries.items()) if e.state == ModelState.READY]
        results = await asyncio.gather(*(self._model_stats(n) for n in names), return_exceptions=True)
        out: list[dict[str, Any]] = []
        for r in results:
            if isinstance(r, list):
                out.extend(r)
        return {"model_stats": out}

    async def _model_stats(self, name: str) -> list[dict[str, Any]]:
        """The model's replicas (pushed when it has several, else asked) plus copies hosted by ensembles."""
        pushed = self._stats.get(name, {})
        own = [s for key, s in pushed.items() if not is_hosted_key(key)]
        hosted = [s for key, s in pushed.items() if is_hosted_key(key)]
        if not own:
            handle = serve.get_deployment_handle(MODEL_DEPLOYMENT, app_name=model_app_name(name))
            own = [await handle.stats_snapshot.remote()]
        return merge_snapshots(own + hosted)

    async def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return self.controller.index(ready_only)

    async def load_model(self, name: str, parameters: Mapping[str, Any]) -> None:
        if self.controller.options.model_control_mode == "none":
            raise Unavailable("explicit model load / unload is not allowed if polling is enabled")
        if parameters.get("config") or any(k.startswith("file:") for k in parameters):
            raise InvalidArgument("loading a model with an overriding config or files is not supported yet")
        await self.controller.load(name)

    async def unload_model(self, name: str, parameters: Mapping[str, Any]) -> None:
        if self.controller.options.model_control_mode == "none":
            raise Unavailable("explicit model load / unload is not allowed if polling is enabled")
        await self.controller.unload(name)


@serve.deployment(name="server", ray_actor_options={"num_cpus": 0.05}, max_ongoing_requests=1000)
@serve.ingress()
class ServerDeployment:
    def __init__(self, options: ControllerOptions) -> None:
        import ray

        from deployments.serve.response_writes import coalesce_response_writes

        coalesce_response_writes()
        resources = ray.cluster_resources()
        deployer = RayDeployer(
            float(resources.get("CPU", 1)), int(resources.get("GPU", 0)), access_log=options.access_log
        )
        self.controller = ModelController(options, deployer)
        self._stats: dict[str, dict[str, list[dict[str, Any]]]] = {}
        self._start = asyncio.get_running_loop().create_task(self._startup())

    async def _startup(self) -> None:
        try:
            await self.controller.start()
        except ServerError as exc:
            logger.error("model repository: %s", exc.message)
        except Exception:
            logger.exception("model repository failed to load")

    def __serve_build_asgi_app__(self) -> Any:
        from deployments.protocol.http import ServerHTTPApp

        return ServerHTTPApp(ServerDataPlane(self.controller, self._stats))

    def report_stats(self, model: str, replica: str, snapshot: list[dict[str, Any]]) -> None:
        self._stats.setdefault(model, {})[replica] = snapshot

    def cluster_stats(
        self, model: str, replica: str, snapshot: list[dict[str, Any]], remember: bool = True
    ) -> list[dict[str, Any]]:
        """``snapshot`` summed with everything else held for ``model``; ``remember`` keeps it (replicas
        that push every second), a single replica's is used for this answer only."""
        if remember:
            self.report_stats(model, replica, snapshot)
        others = [s for key, s in self._stats.get(model, {}).items() if key != replica]
        return merge_snapshots([snapshot, *others])

    def index(self) -> list[dict[str, Any]]:
        return self.controller.index()

    def is_started(self) -> bool:
        return self._start.done()


def resolve_repository(repo: str) -> str:
    """A relative repository path is taken from the working directory, else from the project root."""
    if "://" in repo or Path(repo).is_absolute():
        return repo
    here = Path.cwd() / repo
    if here.exists():
        return str(here.resolve())
    return str((Path(__file__).resolve().parents[2] / repo).resolve())


def build_app(args: dict[str, Any]) -> Any:
    """Application builder for ``serve run`` / ``serve deploy`` (``import_path: deployments.serve.app:build_app``).

    args: ``model_repository`` (required), ``model_control_mode`` (none|explicit|poll),
    ``load_model`` (list, explicit mode), ``model_config_name``,
    ``disable_auto_complete_config`` (bool), ``strict_readiness`` (bool), ``access_log`` (bool: one
    Serve access-log line per model request; off by default, as Triton logs no requests).
    """
    repo = args.get("model_repository")
    if not repo:
        raise ValueError("args.model_repository is required (the path of a Triton model repository)")
    mode = str(args.get("model_control_mode", "none")).lower()
    if mode not in ("none", "explicit", "poll"):
        raise ValueError(f"args.model_control_mode must be none, explicit or poll, not '{mode}'")
    load = args.get("load_model") or ()
    options = ControllerOptions(
        repository=resolve_repository(str(repo)),
        model_control_mode=mode,
        load_models=tuple([load] if isinstance(load, str) else load),
        config_name=args.get("model_config_name"),
        auto_complete=not bool(args.get("disable_auto_complete_config", False)),
        strict_readiness=bool(args.get("strict_readiness", True)),
        access_log=bool(args.get("access_log", False)),
    )
    return ServerDeployment.bind(options)


__all__ = ["build_app", "ServerDeployment", "SERVER_APP"]
