"""HAProxy reaches a replica of its own node through the replica's local Unix socket
(``deployments.serve.local_sockets``): the replica's HTTP server listens there too, the shim writes
that address only for a replica of this node whose socket answers, and the real HAProxy forwards
requests over it. Serve's own ``start_asgi_http_server`` starts the server, as in a replica; no Ray."""

from __future__ import annotations

import asyncio
import http.client
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from ray.serve._private import replica
from ray.serve.config import HTTPOptions

from deployments.serve import haproxy_shim, hooks, local_sockets
from tests.protocol.haproxy import running_haproxy
from tests.serve.standalone import free_port

_kinds: dict[int, str] = {}  # the replica server's local-socket protocol, by the server's id


def replica_server_kind(server: Any) -> str:
    return _kinds[id(server)]


_release: asyncio.Event | None = None  # set by a test, on its own loop


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    if scope["path"] == "/held" and _release is not None:
        await _release.wait()
    body = f"{scope['method']} {scope['path']}".encode()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]}
    )
    await send({"type": "http.response.body", "body": body})


def _ask_over_socket(port: int, path: str) -> bytes:
    """One HTTP/1.1 request over the local socket of TCP ``port``; the whole response."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(local_sockets.socket_name(port))
        s.sendall(f"GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode())
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.fixture(params=["own", "uvicorn"])
async def replica_server(monkeypatch: pytest.MonkeyPatch, request) -> AsyncIterator[tuple[int, Any]]:
    """A replica's HTTP server as Serve starts it, with the local socket installed first, served by this
    server's own HTTP/1.1 protocol or by uvicorn's."""
    monkeypatch.setattr(replica, "start_asgi_http_server", replica.start_asgi_http_server)  # restored after
    lean = request.param == "own"
    assert local_sockets.install(lean, busy_poll_us=100 if lean else 0, environ={}) is True
    _kinds.clear()
    assert local_sockets.install(environ={}) is True  # a second deployment in the process: one wrapper
    port = free_port()
    task, server = await replica.start_asgi_http_server(
        _app, HTTPOptions(host="127.0.0.1", port=port), event_loop=asyncio.get_running_loop()
    )
    for _ in range(500):
        if len(getattr(server, "servers", ())) == 2:
            break
        await asyncio.sleep(0.01)
    _kinds[id(server)] = request.param
    try:
        yield port, server
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


async def test_the_replica_server_answers_on_its_local_socket_and_closes_it_with_tcp(replica_server) -> None:
    port, server = replica_server
    answer = await asyncio.to_thread(_ask_over_socket, port, "/v2/models/m/ready")
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"GET /v2/models/m/ready")
    assert await asyncio.to_thread(local_sockets.owned_listener, port)
    assert local_sockets.local_address("127.0.0.1", port, environ={}) == f"abns@triton-serve-http-{port}"
    server.should_exit = True
    for _ in range(500):
        if not local_sockets.owned_listener(port, timeout_s=0.05):
            break
        await asyncio.sleep(0.01)
    assert not local_sockets.owned_listener(port), "the local socket outlived the server"


async def test_a_request_in_flight_on_the_local_socket_is_answered_through_a_shutdown(replica_server) -> None:
    """Serve stops the replica's server before the deployment's destructor: a request HAProxy handed over
    the local socket still gets its answer, then the connection closes and the server's task ends."""
    global _release
    port, server = replica_server
    _release = release = asyncio.Event()
    reader, writer = await asyncio.open_unix_connection(local_sockets.socket_name(port))
    writer.write(b"GET /held HTTP/1.1\r\nhost: x\r\n\r\n")
    for _ in range(500):
        if server.server_state.tasks and len(server.server_state.connections) == 1:
            break
        await asyncio.sleep(0.01)
    (connection,) = server.server_state.connections
    served_by_own = type(connection).__name__ == "Http1Protocol"
    assert served_by_own == (replica_server_kind(server) == "own")
    server.should_exit = True
    await asyncio.sleep(0.3)  # the shutdown began and waits for the connection
    assert server.server_state.connections
    release.set()
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"GET /held")
    assert b"connection: close" in answer.lower()


def test_a_replica_is_addressed_locally_only_where_it_is_this_nodes_and_listens() -> None:
    port = free_port()
    assert local_sockets.local_address("127.0.0.1", port, environ={}) is None  # nothing listens there
    sock = local_sockets.listen(port)
    assert sock is not None
    try:
        assert local_sockets.listen(port) is None  # the name is taken: TCP only, no error
        assert local_sockets.local_address("127.0.0.1", port, environ={}) == local_sockets.haproxy_address(
            port
        )
        assert local_sockets.local_address("192.0.2.7", port, environ={}) is None  # another node's address
        assert local_sockets.local_address("::1", port, environ={}) is None
        assert local_sockets.local_address("127.0.0.1", port, environ={local_sockets.ENV: "0"}) is None
    finally:
        sock.close()


