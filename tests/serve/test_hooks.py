"""Every private Ray Serve / uvicorn interface the server uses (``deployments.serve.hooks``), checked
against the installed versions without starting Ray: an upgrade that moves one fails here, by name."""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from deployments.serve import hooks
from deployments.serve.launch import REQUEST_PATH_ENV

ROOT = Path(__file__).resolve().parents[2]


def _check_proxy_callback_env() -> None:
    from ray.serve._private import constants

    assert hasattr(constants, hooks.PROXY_CALLBACK_ENV), "Serve no longer reads the proxy callback variable"
    assert REQUEST_PATH_ENV[hooks.PROXY_CALLBACK_ENV] == "deployments.serve.ingress:middlewares"


def _check_disconnect_disabled_header() -> None:
    from ray.serve._private import constants, http_util

    name, value = hooks.DISCONNECT_DISABLED
    assert name.decode() == constants.SERVE_HTTP_REQUEST_DISCONNECT_DISABLED_HEADER
    assert http_util.parse_disconnect_disabled_header({name: value}) is True


def _check_request_path_env() -> None:
    from ray.serve._private import constants, deployment_state

    source = inspect.getsource(constants) + inspect.getsource(deployment_state)
    serve_names = [k for k in REQUEST_PATH_ENV if k.startswith("RAY_SERVE_")]
    missing = [k for k in serve_names if f'"{k}"' not in source]
    assert not missing, f"Serve no longer reads {missing}"


def _check_late_bound_asgi_app() -> None:
    from ray.serve._private import replica

    assert replica.SERVE_BUILD_ASGI_APP_METHOD == hooks.BUILD_ASGI_APP
    from deployments.serve.app import ServerDeployment
    from deployments.serve.model_app import ModelDeployment

    for deployment in (ServerDeployment, ModelDeployment):
        assert hasattr(deployment.func_or_class, hooks.BUILD_ASGI_APP)


def _check_status_serializes_routers() -> None:
    """Why ``serve.status()`` takes the build lock: building a router config serializes the router class."""
    from ray.serve import config

    source = inspect.getsource(config.RequestRouterConfig.__init__)
    assert "_serialize_request_router_cls" in source
    assert "register_pickle_by_value" in inspect.getsource(
        config.RequestRouterConfig._serialize_request_router_cls
    )
    assert "_RUN_LOCK" in inspect.getsource(hooks.serve_status)


def _check_deployment_import_serializes_routers() -> None:
    """Why the model host's module is imported under the build lock: a ``@serve.deployment`` class
    builds a ``DeploymentConfig``, whose router config turns cloudpickle's "by value" switch on and off."""
    from ray import cloudpickle
    from ray.serve._private.config import DeploymentConfig

    flips: list[str] = []
    register, unregister = cloudpickle.register_pickle_by_value, cloudpickle.unregister_pickle_by_value

    def on(module: object) -> None:
        flips.append("on")
        register(module)

    def off(module: object) -> None:
        flips.append("off")
        unregister(module)

    cloudpickle.register_pickle_by_value, cloudpickle.unregister_pickle_by_value = on, off
    try:
        DeploymentConfig()
    finally:
        cloudpickle.register_pickle_by_value, cloudpickle.unregister_pickle_by_value = register, unregister
    assert flips[:2] == ["on", "off"], flips
    from deployments.serve.app import RayDeployer

    build = inspect.getsource(RayDeployer._start_host).split("def build", 1)
    assert "import ModelHostDeployment" in build[1] and "import ModelHostDeployment" not in build[0]


def _check_run_nonblocking() -> None:
    from ray.serve.api import _run

    params = inspect.signature(_run).parameters
    assert {"_blocking", "name", "route_prefix"} <= set(params)
    assert "_blocking" in inspect.getsource(hooks.run_application)
    # building a deployment's options flips cloudpickle's process-wide "by value" switch for the request
    # router's module: run_application builds under its lock for that reason
    from ray.serve.config import RequestRouterConfig

    serialize = inspect.getsource(RequestRouterConfig._serialize_request_router_cls)
    assert "register_pickle_by_value" in serialize and "unregister_pickle_by_value" in serialize


