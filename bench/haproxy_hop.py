"""What the hop from HAProxy to a replica's HTTP server costs, per request, in three forms.

A bare ASGI application under uvicorn (httptools, uvloop: a replica's HTTP server without the model)
behind the real HAProxy that Serve runs, driven closed loop by raw keep-alive sockets, in turn:

* ``access log, TCP``: Serve's configuration as its template writes it: a syslog line per request to
  ``127.0.0.1:514`` (``RAY_SERVE_HAPROXY_LOG_TARGET``'s default) and the replica over loopback TCP;
* ``no access log, TCP``: the line left out, as ``deployments.serve.haproxy_shim`` does where no
  target was asked for;
* ``no access log, local socket``: the replica reached through its abstract Unix socket
  (``deployments.serve.local_sockets``), as the shim writes a replica of HAProxy's own node.

The three take turns for ``--rounds`` rounds at each concurrency; reported per variant and
concurrency are the medians of requests per second and of the CPU microseconds per request of
HAProxy, of the server and of the client, and the ratios to the first variant.

    python -m bench.haproxy_hop [--rounds 5] [--seconds 3]

Results go to ``bench/results/haproxy_hop/results.json`` with the command and the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.cpu_split import process_cpu_s
from bench.env import save_measurement
from bench.http_floor import APP, drive
from bench.scenarios.common import free_port
from deployments.serve import local_sockets
from deployments.serve.haproxy_shim import DEFAULT_LOG_TARGET, drop_unasked_access_log, real_binary

SERVER = (
    APP
    + """
import asyncio
from deployments.serve import local_sockets
async def main():
    port = int(sys.argv[1])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error",
        access_log=False, http="httptools", loop="uvloop", lifespan="off"))
    task = asyncio.ensure_future(server.serve())
    local_sockets.serve_beside(port, server, task)
    await task
import uvloop
uvloop.run(main())
"""
)

VARIANTS = ("access log, TCP", "no access log, TCP", "no access log, local socket")


def haproxy_config(front: int, server: str, access_log: bool) -> str:
    """The parts of Serve's HAProxy configuration on the request path, one backend to ``server``."""
    lines = [
        "global",
        f"    log {DEFAULT_LOG_TARGET} local0 info",
        "    maxconn 1000",
        "    nbthread 2",
        "    tune.bufsize 65536",
        "defaults",
        "    mode http",
        "    log global",
        "    option httplog",
        "    option splice-request",
        "    option splice-response",
        "    option http-no-delay",
        "    timeout connect 5s",
        "    timeout client 60s",
        "    timeout server 60s",
        "frontend http_frontend",
        f"    bind 127.0.0.1:{front}",
        "    default_backend replica",
        "backend replica",
        "    http-reuse always",
        f"    server r {server}",
    ]
    return "\n".join(lines if access_log else drop_unasked_access_log(lines, {})) + "\n"


def _wait_for(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            asyncio.run(drive(port, 1, 0.2, 64))
            return
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"{what} did not start") from None
            time.sleep(0.2)


def measure(
    rounds: int, seconds: float, concurrencies: list[int], request_bytes: int, response_bytes: int
) -> dict[str, Any]:
    """Start the server and one HAProxy per variant, drive them in turn; every round's figures."""
    port = free_port()
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(response_bytes)], env=env)
    proxies: dict[str, tuple[int, subprocess.Popen[bytes]]] = {}
    folder = Path(tempfile.mkdtemp(prefix="haproxy-hop-"))
    try:
        _wait_for(port, server, "the bare HTTP server")
        deadline = time.monotonic() + 10
        while not local_sockets.owned_listener(port):
            if time.monotonic() > deadline:
                raise RuntimeError("the bare HTTP server's local socket did not start")
            time.sleep(0.1)
        addresses = {
            VARIANTS[0]: (f"127.0.0.1:{port}", True),
            VARIANTS[1]: (f"127.0.0.1:{port}", False),
            VARIANTS[2]: (local_sockets.haproxy_address(port), False),
        }
        for i, (variant, (address, access_log)) in enumerate(addresses.items()):
            front = free_port()
            config = folder / f"variant{i}.cfg"
            config.write_text(haproxy_config(front, address, access_log))
            proc = subprocess.Popen([real_binary(), "-db", "-f", str(config)], stderr=subprocess.DEVNULL)
            proxies[variant] = (front, proc)
            _wait_for(front, proc, f"HAProxy ({variant})")
        points: list[dict[str, Any]] = []
        for round_ in range(rounds):
            for concurrency in concurrencies:
                for variant, (front, proc) in proxies.items():
                    proxy0, server0, client0 = process_cpu_s(proc.pid), process_cpu_s(server.pid), os.times()
                    wall0 = time.perf_counter()
                    requests = asyncio.run(drive(front, concurrency, seconds, request_bytes))
                    wall = time.perf_counter() - wall0
                    client1 = os.times()
                    proxy_s, server_s = process_cpu_s(proc.pid) - proxy0, process_cpu_s(server.pid) - server0
                    client_s = (client1.user - client0.user) + (client1.system - client0.system)
                    n = max(requests, 1)
                    points.append(
                        {
                            "round": round_,
                            "variant": variant,
                            "concurrency": concurrency,
                            "requests": requests,
                            "requests_per_s": requests / wall,
                            "haproxy_cpu_us": 1e6 * proxy_s / n,
                            "server_cpu_us": 1e6 * server_s / n,
                            "client_cpu_us": 1e6 * client_s / n,
                        }
                    )
    finally:
        for _, proc in proxies.values():
            proc.terminate()
            proc.wait(timeout=10)
        server.terminate()
        server.wait(timeout=10)
    return {"points": points, "summary": summarize(points)}


def summarize(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians by concurrency (``c<N>``) and variant, and each variant's ratio to the first one."""
    keys = ("requests_per_s", "haproxy_cpu_us", "server_cpu_us", "client_cpu_us")
    summary: dict[str, Any] = {}
    for concurrency in sorted({p["concurrency"] for p in points}):
        level: dict[str, Any] = {}
        for variant in VARIANTS:
            mine = [p for p in points if p["concurrency"] == concurrency and p["variant"] == variant]
            level[variant] = {k: round(statistics.median(p[k] for p in mine), 1) for k in keys}
        base = level[VARIANTS[0]]
        for variant in VARIANTS:
            level[variant]["throughput_ratio"] = round(
                level[variant]["requests_per_s"] / base["requests_per_s"], 3
            )
        summary[f"c{concurrency}"] = level
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.haproxy_hop", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, action="append", help="levels (default 1 and 16)")
    parser.add_argument("--request-bytes", type=int, default=300)
    parser.add_argument("--response-bytes", type=int, default=200)
    args = parser.parse_args(argv)
    result = measure(
        args.rounds, args.seconds, args.concurrency or [1, 16], args.request_bytes, args.response_bytes
    )
    out = save_measurement("haproxy_hop", result, argv)
    print(json.dumps(result["summary"], indent=1))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
