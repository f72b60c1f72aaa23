"""Every use of a private Ray Serve or uvicorn interface, in one place.

Ray Serve and uvicorn are pinned (``pyproject.toml``); what this server takes from
them beyond their public API is listed in :data:`HOOKS` and reached only through
this module. ``tests/serve/test_hooks.py`` checks each one against the installed
versions without starting Ray, so an upgrade that moves one fails there, by name.

* ``proxy_callback_env``: ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`` (read in
  ``ray/serve/_private/constants.py``) names a function returning the middleware
  of every replica's HTTP server (``deployments.serve.ingress``).
* ``disconnect_disabled_header``: ``x-request-disconnect-disabled: ?1`` makes
  Serve's replica await the application without watching for a client
  disconnect (``ray/serve/_private/http_util.py``).
* ``request_path_env``: the request-path variables (``deployments.serve.launch``)
  are Serve's private constants, read from the environment when Ray starts.
* ``late_bound_asgi_app``: ``@serve.ingress()`` without an app calls the class's
  ``__serve_build_asgi_app__`` after ``__init__`` (``ray/serve/_private/replica.py``).
* ``run_nonblocking``: ``serve.api._run(..., _blocking=False)`` deploys an
  application from inside a replica without waiting on the controller's loop.
* ``status_serializes_routers``: ``serve.status()`` builds a ``RequestRouterConfig`` per deployment,
  which serializes the router class with cloudpickle's process-wide "by value" switch on; it runs
  under :func:`run_application`'s lock (:func:`serve_status`).
* ``deployment_import_serializes_routers``: importing a module whose class is decorated with
  ``@serve.deployment`` builds its ``DeploymentConfig`` and so a ``RequestRouterConfig`` (above): the
  model host's module, which the server application first needs when it pools a model while other
  models deploy, is imported inside the build :func:`run_application` runs under its lock (the first
  pooled model of a start failed to load once in a while: "is not registered for pickle by value").
* ``delete_blocking``: ``serve.delete(name, _blocking=True)`` returns once the
  application is gone.
* ``with_version``: ``Deployment.options(_internal=True, version=...)`` gives a deployment a stable
  code version, so that a redeploy changing only ``num_replicas`` scales it and keeps its replicas.
* ``serve_details``: the controller client's ``get_serve_details()`` (what is
  deployed, with its options); read by tests and diagnostics only.
* ``replica_http_targets``: the controller's ``get_target_groups(app,
  from_proxy_manager=True)`` (what it hands HAProxy): each running replica's
  direct-ingress HTTP address by actor name; the sequence router finds its own
  address there (``deployments.serve.peers.ReplicaDirectory``).
* ``uvicorn_cycle_send``: ``uvicorn.protocols.http.httptools_impl.RequestResponseCycle``
  with ``send``, ``transport`` and ``response_started``, wrapped by
  ``deployments.serve.response_writes``.
* ``haproxy_binary``: ``RAY_SERVE_HAPROXY_BINARY_PATH`` names the HAProxy that Serve's
  HAProxy manager starts (``ray/serve/_private/haproxy.py``: ``get_haproxy_binary``, started as
  ``<binary> ... -f <config>``); ``deployments.serve.haproxy_shim`` is started instead and
  adjusts the configuration Serve's template writes (its ``bind`` and ``errorfile 50x`` lines).
* ``autoscaling_running_requests``: what a deployment's ``record_autoscaling_stats`` returns is
  merged over the replica's own autoscaling report (``ray/serve/_private/replica.py``), so a value
  under Serve's key for running requests (:data:`RUNNING_REQUESTS_KEY`, ``common.py``) replaces
  Serve's count, which does not see the direct lane (``deployments.serve.model_app``).
* ``grpc_passthrough``: Serve's per-replica gRPC server (``ray/serve/_private/grpc_util.py``,
  ``gRPCGenericServer``) calls each ``grpc_options.grpc_servicer_functions`` entry with the server
  after the deployment's constructor, and runs a service marked with ``add_passthrough_service``
  as it was added, without its per-request wrapper (``deployments.serve.grpc_ingress``).
* ``serve_grpc_config``: the controller's ``get_grpc_config()`` (Serve's ``grpc_options``): whether
  Serve's HAProxy and replicas serve gRPC with this server's servicer function.
* ``grpc_max_message_env``: ``RAY_SERVE_GRPC_MAX_MESSAGE_SIZE`` (``constants.py``) is the
  ``grpc.max_receive_message_length`` / ``max_send_message_length`` of Serve's per-replica gRPC
  servers (``grpc_util.DEFAULT_GRPC_SERVER_OPTIONS``), read from the environment when a replica starts.
* ``unscheduled_replicas``: a deployment whose replicas have waited longer than
  ``RAY_SERVE_SLOW_STARTUP_WARNING_S`` for a node with the resources they need carries a status
  message with :data:`UNSCHEDULED_MARK` and the resources asked for and free
  (``deployment_state.py``, ``_check_and_update_transitioning_replicas``); the deployer fails a
  load that stays so past ``placement_timeout_s``. Serve writes the same message for a replica
  whose node has the resources but has not started its worker process yet (a node starts as many
  workers at once as it has CPUs), so the deployer also reads ``pending_resource_demands``.
* ``pending_resource_demands``: the GCS's summary of task and actor resource requests that no node
  can grant now (``ray.autoscaler.v2.sdk.get_cluster_status(...).resource_demands``, the "Pending
  Demands" of ``ray status``); a lease waiting only for its worker process to start is not there.
* ``cluster_kv``: Ray's key-value store in the GCS (``ray.experimental.internal_kv``:
  ``_internal_kv_get`` / ``_internal_kv_put`` with a namespace), which outlives any worker: the
  server application keeps there what its restart must know (models unloaded through the API).
* ``serve_run_interrupt``: ``serve run`` (``ray.serve.scripts.run``, click command ``run`` of
  ``ray.serve.scripts.cli``) connects with ``ray.init`` looked up on the ``ray`` module at call time,
  then waits in ``time.sleep`` and shuts Serve down on ``KeyboardInterrupt``. Ray's driver installs
  absl's failure-signal handler for SIGTERM in ``ray.init`` (it prints a stack trace and dies by the
  signal, skipping that shutdown); :func:`serve_run` sets SIGTERM back to an interrupt after it.
* ``actor_ready_probe``: every actor class gets a ``__ray_ready__`` method (``ray/actor.py``,
  ``_modify_class``); calling it on a handle of a dead actor raises ``RayActorError``. The rate
  limiter's actor asks it of the replicas holding resources (:func:`actor_gone`).
* ``reconfigure_rank``: after replicas of a deployment are removed, Serve's controller renumbers the
  others so their ranks run ``0 .. N-1`` (``deployment_state.py``,
  ``check_rank_consistency_and_reassign_minimally``) and calls the deployment's ``reconfigure`` with
  the new rank where that method takes a ``rank`` argument (``replica.py``, ``call_reconfigure``);
  a stateful model's replica follows its rank there (``deployments.serve.model_app``).
* ``raylet_agent_listen_port``: ``ray start`` builds the raylet's command in
  ``ray._private.services.start_raylet`` and starts it through the module's ``start_ray_process``
  (process type ``raylet``); it passes the dashboard agent's ``--listen-port`` to the agent but never
  ``--dashboard_agent_listen_port`` to the raylet, which then waits for the agent to write that port
  to a file and aborts the node's start after 15 s (``Timed out waiting for file
  .../dashboard_agent_listen_port_<node>``), as an agent still importing on a busy 2-core node does
  now and then. :func:`ray_start` runs ``ray start`` with the raylet told the port the agent was
  given (``triton-serve ray-start`` fixes every agent port, ``tools/netns_cluster.AGENT_PORTS``).
* ``replica_http_server_start``: Serve's replica starts its direct-ingress HTTP server in
  ``_maybe_start_direct_ingress_servers`` (run after the deployment's constructor) by calling the
  module-level name ``start_asgi_http_server`` of ``ray.serve._private.replica`` with the app and
  the HTTP options (their ``port`` the allocated one); it returns the serving task and uvicorn's
  ``Server``. :func:`after_replica_http_start` wraps that name (``deployments.serve.local_sockets``).
* ``uvicorn_extra_listener``: uvicorn's ``Server`` builds each connection's protocol from
  ``config.http_protocol_class(config=, server_state=, app_state=)``, keeps its listeners in
  ``servers`` (closed by ``shutdown``, which then calls ``shutdown()`` on each of
  ``server_state.connections``, waits until that set is empty, and then for ``server_state.tasks``)
  and sets ``started`` once they accept; ``config.loaded_app`` and ``config.root_path`` are the
  application and root path its protocol serves (:func:`uvicorn_add_listener`, which may serve the
  listener with another protocol, ``deployments.protocol.http1_server``).
* ``haproxy_grpc_frontend``: Serve's HAProxy template writes ``frontend grpc_frontend`` and one
  backend ``grpc-<application>`` per application (``haproxy.py``, ``haproxy_templates.py``), which
  ``deployments.serve.haproxy_shim`` routes by model name.
* ``worker_setup_hook_env``: a Ray worker process calls the function that the runtime-environment
  variable :data:`SETUP_HOOK_ENV` names (``module.attribute``) when it starts, before it takes any
  task or actor (``ray/_private/workers/default_worker.py``; ``ray_constants``
  ``WORKER_PROCESS_SETUP_HOOK_ENV_VAR``, which Ray's public ``worker_process_setup_hook`` sets for a
  job only). The server deployment sets it in its own ``runtime_env`` and the models' (a function
  each), so a worker started for one, a spare included, has imported what its replica runs
  (``deployments.serve.spare``).
* ``idle_worker_title``: a Ray worker with no task or actor names its process :data:`IDLE_WORKER_TITLE`
  (``ray_constants.WORKER_PROCESS_TYPE_IDLE_WORKER``); a replica counts the spares of its own
  environment on its node by that title and the setup hook in their environment.
* ``session_dir``: a worker's Ray session folder (``ray._private.worker.global_worker.node``,
  ``get_session_dir_path()``), one per node and cluster: the replicas of a node take turns there to
  count and ask for spares (:func:`session_dir`).
* ``raylet_prestart_workers``: the raylet's ``PrestartWorkers`` RPC (``node_manager.proto``: language,
  job id, runtime environment, keep-alive, count) starts idle worker processes for a job and runtime
  environment, which the raylet's idle-worker reaping leaves alone for the keep-alive; an actor of
  that job and environment created on that node then starts in one instead of a new process. Called
  over Ray's own gRPC channel helper (``ray._private.grpc_utils.init_grpc_channel``, which adds the
  cluster's authentication token) at the node's manager address (:func:`prestart_workers`).
* ``inherited_runtime_env``: a deployment deployed from inside a replica without a ``runtime_env``
  gets the caller's (``serve.api._run_many`` passes ``ray.get_runtime_context().runtime_env`` as
  ``build_app``'s default); the server deploys models with its own environment, its setup hook
  swapped for the models' (``deployments.serve.spare.child_runtime_env``).
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import threading
from collections.abc import Callable
from typing import Any

from deployments.timeouts import within

PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
DISCONNECT_DISABLED = (b"x-request-disconnect-disabled", b"?1")
BUILD_ASGI_APP = "__serve_build_asgi_app__"
HAPROXY_BINARY_ENV = "RAY_SERVE_HAPROXY_BINARY_PATH"
RUNNING_REQUESTS_KEY = "running_requests"
GRPC_MAX_MESSAGE_ENV = "RAY_SERVE_GRPC_MAX_MESSAGE_SIZE"
UNSCHEDULED_MARK = "to be scheduled"
SLOW_STARTUP_ENV = "RAY_SERVE_SLOW_STARTUP_WARNING_S"
SLOW_STARTUP_PERIOD_ENV = "RAY_SERVE_SLOW_STARTUP_WARNING_PERIOD_S"
SETUP_HOOK_ENV = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"
IDLE_WORKER_TITLE = "ray::IDLE"

HOOKS = (
    "proxy_callback_env",
    "disconnect_disabled_header",
    "request_path_env",
    "late_bound_asgi_app",
    "run_nonblocking",
    "status_serializes_routers",
    "deployment_import_serializes_routers",
    "delete_blocking",
    "with_version",
    "serve_details",
    "replica_http_targets",
    "uvicorn_cycle_send",
    "haproxy_binary",
    "autoscaling_running_requests",
    "grpc_passthrough",
    "serve_grpc_config",
    "haproxy_grpc_frontend",
    "grpc_max_message_env",
    "unscheduled_replicas",
    "cluster_kv",
    "pending_resource_demands",
    "serve_run_interrupt",
    "actor_ready_probe",
    "reconfigure_rank",
    "raylet_agent_listen_port",
    "replica_http_server_start",
    "uvicorn_extra_listener",
    "worker_setup_hook_env",
    "raylet_prestart_workers",
    "idle_worker_title",
    "session_dir",
    "inherited_runtime_env",
)

KV_NAMESPACE = "triton_serve"

GRPC_FRONTEND = "grpc_frontend"
GRPC_BACKEND_PREFIX = "grpc-"
HTTP_BACKEND_PREFIX = "http-"


def haproxy_backend(prefix: str, app_name: str) -> str:
    """The name of Serve's HAProxy backend of ``app_name`` for a protocol (``prefix``), as Serve's
    ``HAProxyManager._generate_backend_name`` and ``get_safe_name`` write it (without importing Ray:
    the HAProxy shim runs before HAProxy starts)."""
    name = (prefix + app_name).replace("#", "-").replace("/", ".")
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def unscheduled_message(application: Any) -> str | None:
    """Serve's message about replicas of ``application`` (a ``serve.status()`` entry) that no node can
    take now, if one of its deployments carries it."""
    for deployment in getattr(application, "deployments", {}).values():
        message = str(getattr(deployment, "message", "") or "")
        if UNSCHEDULED_MARK in message:
            return message
    return None


_RUN_LOCK = threading.Lock()


def run_application(build: Callable[[], Any], name: str, route_prefix: str) -> None:
    """Build an application (``build()``: ``Deployment.options(...).bind(...)``) and deploy it as
    ``name`` at ``route_prefix``, returning without waiting for it.

    Building and deploying hold one lock per process. Building a deployment's options serializes its
    request router with cloudpickle after registering the router's module "by value", a process-wide
    switch that is turned off again afterwards (``RequestRouterConfig._serialize_request_router_cls``);
    an application pickled by another thread meanwhile failed ("Can't pickle
    MultiplexMixin.__init__: it's not the same object", and ``RequestRouter._record_queue_wait_time``
    before the options were built under the lock too). ``_run`` returns at once without ``_blocking``,
    so this costs little."""
    from ray.serve.api import _run

    with _RUN_LOCK:
        _run(build(), name=name, route_prefix=route_prefix, _blocking=False)


def with_version(deployment: Any, version: str) -> Any:
    """``deployment`` with Serve's code ``version`` set (``Deployment.options`` refuses it unless
    ``_internal``; without one each deploy gets a random version). Serve keeps the running replicas of a
    deployment redeployed with the same version and resources, adding or removing replicas where only
    ``num_replicas`` changed (``DeploymentVersion.requires_actor_restart``)."""
    return deployment.options(_internal=True, version=version)


def serve_status() -> Any:
    """``serve.status()``, under the lock :func:`run_application` builds under.

    ``serve.status()`` builds Serve's pydantic details of every deployment, and each
    ``RequestRouterConfig`` built without its serialized class serializes the router again
    (``config.py``, ``RequestRouterConfig.__init__``), flipping cloudpickle's process-wide "by value"
    switch; run in a thread beside an application being built, it made that build fail ("Can't pickle
    RunningReplica.try_send_request: it's not the same object")."""
    from ray import serve

    with _RUN_LOCK:
        return serve.status()


async def actor_gone(handle: Any, timeout_s: float) -> bool:
    """Whether the actor of ``handle`` is gone (a busy or slow one, not answering in ``timeout_s``, is
    not)."""

    from ray.exceptions import RayActorError

    try:
        await within(handle.__ray_ready__.remote(), timeout_s)
    except RayActorError:
        return True
    except Exception:
        return False
    return False


def kv_get(key: str) -> bytes | None:
    """``key``'s value in the cluster's key-value store (None: not there)."""
    from ray.experimental import internal_kv

    value = internal_kv._internal_kv_get(key, namespace=KV_NAMESPACE)
    return None if value is None else bytes(value)


def kv_put(key: str, value: bytes) -> None:
    """Set ``key`` in the cluster's key-value store (it outlives this process)."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(key, value, overwrite=True, namespace=KV_NAMESPACE)


def session_dir() -> str:
    """This worker's Ray session folder on its node."""
    from ray._private import worker

    return str(worker.global_worker.node.get_session_dir_path())


def import_replica_actor() -> None:
    """Import Serve's replica actor module, as a worker about to run a replica would."""
    import ray.serve._private.replica  # noqa: F401


def prestart_workers(count: int, keep_alive_s: int) -> None:
    """Ask this node's raylet for ``count`` idle worker processes of this worker's job and runtime
    environment, kept at least ``keep_alive_s`` unless an actor or task takes them."""
    import ray
    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import common_pb2, node_manager_pb2, node_manager_pb2_grpc

    context = ray.get_runtime_context()
    node_id = context.get_node_id()
    node = next(n for n in ray.nodes() if n["NodeID"] == node_id)
    request = node_manager_pb2.PrestartWorkersRequest(  # type: ignore[attr-defined]  # generated
        language=common_pb2.PYTHON,  # type: ignore[attr-defined]
        job_id=bytes.fromhex(context.get_job_id()),
        keep_alive_duration_secs=keep_alive_s,
        num_workers=count,
    )
    request.runtime_env_info.serialized_runtime_env = context.get_runtime_env_string()
    channel = init_grpc_channel(f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}")
    try:
        node_manager_pb2_grpc.NodeManagerServiceStub(channel).PrestartWorkers(request, timeout=10)
    finally:
        channel.close()


def pending_resource_demands() -> list[dict[str, float]]:
    """The resource shapes (``{"CPU": 0.2, ...}``) of the actors and tasks that wait for a node with
    free resources now, once per shape."""
    import ray
    from ray.autoscaler.v2.sdk import get_cluster_status

    status = get_cluster_status(ray.get_runtime_context().gcs_address)
    return [
        dict(request.bundle)
        for demand in status.resource_demands.ray_task_actor_demand
        for request in demand.bundles_by_count
    ]


def delete_application(name: str) -> None:
    """Delete application ``name`` and wait until it is gone."""
    from ray import serve

    serve.delete(name, _blocking=True)


def serve_details() -> dict[str, Any]:
    """What the Serve controller reports as deployed: applications, their route and deployment options."""
    from ray.serve.context import _get_global_client

    client = _get_global_client()
    if client is None:
        raise RuntimeError("Serve is not running in this process's Ray instance")
    return dict(client.get_serve_details())


def deployed_options(app_name: str, deployment: str) -> dict[str, Any]:
    """The route prefix and deployment config Serve holds for one deployment of one application (the
    plan's options, and how long a stopping replica waits for its requests: ``exit_timeout_secs``)."""
    app = serve_details()["applications"][app_name]
    config = app["deployments"][deployment]["deployment_config"]
    return {
        "route_prefix": app.get("route_prefix"),
        "num_replicas": config.get("num_replicas"),
        "max_ongoing_requests": config.get("max_ongoing_requests"),
        "ray_actor_options": config.get("ray_actor_options") or {},
        "graceful_shutdown_timeout_s": config.get("graceful_shutdown_timeout_s"),
    }


async def replica_http_targets(app_name: str) -> dict[str, tuple[str, int]]:
    """``actor name -> (ip, port)`` of the running replicas of ``app_name`` whose direct-ingress HTTP
    port is allocated, as the Serve controller lists them for HAProxy."""
    import ray
    from ray.serve._private.common import RequestProtocol
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    groups = await controller.get_target_groups.remote(app_name, True)
    return {
        target.name: (target.ip, int(target.port))
        for group in groups
        if group.protocol == RequestProtocol.HTTP and group.app_name == app_name
        for target in group.targets
    }


def add_passthrough_service(server: Any, service: str) -> None:
    """Have Serve's per-replica gRPC ``server`` run ``service``'s handlers as added (no wrapper)."""
    mark = getattr(server, "add_passthrough_service", None)
    if mark is not None:
        mark(service)


async def serve_grpc_servicers() -> tuple[int, list[str]]:
    """Serve's gRPC port and servicer functions (port 0 or no functions: Serve serves no gRPC)."""
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    options = await controller.get_grpc_config.remote()
    return int(options.port), list(options.grpc_servicer_functions)


def uvicorn_cycle() -> Any | None:
    """uvicorn's httptools request-response cycle class, or None where it is missing or looks different."""
    try:
        from uvicorn.protocols.http.httptools_impl import RequestResponseCycle
    except ImportError:
        return None
    if getattr(RequestResponseCycle, "send", None) is None or not hasattr(RequestResponseCycle, "__init__"):
        return None
    return RequestResponseCycle


_HTTP_START_MARK = "_triton_serve_wrapped"


def after_replica_http_start(started: Callable[[int, Any, Any], None]) -> bool:
    """Call ``started(port, server, task)`` each time Serve's direct ingress starts a replica's HTTP server
    in this process (uvicorn's ``Server`` and the task that runs it, right after both exist, on the
    replica's loop). Serve's replica calls ``start_asgi_http_server`` by its module-level name after the
    deployment's constructor returned, so a wrapper put there from the constructor is the one it calls.
    False where the function is missing; a second call keeps the first wrapper."""
    try:
        from ray.serve._private import replica
    except ImportError:
        return False
    original = getattr(replica, "start_asgi_http_server", None)
    if original is None:
        return False
    if getattr(original, _HTTP_START_MARK, False):
        return True

    async def start_and_tell(app: Any, http_options: Any, **kwargs: Any) -> Any:
        task, server = await original(app, http_options, **kwargs)
        try:
            started(int(http_options.port), server, task)
        except Exception:  # the TCP server serves whatever the extra listener does
            logging.getLogger("ray.serve").exception("after the replica's HTTP server started")
        return task, server

    setattr(start_and_tell, _HTTP_START_MARK, True)
    replica.start_asgi_http_server = start_and_tell
    return True


def uvicorn_started(server: Any) -> bool:
    """Whether uvicorn's ``Server`` finished its startup (its listeners accept)."""
    return bool(getattr(server, "started", False))


ListenerProtocol = Callable[[Any, Any, dict[str, Any], str], asyncio.Protocol]
"""Builds one connection's protocol from uvicorn's loaded application, its ``server_state``, the
lifespan state and the root path (``deployments.protocol.http1_server.Http1Protocol`` takes these)."""


async def uvicorn_add_listener(server: Any, sock: Any, protocol: ListenerProtocol | None = None) -> None:
    """Serve uvicorn's running ``server`` on one more listening Unix socket ``sock`` too, with the same
    application, configuration and connection table, so a graceful shutdown closes it and waits for
    its requests: each connection served by ``protocol`` (None: uvicorn's own HTTP protocol)."""
    config = server.config

    def uvicorn_protocol() -> Any:
        return config.http_protocol_class(
            config=config, server_state=server.server_state, app_state=server.lifespan.state
        )

    def own_protocol() -> Any:
        assert protocol is not None
        return protocol(config.loaded_app, server.server_state, server.lifespan.state, config.root_path)

    if protocol is not None and not config.loaded:
        config.load()
    listener = await asyncio.get_running_loop().create_unix_server(
        uvicorn_protocol if protocol is None else own_protocol, sock=sock, backlog=config.backlog
    )
    if getattr(server, "should_exit", False):  # its shutdown may have closed its listeners already
        listener.close()
        return
    server.servers.append(listener)  # a shutdown starts after should_exit is set, and closes it


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


RAYLET_AGENT_LISTEN_PORT_FLAG = "--dashboard_agent_listen_port"
_AGENT_COMMAND_FLAG = "--dashboard_agent_command="
_AGENT_LISTEN_PORT = re.compile(r"--listen-port=(\d+)")


def with_agent_listen_port(command: list[str]) -> list[str]:
    """A raylet ``command`` that also names the port its dashboard agent was told to listen on, where
    that port is fixed (not 0) and the command does not name it yet."""
    if any(word.startswith(RAYLET_AGENT_LISTEN_PORT_FLAG + "=") for word in command):
        return command
    agent = next((word for word in command if word.startswith(_AGENT_COMMAND_FLAG)), "")
    found = _AGENT_LISTEN_PORT.search(agent)
    if found is None or int(found.group(1)) == 0:
        return command
    return [*command, f"{RAYLET_AGENT_LISTEN_PORT_FLAG}={found.group(1)}"]


def ray_start(arguments: list[str]) -> int:
    """``ray start ARGUMENTS`` in this process (same pid, as ``exec`` would keep it), its raylet told
    the dashboard agent's listen port (:data:`HOOKS`: ``raylet_agent_listen_port``)."""
    from ray._private import ray_constants, services
    from ray.scripts import scripts

    start = services.start_ray_process

    def started(command: list[str], process_type: str, *args: Any, **kwargs: Any) -> Any:
        if process_type == ray_constants.PROCESS_TYPE_RAYLET:
            command = with_agent_listen_port(command)
        return start(command, process_type, *args, **kwargs)

    services.start_ray_process = started
    try:
        scripts.cli.main(args=["start", *arguments], prog_name="ray")  # exits, as `ray start` does
    finally:
        services.start_ray_process = start
    return 0


def serve_run(arguments: list[str]) -> int:
    """``serve run ARGUMENTS`` in this process, a SIGTERM ending it as Ctrl-C does: Serve shuts down
    and the process exits 0, where Ray's handler printed a stack trace and the process died by the
    signal."""
    import ray
    from ray.serve.scripts import cli

    connect = ray.init

    def init(*args: Any, **kwargs: Any) -> Any:
        context = connect(*args, **kwargs)
        signal.signal(signal.SIGTERM, _interrupt)
        return context

    ray.init = init
    try:
        cli.main(args=["run", *arguments], prog_name="serve")  # exits, as the `serve` command does
    finally:
        ray.init = connect
    return 0