def _check_deployment_version() -> None:
    """A deployment's version set through ``_internal`` reaches Serve, and one that keeps it and its
    resources keeps its replicas (a ``num_replicas`` change scales)."""
    from ray import serve
    from ray.serve._private import client, version

    @serve.deployment
    class Probe:
        pass

    versioned = hooks.with_version(Probe.options(num_replicas=2), "v1")
    assert versioned.version == "v1" and versioned.num_replicas == 2
    assert "version=deployment._version" in inspect.getsource(
        client.ServeControllerClient.deploy_applications
    )
    assert "code_version" in inspect.getsource(version.DeploymentVersion.requires_actor_restart)


def _check_delete_blocking() -> None:
    from ray import serve

    assert "_blocking" in inspect.signature(serve.delete).parameters


def _check_serve_details() -> None:
    from ray.serve._private.client import ServeControllerClient
    from ray.serve.context import _get_global_client

    assert callable(_get_global_client)
    assert callable(ServeControllerClient.get_serve_details)


def _check_replica_http_targets() -> None:
    from ray.serve._private.common import RequestProtocol
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE
    from ray.serve._private.controller import ServeController
    from ray.serve.schema import Target, TargetGroup

    assert SERVE_CONTROLLER_NAME and SERVE_NAMESPACE and RequestProtocol.HTTP
    params = list(inspect.signature(ServeController.get_target_groups).parameters)
    assert params[:3] == ["self", "app_name", "from_proxy_manager"]
    assert {"ip", "port", "name"} <= set(Target.model_fields)
    assert {"targets", "protocol", "app_name"} <= set(TargetGroup.model_fields)


def _check_uvicorn_cycle_send() -> None:
    cycle = hooks.uvicorn_cycle()
    assert cycle is not None, "uvicorn.protocols.http.httptools_impl.RequestResponseCycle is gone"
    params = list(inspect.signature(cycle.send).parameters)
    assert params[:2] == ["self", "message"]
    init = inspect.getsource(cycle.__init__)
    assert "self.transport" in init and "self.response_started" in init


def _check_haproxy_binary() -> None:
    from ray.serve._private import constants, haproxy, haproxy_templates

    assert hasattr(constants, hooks.HAPROXY_BINARY_ENV)
    assert hooks.HAPROXY_BINARY_ENV in inspect.getsource(haproxy.get_haproxy_binary)
    assert '"-f", self.config_file_path' in inspect.getsource(haproxy)
    template = haproxy_templates.HAPROXY_CONFIG_TEMPLATE
    # the lines deployments.serve.haproxy_shim adjusts
    assert "frontend http_frontend\n    bind {{ config.frontend_host }}:" in template
    assert "bind *:{{ config.stats_port }}" in template and "bind :{{ config.metrics_port }}" in template
    assert "errorfile 503 {{ config.error_file_path }}" in template


def _check_autoscaling_running_requests() -> None:
    from ray.serve._private import common, replica

    assert common.RUNNING_REQUESTS_KEY == hooks.RUNNING_REQUESTS_KEY
    source = inspect.getsource(replica.ReplicaMetricsManager._add_autoscaling_metrics_point_async)
    # Serve's own count first, the deployment's stats merged over it
    assert source.index("RUNNING_REQUESTS_KEY: self._num_ongoing_requests") < source.index(
        "metrics_dict.update(custom_metrics)"
    )
    wrapper = inspect.getsource(replica.UserCallableWrapper)
    assert '"record_autoscaling_stats"' in wrapper
    from deployments.serve.model_app import ModelDeployment

    assert callable(getattr(ModelDeployment.func_or_class, "record_autoscaling_stats", None))


