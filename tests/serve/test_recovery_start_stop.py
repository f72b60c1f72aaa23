"""Issue 14, items 7 and 8: the server comes up on the direct request path however it is started, or
says it did not; stopping it leaves no process and no bound port; every listener binds the configured
host. Each case starts a server of its own (tests/serve/standalone.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from deployments.runtime.router import INTERNAL_HEADERS
from deployments.serve import haproxy_shim, hooks
from deployments.serve.launch import REQUEST_PATH_ENV
from deployments.serve.request_path import HAPROXY_SCRIPT
from tests.serve import processes, recovery_models
from tests.serve.recovery_load import one_request
from tests.serve.standalone import ROOT, Server, free_port, http, port_is_bound

pytestmark = pytest.mark.usefixtures("no_local_sockets")


def test_serve_config_carries_the_request_path_variables() -> None:
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    controller = config["controller_options"]["runtime_env"]["env_vars"]
    app = config["applications"][0]["runtime_env"]["env_vars"]
    assert controller == app
    tuning = {"RAY_worker_niceness", "RAY_SERVE_HAPROXY_NBTHREAD"}  # a raylet setting; Serve's default 4
    binary = controller.pop(hooks.HAPROXY_BINARY_ENV)
    assert controller == {k: v for k, v in REQUEST_PATH_ENV.items() if k not in tuning}
    # HAProxy through the shim, named from the repository root (where `serve run` starts)
    assert (ROOT / binary).resolve() == HAPROXY_SCRIPT and os.access(HAPROXY_SCRIPT, os.X_OK)


def test_haproxy_runs_a_thread_per_four_cores_from_one_to_four() -> None:
    # its threads compete with the replicas: one on a small node (bench/results/haproxy_threads)
    assert [haproxy_shim.haproxy_threads(n) for n in (1, 2, 4, 7, 8, 12, 16, 64)] == [1, 1, 1, 1, 2, 3, 4, 4]
    serve_wrote = ["global", "    maxconn 4096", "    nbthread 4", "defaults", "    mode http"]
    # `serve run` and `ray start` nodes get Serve's four unless the variable was set: the shim sizes it
    sized = haproxy_shim.size_threads(serve_wrote, environ={}, cpus=2)
    assert sized == ["global", "    maxconn 4096", "    nbthread 1", "defaults", "    mode http"]
    assert (
        haproxy_shim.size_threads(serve_wrote, environ={haproxy_shim.THREADS_ENV: "4"}, cpus=2) == serve_wrote
    )


def test_serve_config_serves_grpc_through_serves_ports() -> None:
    """gRPC in one hop needs Serve's grpc_options naming the servicer function (docs/grpc.md)."""
    from ray.serve._private.utils import import_attr

    from deployments.serve import grpc_ingress

    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    assert config["grpc_options"]["grpc_servicer_functions"] == [grpc_ingress.SERVICER_FUNCTION]
    assert config["grpc_options"]["port"] == 8001  # Triton's default
    assert import_attr(grpc_ingress.SERVICER_FUNCTION) is grpc_ingress.add_inference_service


def test_haproxy_configuration_is_adjusted(tmp_path: Path) -> None:
    text = (
        "frontend prometheus\n    bind :9101\n    mode http\n"
        "frontend http_frontend\n    bind 10.1.2.3:8000\n"
        "defaults\n    errorfile 503 /x/500.http\n"
        "listen stats\n  bind *:8404\n"
    )
    out = haproxy_shim.rewrite(text, tmp_path)
    assert "bind 10.1.2.3:9101" in out and "bind 10.1.2.3:8404" in out and "bind 10.1.2.3:8000" in out
    assert f"errorfile 503 {tmp_path}/triton-503.http" in out
    page = haproxy_shim.error_page(502)
    head, body = page.split("\r\n\r\n", 1)
    assert head.startswith("HTTP/1.1 503") and "application/json" in head
    assert "error" in json.loads(body)


def test_haproxy_gets_a_request_timeout_and_the_connections_its_file_limit_allows() -> None:
    lines = [
        "global",
        "    maxconn 4096",
        "    nbthread 2",
        "defaults",
        "    mode http",
        "frontend f",
        "    maxconn 10",
    ]
    out = haproxy_shim.raise_connection_limit(haproxy_shim.add_request_timeout(lines, 7), file_limit=20000)
    assert out[:4] == ["global", "    maxconn 7897", "    nbthread 2", "defaults"]  # (20000 - 256) * 2 / 5
    assert "    timeout http-request 7s" in out and out[-1] == "    maxconn 10"  # a frontend's own is kept
    # a generous limit is capped; one lower than Serve's own maxconn lowers it (HAProxy would not start)
    assert haproxy_shim.connection_limit(4096, 1 << 20) == haproxy_shim.MAX_CONNECTIONS
    assert haproxy_shim.connection_limit(4096, 4000) == 1497
    written = ["defaults", "    timeout http-request 30s"]
    assert haproxy_shim.add_request_timeout(written, 7) == written  # a timeout already set stays


