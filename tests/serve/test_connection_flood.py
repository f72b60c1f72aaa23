"""Idle and slow connections never lock other clients out: with 5,000 idle sockets and 2,000 half-sent
request heads open on the HTTP port, a normal client is answered at once, and the half-sent heads
are closed after the request timeout (a standalone server: HAProxy's own limits are what is tested)."""

from __future__ import annotations

import http.client
import resource
import socket
import time
from pathlib import Path

import pytest

from deployments.serve.haproxy_shim import REQUEST_TIMEOUT_ENV
from tests.serve import recovery_models
from tests.serve.standalone import Server
from tests.serve.standalone import http as http_get

pytestmark = [pytest.mark.serve, pytest.mark.slow]

IDLE = 5000
HALF_SENT = 2000
REQUEST_TIMEOUT_S = 4  # the shim's request timeout for this server (default 10 s)
FILE_LIMIT = 20000  # HAProxy then accepts 7,897 connections (haproxy_shim.connection_limit)


def _open(port: int, count: int, first_bytes: bytes = b"") -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        if first_bytes:
            sock.sendall(first_bytes)
        sockets.append(sock)
    return sockets


def _latencies_ms(port: int, count: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    out = []
    try:
        for _ in range(count):
            started = time.perf_counter()
            conn.request("GET", "/v2/health/ready")
            response = conn.getresponse()
            response.read()
            assert response.status == 200
            out.append((time.perf_counter() - started) * 1000)
    finally:
        conn.close()
    return out


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(0.05)
    try:
        return sock.recv(4096) is not None  # b"" (closed) or HAProxy's 408 before it closes
    except (TimeoutError, BlockingIOError):
        return False
    except OSError:
        return True


def test_idle_and_half_sent_connections_do_not_lock_clients_out(tmp_path: Path, monkeypatch) -> None:
    # this process holds the flood's sockets; HAProxy sizes its maxconn from the same (inherited) limit
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < FILE_LIMIT:
        pytest.skip(f"this machine allows {hard} open files; the flood needs {FILE_LIMIT}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    monkeypatch.setenv(REQUEST_TIMEOUT_ENV, str(REQUEST_TIMEOUT_S))
    repo = recovery_models.build(tmp_path)
    server = Server(repo, args={"model_control_mode": "explicit", "load_model": ["add_one"]})
    opened: list[socket.socket] = []
    try:
        server.wait_ready(["add_one"])
        deadline = time.monotonic() + 60
        while http_get(f"{server.url}/v2/health/ready", timeout=5)[0] != 200:  # gRPC up too
            assert time.monotonic() < deadline, "the server never said ready"
            time.sleep(0.2)
        assert max(_latencies_ms(server.port, 20)) < 1000  # warm
        opened += _open(server.port, IDLE)
        half = _open(
            server.port, HALF_SENT, b"POST /v2/models/add_one/infer HTTP/1.1\r\nHost: x\r\nContent-Le"
        )
        opened += half
        latencies = sorted(_latencies_ms(server.port, 200))
        p99 = latencies[int(len(latencies) * 0.99) - 1]
        assert p99 < 50, f"p99 {p99:.1f} ms with {IDLE} idle and {HALF_SENT} half-sent connections open"
        deadline = time.monotonic() + REQUEST_TIMEOUT_S + 10
        while time.monotonic() < deadline and not all(_closed(s) for s in half[:50]):
            time.sleep(0.5)
        assert all(_closed(s) for s in half[:50]), "half-sent request heads were not closed"
    finally:
        for sock in opened:
            sock.close()
        server.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