def _check_grpc_passthrough() -> None:
    from ray.serve._private import grpc_util

    server = grpc_util.gRPCGenericServer
    assert callable(getattr(server, "add_passthrough_service", None))
    source = inspect.getsource(grpc_util.start_grpc_server)
    assert "grpc_servicer_func_callable" in source, "Serve no longer calls the servicer functions"
    adding = inspect.getsource(server.add_generic_rpc_handlers)
    assert "_passthrough_service_names" in adding, "passthrough services are wrapped again"
    from ray.serve._private import replica

    # the per-replica gRPC server starts after the constructor (the servicer function finds its data plane)
    initialized = inspect.getsource(replica.Replica._on_initialized)
    assert "_maybe_start_direct_ingress_servers" in initialized


def _check_serve_grpc_config() -> None:
    from ray.serve._private.controller import ServeController

    assert callable(getattr(ServeController, "get_grpc_config", None))
    from ray.serve.config import gRPCOptions

    assert {"port", "grpc_servicer_functions"} <= set(gRPCOptions.model_fields)


def _check_haproxy_grpc_frontend() -> None:
    from ray.serve._private import haproxy, haproxy_templates

    template = inspect.getsource(haproxy_templates)
    assert f"frontend {hooks.GRPC_FRONTEND}" in template
    assert "req.hdr(application) -m str {{ backend.app_name }}" in template
    naming = inspect.getsource(haproxy.HAProxyManager._generate_backend_name)
    assert "protocol.value.lower()}-{target_group.app_name}" in naming
    from ray.serve._private.common import RequestProtocol

    assert f"{RequestProtocol.GRPC.value.lower()}-" == hooks.GRPC_BACKEND_PREFIX
    assert f"{RequestProtocol.HTTP.value.lower()}-" == hooks.HTTP_BACKEND_PREFIX
    for app in ("model-add_sub", "model-a.b/c#d e+f", "triton", "model-Upper"):
        for prefix in (hooks.GRPC_BACKEND_PREFIX, hooks.HTTP_BACKEND_PREFIX):
            assert hooks.haproxy_backend(prefix, app) == haproxy.HAProxyManager.get_safe_name(
                f"{prefix}{app}"
            )
    assert "server {{ server.name }} {{ server.host }}:{{ server.port }} check" in template


def _check_grpc_max_message_env() -> None:
    from ray.serve._private import constants, grpc_util

    assert hasattr(constants, hooks.GRPC_MAX_MESSAGE_ENV)
    assert hooks.GRPC_MAX_MESSAGE_ENV in inspect.getsource(constants)
    options = dict(constants.DEFAULT_GRPC_SERVER_OPTIONS)
    assert options["grpc.max_receive_message_length"] == constants.RAY_SERVE_GRPC_MAX_MESSAGE_SIZE
    assert "DEFAULT_GRPC_SERVER_OPTIONS" in inspect.getsource(grpc_util)


def _check_unscheduled_replicas() -> None:
    from types import SimpleNamespace

    from ray.serve._private import deployment_state

    source = inspect.getsource(deployment_state.DeploymentState._check_and_update_transitioning_replicas)
    assert hooks.UNSCHEDULED_MARK in source and "PENDING_ALLOCATION" in source
    assert "update_message" in source, "Serve no longer puts the message on the deployment's status"
    assert hooks.SLOW_STARTUP_ENV in inspect.getsource(deployment_state)
    assert hooks.SLOW_STARTUP_PERIOD_ENV in inspect.getsource(deployment_state)
    waiting = SimpleNamespace(
        message=f"has 1 replicas that have taken more than 30s {hooks.UNSCHEDULED_MARK}."
    )
    app = SimpleNamespace(deployments={"d": SimpleNamespace(message=""), "e": waiting})
    assert hooks.unscheduled_message(app) == waiting.message
    assert hooks.unscheduled_message(SimpleNamespace(deployments={})) is None


def _check_cluster_kv() -> None:
    from ray.experimental import internal_kv

    for name in ("_internal_kv_get", "_internal_kv_put"):
        params = inspect.signature(getattr(internal_kv, name)).parameters
        assert "namespace" in params, f"{name} no longer takes a namespace"
    assert "overwrite" in inspect.signature(internal_kv._internal_kv_put).parameters