def test_a_reloaded_haproxy_answers_a_request_sent_on_an_idle_connection() -> None:
    lines = ["global", "    maxconn 10", "defaults", "    mode http", "frontend f"]
    out = haproxy_shim.keep_idle_connections_on_reload(lines)
    assert out[2:4] == ["defaults", "    option idle-close-on-response"] and out[-1] == "frontend f"
    assert haproxy_shim.keep_idle_connections_on_reload(out) == out  # once


def test_haproxy_logs_each_request_only_where_a_log_target_was_asked_for() -> None:
    """Serve's default syslog target (``127.0.0.1:514``) has no listener unless one was set up: its line
    is left out so that HAProxy formats and sends nothing per request; a named target and every other
    ``log`` line stay."""
    lines = [
        "global",
        "    log 127.0.0.1:514 local0 info",
        "    maxconn 10",
        "defaults",
        "    log global",
        "frontend f",
        "    log /tmp/metrics.sock len 8192 format rfc5424 local1 debug",
    ]
    out = haproxy_shim.drop_unasked_access_log(lines, environ={})
    assert out == [lines[0], *lines[2:]]
    named = {haproxy_shim.LOG_TARGET_ENV: "127.0.0.1:514"}
    assert haproxy_shim.drop_unasked_access_log(lines, environ=named) == lines
    assert "log 127.0.0.1:514" not in haproxy_shim.rewrite("\n".join(lines), Path("/tmp"), slots={})


