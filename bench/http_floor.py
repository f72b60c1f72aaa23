"""The floor of an HTTP request's CPU cost on this machine, for reading the ``limit`` scenario.

A bare ASGI application under uvicorn (httptools, uvloop: what Serve's direct ingress runs in a
replica) that reads the request body and answers a fixed body, driven closed loop by raw
keep-alive sockets. Request and response sizes default to the CRNN example's binary infer request
of 2 rows (25.6 KB in, 7.7 KB out). Reported: requests per second, and CPU milliseconds per
request of the server process and of the client, so the cost of everything this server does on
top of HTTP (decode, batching, the backend hand-off, encode) can be told from the cost of HTTP.

    python -m bench.http_floor [--concurrency 16] [--seconds 8]

Results go to ``bench/results/http_floor/results.json`` with the command and the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

from bench.cpu_split import process_cpu_s
from bench.env import save_measurement
from bench.scenarios.common import free_port

APP = """
import sys, uvicorn
BODY = b"o" * int(sys.argv[2])
HEAD = [(b"content-type", b"application/octet-stream"), (b"content-length", str(len(BODY)).encode())]
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEAD})
    await send({"type": "http.response.body", "body": BODY})
"""
"""A bare ASGI application answering ``sys.argv[2]`` bytes to any request (source text, for a server process)."""
SERVER = (
    APP
    + """
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error", access_log=False,
            http="httptools", loop="uvloop", lifespan="off")
"""
)


async def drive(port: int, concurrency: int, seconds: float, request_bytes: int) -> int:
    body = b"i" * request_bytes
    request = (
        f"POST /v2/models/m/infer HTTP/1.1\r\nhost: floor\r\ncontent-type: application/octet-stream\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body
    stop = time.perf_counter() + seconds
    done = 0

    async def connection() -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while time.perf_counter() < stop:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            await reader.readexactly(length)
            done += 1
        writer.close()

    await asyncio.gather(*(connection() for _ in range(concurrency)))
    return done


def measure_floor(
    concurrency: int, seconds: float, request_bytes: int, response_bytes: int
) -> dict[str, Any]:
    """Start the bare server, drive it, stop it; the figures as a dict."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(response_bytes)])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                asyncio.run(drive(port, 1, 0.2, request_bytes))
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("the bare HTTP server did not start") from None
                time.sleep(0.2)
        server_cpu0, client0, wall0 = process_cpu_s(server.pid), os.times(), time.perf_counter()
        requests = asyncio.run(drive(port, concurrency, seconds, request_bytes))
        wall = time.perf_counter() - wall0
        client1, server_cpu1 = os.times(), process_cpu_s(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=10)
    client_cpu = (client1.user - client0.user) + (client1.system - client0.system)
    return {
        "concurrency": concurrency,
        "seconds": wall,
        "requests": requests,
        "requests_per_s": requests / wall,
        "server_cpu_ms_per_request": 1000 * (server_cpu1 - server_cpu0) / max(requests, 1),
        "client_cpu_ms_per_request": 1000 * client_cpu / max(requests, 1),
        "request_bytes": request_bytes,
        "response_bytes": response_bytes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.http_floor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--request-bytes", type=int, default=2 * 32 * 100 * 4 + 200)
    parser.add_argument("--response-bytes", type=int, default=2 * 26 * 37 * 4 + 200)
    args = parser.parse_args(argv)
    result = measure_floor(args.concurrency, args.seconds, args.request_bytes, args.response_bytes)
    out = save_measurement("http_floor", {"result": result}, argv)
    print(json.dumps(result, indent=1))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