def _check_pending_resource_demands() -> None:
    from ray.autoscaler.v2 import schema, sdk

    params = inspect.signature(sdk.get_cluster_status).parameters
    assert "gcs_address" in params, "get_cluster_status no longer takes the GCS address"
    fields = {f.name for f in dataclasses.fields(schema.ResourceDemandSummary)}
    assert "ray_task_actor_demand" in fields
    assert {f.name for f in dataclasses.fields(schema.RayTaskActorDemand)} >= {"bundles_by_count"}
    assert {f.name for f in dataclasses.fields(schema.ResourceRequestByCount)} >= {"bundle", "count"}


CHECKS = {
    "pending_resource_demands": _check_pending_resource_demands,
    "cluster_kv": _check_cluster_kv,
    "unscheduled_replicas": _check_unscheduled_replicas,
    "grpc_max_message_env": _check_grpc_max_message_env,
    "grpc_passthrough": _check_grpc_passthrough,
    "serve_grpc_config": _check_serve_grpc_config,
    "haproxy_grpc_frontend": _check_haproxy_grpc_frontend,
    "proxy_callback_env": _check_proxy_callback_env,
    "disconnect_disabled_header": _check_disconnect_disabled_header,
    "request_path_env": _check_request_path_env,
    "late_bound_asgi_app": _check_late_bound_asgi_app,
    "run_nonblocking": _check_run_nonblocking,
    "status_serializes_routers": _check_status_serializes_routers,
    "deployment_import_serializes_routers": _check_deployment_import_serializes_routers,
    "delete_blocking": _check_delete_blocking,
    "with_version": _check_deployment_version,
    "serve_details": _check_serve_details,
    "replica_http_targets": _check_replica_http_targets,
    "uvicorn_cycle_send": _check_uvicorn_cycle_send,
    "haproxy_binary": _check_haproxy_binary,
    "autoscaling_running_requests": _check_autoscaling_running_requests,
}


def _check_worker_setup_hook_env() -> None:
    from ray._private import ray_constants
    from ray._private.workers import default_worker

    from deployments.serve import spare

    assert ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR == hooks.SETUP_HOOK_ENV
    source = inspect.getsource(default_worker)
    assert "WORKER_PROCESS_SETUP_HOOK_ENV_VAR" in source and "load_and_execute_setup_hook(" in source, (
        "a Ray worker no longer runs the setup hook its runtime environment names"
    )
    # a string is an import path, called with no arguments
    from ray._private.runtime_env.setup_hook import load_and_execute_setup_hook

    for preload in (spare.SERVER_PRELOAD, spare.MODEL_PRELOAD):
        assert load_and_execute_setup_hook(preload) is None
    assert spare.SERVER_RUNTIME_ENV["env_vars"][hooks.SETUP_HOOK_ENV] == spare.SERVER_PRELOAD


def _check_idle_worker_title() -> None:
    from ray._private import ray_constants

    assert ray_constants.WORKER_PROCESS_TYPE_IDLE_WORKER == hooks.IDLE_WORKER_TITLE


def _check_raylet_prestart_workers() -> None:
    from ray._private import grpc_utils
    from ray.core.generated import node_manager_pb2, node_manager_pb2_grpc
    from ray.runtime_context import RuntimeContext

    fields = set(node_manager_pb2.PrestartWorkersRequest.DESCRIPTOR.fields_by_name)
    assert fields >= {"language", "job_id", "runtime_env_info", "keep_alive_duration_secs", "num_workers"}
    assert "PrestartWorkers" in inspect.getsource(node_manager_pb2_grpc.NodeManagerServiceStub)
    assert "address" in inspect.signature(grpc_utils.init_grpc_channel).parameters
    for name in ("get_node_id", "get_job_id", "get_runtime_env_string"):
        assert hasattr(RuntimeContext, name), name


