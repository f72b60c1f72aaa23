"""HAProxy as the shim rewrites Serve's configuration removes the headers replicas set on their calls
to each other from every client request (``haproxy_shim.strip_internal_headers``). The real HAProxy in
front of a small HTTP server that echoes the headers it got; no Ray."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from deployments.runtime.router import INTERNAL_HEADERS
from deployments.serve import haproxy_shim
from tests.protocol.haproxy import running_haproxy


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Echo(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = json.dumps({k.lower(): v for k, v in self.headers.items()}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    echo = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=echo.serve_forever, daemon=True).start()
    port = _free_port()
    folder = tmp_path_factory.mktemp("haproxy")
    config = "\n".join(
        [
            "defaults",
            "    mode http",
            "    timeout connect 5s",
            "    timeout client 30s",
            "    timeout server 30s",
            "frontend http_frontend",
            f"    bind 127.0.0.1:{port}",
            "    default_backend http-model-m",
            "backend http-model-m",
            f"    server r0 127.0.0.1:{echo.server_address[1]}",
        ]
    )
    haproxy_shim.write_error_pages(folder)
    try:
        with running_haproxy(haproxy_shim.rewrite(config + "\n", folder, slots={}), folder, port) as url:
            yield url
    finally:
        echo.shutdown()


def test_internal_headers_never_reach_a_replica_from_a_client(front: str) -> None:
    sent = {name.decode(): "1" for name in INTERNAL_HEADERS}
    got = requests.get(f"http://{front}/v2/models/m/stats", headers={**sent, "x-other": "kept"}, timeout=10)
    assert got.status_code == 200
    seen = got.json()
    assert seen["x-other"] == "kept"
    assert not set(sent) & set(seen)