def test_a_path_no_application_serves_answers_tritons_json_404(tmp_path: Path) -> None:
    """``/V2/health/ready`` or ``//v2/...`` reach Serve's default backend: Triton's 404, not Serve's text;
    a ``/v2`` path there means the server application's backend is missing (a restart): 503, retried.
    Checked with the real HAProxy on the rewritten configuration (no backend for ``/v2`` in it)."""
    out = haproxy_shim.rewrite(SERVE_HAPROXY_CFG, tmp_path)
    assert _backend(out, "default_backend") == [haproxy_shim.STARTING_RETURN, haproxy_shim.NOT_FOUND_RETURN]
    port = free_port()
    serve_writes = (  # Serve's frontend before the server application's backend is in it
        f"frontend http_frontend\n    bind 127.0.0.1:{port}\n    default_backend default_backend\n"
        "backend default_backend\n"
        '    http-request return status 404 content-type text/plain lf-string "not found"\n'
    )
    config = tmp_path / "haproxy.cfg"
    config.write_text(
        "defaults\n    mode http\n    timeout connect 1s\n    timeout client 5s\n    timeout server 5s\n"
        + haproxy_shim.rewrite(serve_writes, tmp_path)
    )
    proxy = subprocess.Popen([haproxy_shim.real_binary(), "-db", "-f", str(config)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while not port_is_bound(port):
            assert proxy.poll() is None and time.monotonic() < deadline, (
                proxy.stderr.read() if proxy.stderr else ""
            )
            time.sleep(0.1)
        for path, status, error in (
            ("/v2/health/ready", 503, "the server is starting or restarting; try again"),
            ("/v2", 503, "the server is starting or restarting; try again"),
            ("/V2/health/ready", 404, "Not Found"),
            ("//v2/health/ready", 404, "Not Found"),
        ):
            code, headers, body = http(f"http://127.0.0.1:{port}{path}")
            assert (code, json.loads(body)) == (status, {"error": error}), (path, body)
    finally:
        proxy.terminate()
        proxy.wait(10)


# Serve's configuration for two models (``m`` with two instance groups, ``solo`` with one), as its template
# writes it: one backend per application, each replica a ``server`` line, the head's proxy a ``backup``.
SERVE_HAPROXY_CFG = """\
frontend http_frontend
    bind 127.0.0.1:8000
    acl is_http-model-m path_beg /v2/models/m/
    acl is_http-model-m--group-1 path_beg /v2/-/instance-groups/model-m--group-1/
    use_backend http-model-m--group-1 if is_http-model-m--group-1
    use_backend http-model-m if is_http-model-m
    use_backend http-model-solo if is_http-model-solo
    default_backend default_backend
backend default_backend
    http-request return status 404 content-type text/plain lf-string "not found"
backend http-model-m
    log global
    http-reuse always
    option httpchk GET /-/healthz
    http-check expect status 200
    default-server inter 5s fall 3 rise 2
    # Servers in this backend
    server SERVE_REPLICA--model-m-model-a1 127.0.0.1:30001 check
    # Fallback to head node's Serve proxy when no ingress replicas are available
    server fallback 127.0.0.1:8010 check backup
backend http-model-m--group-1
    log global
    http-reuse always
    option httpchk GET /-/healthz
    default-server inter 5s fall 3 rise 2
    # Servers in this backend
    server SERVE_REPLICA--model-m--group-1-model-b1 127.0.0.1:30002 check
    server SERVE_REPLICA--model-m--group-1-model-b2 10.0.0.2:30003 check observe layer4 error-limit 10 on-error mark-down
    # Fallback to head node's Serve proxy when no ingress replicas are available
    server fallback 127.0.0.1:8010 check backup
backend http-model-solo
    log global
    server SERVE_REPLICA--model-solo-model-c1 127.0.0.1:30004 check
backend http-model-gone--group-1
    server SERVE_REPLICA--model-gone--group-1-model-d1 127.0.0.1:30005 check
"""


def _backend(text: str, name: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(f"backend {name}") + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith(" ")), len(lines))
    return [line.strip() for line in lines[start:end]]


def test_haproxy_gives_a_models_backend_the_replicas_of_all_its_groups(tmp_path: Path) -> None:
    out = haproxy_shim.rewrite(SERVE_HAPROXY_CFG, tmp_path)
    own = _backend(out, "http-model-m")
    servers = [line.split()[1] for line in own if line.startswith("server ")]
    assert servers == [
        "SERVE_REPLICA--model-m-model-a1",
        "SERVE_REPLICA--model-m--group-1-model-b1",
        "SERVE_REPLICA--model-m--group-1-model-b2",
        "fallback",
    ]
    # copied as Serve wrote them, before the backup server (and its comment), which stays last
    assert "server SERVE_REPLICA--model-m--group-1-model-b2 10.0.0.2:30003 check observe layer4 " in out
    assert own[-2:] == [
        "# Fallback to head node's Serve proxy when no ingress replicas are available",
        "server fallback 127.0.0.1:8010 check backup",
    ]
    # every other line as it was: the group's backend, a model with one group, a group without its model
    group_servers = _backend(SERVE_HAPROXY_CFG, "http-model-m--group-1")[-4:-2]
    lines = SERVE_HAPROXY_CFG.splitlines()
    backup_comment = lines.index(
        "    # Fallback to head node's Serve proxy when no ingress replicas are available"
    )
    expected = [*lines[:backup_comment], *(f"    {line}" for line in group_servers), *lines[backup_comment:]]
    not_found = expected.index(
        '    http-request return status 404 content-type text/plain lf-string "not found"'
    )
    # the one other line adjusted: the default backend's answers
    expected[not_found : not_found + 1] = [
        f"    {haproxy_shim.STARTING_RETURN}",
        f"    {haproxy_shim.NOT_FOUND_RETURN}",
    ]
    # and the lines added: the ingress frontend drops the headers only replicas send each other
    frontend = expected.index("frontend http_frontend") + 1
    expected[frontend:frontend] = [f"    http-request del-header {h.decode()}" for h in INTERNAL_HEADERS]
    assert out.splitlines() == [haproxy_shim.MARK, *expected]


def test_haproxy_group_servers_go_after_the_last_server_without_a_backup() -> None:
    lines = [
        "backend http-model-m",
        "    server a 127.0.0.1:1 check",
        "    timeout server 5s",
        "backend http-model-m--group-2",
        "    server c 127.0.0.1:3 check",
        "backend http-model-m--group-1",
        "    server b 127.0.0.1:2 check",
        "",
    ]
    assert haproxy_shim.merge_group_backends(lines)[:5] == [
        "backend http-model-m",
        "    server a 127.0.0.1:1 check",
        "    server b 127.0.0.1:2 check",
        "    server c 127.0.0.1:3 check",
        "    timeout server 5s",
    ]
    assert haproxy_shim.merge_group_backends(lines[3:]) == lines[3:]


def test_haproxy_never_adds_a_passive_groups_servers_to_the_models_backend() -> None:
    lines = [
        "backend http-model-m",
        "    server a 127.0.0.1:1 check",
        "backend http-model-m--passive-1",
        "    server p 127.0.0.1:2 check",
    ]
    assert haproxy_shim.merge_group_backends(lines) == lines


def _start(tmp_path: Path, **kwargs: object) -> Server:
    repo = recovery_models.build(tmp_path)
    server = Server(repo, args={"model_control_mode": "explicit", "load_model": ["add_one"]}, **kwargs)  # type: ignore[arg-type]
    server.wait_ready(["add_one"])
    return server


@pytest.mark.serve
@pytest.mark.slow
def test_make_serve_is_fast_binds_one_host_and_stops_clean(tmp_path: Path) -> None:
    repo = recovery_models.build(tmp_path)
    server = Server(repo, args={"model_control_mode": "explicit", "load_model": ["add_one"]})
    try:
        _wait_server_ready(server)
        # ready is ready on every protocol: gRPC answers at once (before: UNAVAILABLE for a while,
        # HAProxy taking up the server's gRPC port after its HTTP routes answered)
        _grpc_ready_and_add_one(server)
        status, _, body = http(f"{server.url}/v2")
        assert status == 200 and "request_path" not in json.loads(body), body
        assert one_request(server.url, "add_one", 1.0).correct
        # the answer came through the model replica's own HTTP server (the direct lane), behind HAProxy
        # every listener of HAProxy, and the server's configured ports (gRPC, metrics); Ray's own workers'
        # gRPC ports are Ray's (they listen where Ray puts them)
        listeners = processes.listening(processes.alive(server.track()))
        app_args = yaml.safe_load(server.config.read_text())["applications"][0]["args"]
        configured = {
            server.port,
            server.stats_port,
            server.metrics_port,
            app_args["grpc_port"],
            app_args["metrics_port"],
        }
        ours = [
            (processes.command(pid)[:60], addr, port)
            for pid, addr, port in listeners
            if port in configured or processes.command(pid).split(" ")[0].endswith("haproxy")
        ]
        assert {server.port, server.stats_port} <= {port for _, _, port in ours}, ours
        wide = [row for row in ours if row[1] not in ("127.0.0.1", "::1")]
        assert not wide, wide  # before: HAProxy's stats and metrics ports on every interface
        # a replica gone mid-request is a JSON error, never HAProxy's plain-text page
        status, content_type, body = http(f"{server.url}/v2/models/add_one/no_such_route")
        assert status == 404 or "application/json" in content_type
    finally:
        left = server.stop(signal.SIGTERM)
    assert not left, [processes.command(p) for p in left]  # before: HAProxy kept running, holding the port
    assert not port_is_bound(server.port)
    assert not port_is_bound(server.stats_port)
    # a SIGTERM shuts Serve down as Ctrl-C does: before, Ray's failure-signal handler printed a stack
    # trace ("*** SIGTERM received ... PC: ...") and the launcher died by the signal
    log = server.log.read_text(errors="replace")
    assert server.proc.returncode == 0, (server.proc.returncode, log[-2000:])
    assert "SIGTERM received" not in log and "shutting down" in log, log[-2000:]


@pytest.mark.serve
@pytest.mark.slow
def test_plain_serve_run_on_the_config_is_on_the_fast_path_too(tmp_path: Path) -> None:
    server = _start(tmp_path, launcher=False)
    try:
        status, _, body = http(f"{server.url}/v2")
        meta = json.loads(body)
        # HAProxy and the direct lane came up from the config alone; only the worker priority (a raylet
        # setting) cannot travel in it, and the server says so
        assert meta.get("request_path", {}).get("missing_settings", []) in ([], ["RAY_worker_niceness"]), meta
        # the HAProxy that holds the server's port runs the shim's configuration (deployments/serve/bin/haproxy,
        # named by the config): before, plain `serve run` ran Serve's own, with no gRPC routing by model, no
        # JSON errors, no PDEATHSIG. Found by the port it listens on: Serve reloads HAProxy as deployments
        # come up, and a reload's shim (a shell, then Python) names Serve's file until it execs HAProxy.
        listeners = processes.listening(processes.alive(server.track()))
        serving = {processes.command(pid) for pid, _, port in listeners if port == server.port}
        assert serving and all(".triton.cfg" in command for command in serving), serving
        assert one_request(server.url, "add_one", 1.0).correct
        # the server's readiness holds until HAProxy routes every protocol; a model's own readiness over
        # HTTP comes from its replica, which can answer before HAProxy's gRPC side routes to it
        _wait_server_ready(server)
        _grpc_add_one(server)
    finally:
        left = server.stop(signal.SIGINT)
    assert not left, [processes.command(p) for p in left]
    assert not port_is_bound(server.port)


def _wait_server_ready(server: Server, timeout_s: float = 300.0) -> None:
    """Poll ``/v2/health/ready`` (Triton's server readiness) until it answers 200."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        server.track()
        try:
            if http(f"{server.url}/v2/health/ready", timeout=2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"not ready: {server.log.read_text()[-3000:]}")


def _grpc_ready_and_add_one(server: Server) -> None:
    """The first gRPC calls after HTTP said ready: server and model readiness, metadata, an inference."""
    import tritonclient.grpc as grpcclient

    port = yaml.safe_load(server.config.read_text())["grpc_options"]["port"]
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        assert client.is_server_ready()
        assert client.is_model_ready("add_one")
        assert client.get_model_metadata("add_one").name == "add_one"
    finally:
        client.close()
    _grpc_add_one(server)


def _grpc_add_one(server: Server) -> None:
    """A gRPC ModelInfer on the server's gRPC port answers add_one's result."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    port = yaml.safe_load(server.config.read_text())["grpc_options"]["port"]
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        assert client.infer("add_one", [tensor]).as_numpy("OUTPUT0").tolist() == [[2.0] * 4]
    finally:
        client.close()


@pytest.mark.serve
@pytest.mark.slow
def test_a_server_started_without_the_variables_says_so(tmp_path: Path) -> None:
    server = _start(tmp_path, launcher=False, request_path_in_config=False)
    try:
        status, _, body = http(f"{server.url}/v2")
        meta = json.loads(body)
        assert status == 200
        missing = meta["request_path"]["missing_settings"]
        assert "RAY_SERVE_ENABLE_HA_PROXY" in missing and meta["request_path"]["direct"] is False
        assert "SLOW REQUEST PATH" in _logs(server)
    finally:
        server.stop(signal.SIGTERM)


def _logs(server: Server) -> str:
    text = server.log.read_text(errors="replace")
    for path in (server.tmp / "ray").rglob("*.log"):
        text += path.read_text(errors="replace")
    for path in (server.tmp / "ray").rglob("*.err"):
        text += path.read_text(errors="replace")
    return text


SLOW_START_PY = """
import pathlib
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(6)
        pathlib.Path(__file__).with_name("initialized").write_text(repr(time.time()))

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]
            )
            for r in requests
        ]
"""


@pytest.mark.serve
@pytest.mark.slow
def test_live_answers_only_once_the_initial_models_settled(tmp_path: Path) -> None:
    """As tritonserver starts its endpoints after loading: /v2/health/live is not 200 while a model of
    the repository is still initializing, and once it is, that model is ready."""
    repo = tmp_path / "repo"
    (repo / "slow_start" / "1").mkdir(parents=True)
    (repo / "slow_start" / "1" / "model.py").write_text(SLOW_START_PY)
    (repo / "slow_start" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )
    server = Server(repo)
    try:
        deadline = time.monotonic() + 300
        live_at = None
        while time.monotonic() < deadline and live_at is None:
            server.track()
            assert server.proc.poll() is None, server.log.read_text()[-3000:]
            try:
                if http(f"{server.url}/v2/health/live", timeout=2)[0] == 200:
                    live_at = time.time()
            except OSError:
                pass
            time.sleep(0.1)
        assert live_at is not None, "never live"
        initialized = float((repo / "slow_start" / "1" / "initialized").read_text())
        assert live_at >= initialized, (live_at, initialized)
        assert http(f"{server.url}/v2/models/slow_start/ready")[0] == 200
    finally:
        left = server.stop()
    assert not left


def test_a_second_instance_gets_ports_of_its_own() -> None:
    """Two Serve instances on one machine (the session's and a standalone server) share no port:
    the fallback proxies bind theirs with SO_REUSEPORT, which would mix the two instances' traffic."""
    from deployments.serve.request_path import FALLBACK_PORTS, HAPROXY_PORTS, instance_ports_env

    env = instance_ports_env(2)
    assert set(HAPROXY_PORTS) | set(FALLBACK_PORTS) <= set(env)
    assert (env["RAY_SERVE_HAPROXY_STATS_PORT"], env["RAY_SERVE_HAPROXY_METRICS_PORT"]) == ("8412", "9112")
    ports = [int(env[key]) for key in (*HAPROXY_PORTS, *FALLBACK_PORTS)]
    assert len(set(ports)) == len(ports) and max(ports) < 32768  # below the ephemeral range
    assert (
        env["RAY_SERVE_FALLBACK_PROXY_GRPC_PORT"] == "9502"
        and env["RAY_SERVE_FALLBACK_PROXY_HTTP_PORT"] == "8502"
    )
    assert (env["RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT"], env["RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT"]) == (
        "42000",
        "43000",
    )  # clear of Serve's default 40000-41000
    assert env["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"] == "32000"
    with pytest.raises(ValueError):
        instance_ports_env(0)