def _check_inherited_runtime_env() -> None:
    from ray.serve import api
    from ray.serve._private import build_app

    assert "default_runtime_env=ray.get_runtime_context().runtime_env" in inspect.getsource(api._run_many)
    source = inspect.getsource(build_app._set_default_runtime_env)
    assert '"runtime_env" not in ray_actor_options' in source, (
        "Serve no longer keeps a deployment's own runtime_env over the caller's"
    )


CHECKS["worker_setup_hook_env"] = _check_worker_setup_hook_env
CHECKS["raylet_prestart_workers"] = _check_raylet_prestart_workers
CHECKS["inherited_runtime_env"] = _check_inherited_runtime_env
CHECKS["idle_worker_title"] = _check_idle_worker_title


def _check_session_dir() -> None:
    from ray._private import node, worker

    # a connected worker holds its node, whose session folder the replicas of that node share
    assert "worker.node = node" in inspect.getsource(worker.connect), "a worker no longer keeps its node"
    assert "session_dir" in inspect.getsource(node.Node.get_session_dir_path)


CHECKS["session_dir"] = _check_session_dir


def _check_serve_run_interrupt() -> None:
    import inspect

    from ray.serve import scripts

    assert "run" in scripts.cli.commands, "`serve run` is no longer a command of ray.serve.scripts.cli"
    source = inspect.getsource(scripts.run.callback)
    assert "ray.init(" in source, "`serve run` no longer connects through ray.init on the ray module"
    assert "except KeyboardInterrupt" in source and "serve.shutdown()" in source, (
        "`serve run` no longer shuts Serve down on KeyboardInterrupt"
    )


CHECKS["serve_run_interrupt"] = _check_serve_run_interrupt


def _check_actor_ready_probe() -> None:
    import inspect

    import ray.actor

    source = inspect.getsource(ray.actor)
    assert "def __ray_ready__(self)" in source, "actors no longer get a __ray_ready__ method"


CHECKS["actor_ready_probe"] = _check_actor_ready_probe


def _check_reconfigure_rank() -> None:
    import inspect

    from ray.serve._private import deployment_state, replica

    from deployments.serve.model_app import ModelDeployment

    state = inspect.getsource(deployment_state)
    assert "def check_rank_consistency_and_reassign_minimally" in state, "Serve no longer renumbers ranks"
    source = inspect.getsource(replica.UserCallableWrapper.call_reconfigure)
    assert '"rank" in params' in source and 'kwargs["rank"] = rank' in source, (
        "Serve no longer passes the rank to a reconfigure method that takes one"
    )
    reconfigure = ModelDeployment.func_or_class.reconfigure  # type: ignore[attr-defined]
    assert "rank" in inspect.signature(reconfigure).parameters


CHECKS["reconfigure_rank"] = _check_reconfigure_rank


def _check_raylet_agent_listen_port() -> None:
    import inspect
    from pathlib import Path

    from ray._private import ray_constants, services
    from ray.scripts import scripts

    assert "start" in scripts.cli.commands, "`ray start` is no longer a command of ray.scripts.scripts.cli"
    source = inspect.getsource(services.start_raylet)
    assert "start_ray_process(" in source and "ray_constants.PROCESS_TYPE_RAYLET" in source, (
        "start_raylet no longer starts the raylet through the module's start_ray_process"
    )
    assert ray_constants.PROCESS_TYPE_RAYLET == "raylet"
    assert "--dashboard_agent_command=" in source, "the raylet is no longer given its agent's command"
    assert '"--listen-port={dashboard_agent_listen_port}"' in source, "the agent's listen port flag moved"
    raylet = Path(services.RAYLET_EXECUTABLE).read_bytes()
    assert hooks.RAYLET_AGENT_LISTEN_PORT_FLAG.lstrip("-").encode() in raylet, (
        "the raylet no longer takes --dashboard_agent_listen_port"
    )


CHECKS["raylet_agent_listen_port"] = _check_raylet_agent_listen_port