def test_the_shim_rewrites_only_replica_http_servers() -> None:
    lines = [
        "backend http-model-m",
        "    server SERVE_REPLICA_a 127.0.0.1:30001 check observe layer4",
        "    server SERVE_REPLICA_b 10.0.0.9:30002 check",
        "    server SERVE_PROXY_ACTOR-fallback 127.0.0.1:8500 check backup",
        "backend trs-grpc-h1-model-m",
        "    server SERVE_REPLICA_a 127.0.0.1:30001 check",
        "backend grpc-model-m",
        "    server SERVE_REPLICA_a 127.0.0.1:30001 check",
    ]

    def local(host: str, port: int) -> str | None:
        return f"abns@x-{port}" if host == "127.0.0.1" else None

    out = haproxy_shim.use_local_sockets(lines, local)
    assert out[1] == "    server SERVE_REPLICA_a abns@x-30001 check observe layer4"
    assert out[2:4] == lines[2:4]  # another node's replica; Serve's proxy
    assert out[5] == "    server SERVE_REPLICA_a abns@x-30001 check"
    assert out[7] == lines[7]  # a gRPC port (HTTP/2 to Serve's per-replica server) is not an HTTP one


def test_a_server_once_local_stays_local_when_its_probe_misses() -> None:
    """HAProxy restores a server's port from the state Serve dumps at a reload (0 for a local address):
    a replica written local once is not written back to TCP when its socket is busy at a probe."""
    previous = "\n".join(
        haproxy_shim.use_local_sockets(
            ["backend http-model-m", "    server SERVE_REPLICA_a 127.0.0.1:30001 check"],
            lambda host, port: f"abns@x-{port}",
        )
    )
    assert haproxy_shim.local_addresses(previous) == {"SERVE_REPLICA_a": "abns@x-30001"}
    now = [
        "backend http-model-m",
        "    server SERVE_REPLICA_a 127.0.0.1:30001 check",
        "    server SERVE_REPLICA_c 127.0.0.1:30003 check",
    ]
    out = haproxy_shim.use_local_sockets(now, lambda host, port: None, haproxy_shim.local_addresses(previous))
    assert out[1:] == ["    server SERVE_REPLICA_a abns@x-30001 check", now[2]]


async def test_haproxy_forwards_to_the_replica_over_its_local_socket(replica_server, tmp_path: Path) -> None:
    port, _ = replica_server
    front = free_port()
    address = local_sockets.local_address("127.0.0.1", port, environ={})
    assert address is not None
    config = (
        "defaults\n    mode http\n    timeout connect 1s\n    timeout client 5s\n    timeout server 5s\n"
        f"frontend f\n    bind 127.0.0.1:{front}\n    default_backend http-model-m\n"
        f"backend http-model-m\n    server r {address}\n"
    )

    def ask() -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", front, timeout=5)
        try:
            connection.request("POST", "/v2/models/m/infer", body=b"{}")
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    with running_haproxy(config, tmp_path, front):
        assert await asyncio.to_thread(ask) == (200, b"POST /v2/models/m/infer")


def test_the_hook_tells_the_port_serve_allocated() -> None:
    told: list[int] = []

    async def original(app: Any, http_options: Any, **kwargs: Any) -> tuple[str, str]:
        return "task", "server"

    saved = replica.start_asgi_http_server
    replica.start_asgi_http_server = original
    try:
        assert hooks.after_replica_http_start(lambda port, server, task: told.append(port))
        result = asyncio.run(replica.start_asgi_http_server(None, HTTPOptions(port=31234), event_loop=None))
    finally:
        replica.start_asgi_http_server = saved
    assert result == ("task", "server") and told == [31234]


async def test_a_listener_added_after_the_shutdown_began_is_closed_not_kept() -> None:
    """uvicorn closes the listeners it knows when its shutdown starts: one attached after that must close
    itself, or it would accept connections nobody serves until the process ends."""
    import types

    port = free_port()
    sock = local_sockets.listen(port)
    assert sock is not None
    config = types.SimpleNamespace(http_protocol_class=object, backlog=16)
    server = types.SimpleNamespace(
        config=config,
        server_state=None,
        lifespan=types.SimpleNamespace(state={}),
        servers=[],
        should_exit=True,
    )
    await hooks.uvicorn_add_listener(server, sock)
    assert server.servers == [] and not local_sockets.owned_listener(port)