def test_a_raylet_is_told_its_agents_fixed_listen_port_once() -> None:
    agent = "--dashboard_agent_command=python -m ray.dashboard.agent --grpc-port=6391 --listen-port=6392"
    command = ["raylet", "--node_id=x", agent]
    told = hooks.with_agent_listen_port(command)
    assert told == [*command, "--dashboard_agent_listen_port=6392"]
    assert hooks.with_agent_listen_port(told) == told  # named already: unchanged
    chosen = ["raylet", agent.replace("--listen-port=6392", "--listen-port=0")]
    assert hooks.with_agent_listen_port(chosen) == chosen  # a port the agent picks: the raylet waits for it


@pytest.fixture(autouse=True)
def _no_collection_during_checks() -> Iterator[None]:
    """The checks read Ray's sources with ``inspect.getsource``, which parses a class's module with
    ``ast``. CPython 3.11.7 fails that parse ("AST constructor recursion depth mismatch") when the
    garbage collector runs a finalizer meanwhile (an earlier test's abandoned asyncio task logging
    "Task was destroyed"), so collect first and keep the collector off while a check runs."""
    import gc

    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _check_replica_http_server_start() -> None:
    from ray.serve._private import replica

    start = replica.start_asgi_http_server
    params = inspect.signature(start).parameters
    assert list(params)[:2] == ["app", "http_options"] and "event_loop" in params
    source = inspect.getsource(replica.Replica._maybe_start_direct_ingress_servers)
    assert "await start_asgi_http_server(" in source, "the replica no longer starts its server by that name"
    assert '"port": port' in source, "the HTTP options no longer carry the allocated port"
    assert "return event_loop.create_task(server.serve(" in inspect.getsource(start)


CHECKS["replica_http_server_start"] = _check_replica_http_server_start


def _check_uvicorn_extra_listener() -> None:
    import uvicorn

    startup = inspect.getsource(uvicorn.Server.startup)
    for needle in (
        "config.http_protocol_class(",
        "server_state=self.server_state",
        "app_state=self.lifespan.state",
        "self.started = True",
    ):
        assert needle in startup + inspect.getsource(uvicorn.Server._serve), needle
    shutdown = inspect.getsource(uvicorn.Server.shutdown)
    assert "for server in self.servers:" in shutdown
    assert "connection.shutdown()" in shutdown and "server_state.connections" in shutdown
    waits = inspect.getsource(uvicorn.Server._wait_tasks_to_complete)
    assert "self.server_state.connections" in waits and "self.server_state.tasks" in waits
    assert "self.loaded_app" in inspect.getsource(uvicorn.Config.load)
    assert "self.root_path" in inspect.getsource(uvicorn.Config.__init__)
    assert "should_exit" in inspect.getsource(uvicorn.Server.main_loop)
    assert "await self.shutdown(" in inspect.getsource(uvicorn.Server._serve)


CHECKS["uvicorn_extra_listener"] = _check_uvicorn_extra_listener


def test_every_hook_has_a_check() -> None:
    assert set(CHECKS) == set(hooks.HOOKS)


@pytest.mark.parametrize("hook", hooks.HOOKS)
def test_hook_is_where_the_server_expects_it(hook: str) -> None:
    CHECKS[hook]()


def test_pinned_versions_are_installed() -> None:
    pins = dict(re.findall(r'^\s*"([\w\[\]-]+)==([\w.]+)"', (ROOT / "pyproject.toml").read_text(), re.M))
    assert pins["ray[serve]"] == metadata.version("ray")
    assert pins["uvicorn"] == metadata.version("uvicorn")


def test_no_private_serve_or_uvicorn_import_outside_the_hooks_module() -> None:
    for path in (ROOT / "deployments").rglob("*.py"):
        if path.name == "hooks.py":
            continue
        text = path.read_text()
        for needle in ("serve.api import _run", "_blocking=", "httptools_impl", "x-request-disconnect"):
            assert needle not in text, f"{path.relative_to(ROOT)} uses a private hook ({needle})"
        if "_private" in text and "ray" in text:
            raise AssertionError(f"{path.relative_to(ROOT)} imports Ray's _private package")
