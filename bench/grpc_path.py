"""Which request path gRPC takes: measured with perf_analyzer ``-i grpc`` into ``bench/results/grpc_path/``.

``python -m bench.grpc_path`` serves ``identity_py`` two ways, one after the other, and runs the same
perf_analyzer points against each (synchronous at concurrency 1, ``--async`` at 32):

* ``(a) server replica``: this server on Serve; the gRPC server runs in the server application's
  replica and calls the model's replica on its own HTTP port (``deployments.serve.peers.ReplicaCalls``;
  a deployment handle before it: ``handle_calls.json`` beside the results), two hops: client ->
  server replica -> model replica.
* ``(b) one hop``: the same gRPC server over the model replica's own data plane
  (``deployments.replica.replica_dataplane`` over a ``ModelRuntime``), in one plain process: what a
  gRPC port inside each model replica would answer at best, with no Serve and no second hop.

``python -m bench.grpc_path replica-server REPO MODEL PORT`` is (b)'s server on its own.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.env import environment
from bench.pa_runner import run_level
from bench.scenarios.common import (
    BENCH_MODELS,
    RESULTS,
    free_port,
    log,
    make_repository,
    start_this_server,
    work_dir,
)

MODEL = "identity_py"
POINTS = (("sync", 1, ()), ("async", 32, ("--async",)))


async def _replica_server(repo: str, model: str, port: int) -> None:
    from deployments.protocol.grpc import GrpcOptions, build_grpc_server
    from deployments.replica import replica_dataplane
    from deployments.runtime.model import ModelRuntime
    from repository_loader.repository import load_model

    description = load_model(repo, model)
    runtime = ModelRuntime(description)
    await runtime.load()
    server, _ = build_grpc_server(replica_dataplane(runtime), GrpcOptions(host="127.0.0.1", port=port))
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


def _wait_port(port: int, timeout: float = 120.0) -> None:
    import grpc

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            try:
                grpc.channel_ready_future(channel).result(timeout=1)
                return
            except grpc.FutureTimeoutError:
                time.sleep(0.5)
    raise TimeoutError(f"nothing answers gRPC on port {port}")


def _measure(url: str, label: str) -> list[dict[str, Any]]:
    rows = []
    for mode, concurrency, extra in POINTS:
        point = run_level(url, MODEL, concurrency, "concurrency", protocol="grpc", extra=extra)
        rows.append(
            {
                "path": label,
                "mode": mode,
                "concurrency": concurrency,
                "infer_per_s": None if point is None else point.infer_per_s,
                "p50_ms": None if point is None else point.p50_us / 1000,
            }
        )
        log(f"grpc_path: {label} {mode} c={concurrency}: {rows[-1]['infer_per_s']}")
    return rows


def run() -> Path:
    work = work_dir("grpc_path")
    repo = make_repository(work / "repo", [(BENCH_MODELS / MODEL, MODEL, None)])
    rows: list[dict[str, Any]] = []
    grpc_port = free_port()
    with start_this_server(repo, free_port(), grpc_port=grpc_port, log_path=work / "this_server.log"):
        rows += _measure(f"localhost:{grpc_port}", "(a) server replica")
    port = free_port()
    cmd = [sys.executable, "-m", "bench.grpc_path", "replica-server", str(repo), MODEL, str(port)]
    with open(work / "replica_server.log", "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait_port(port)
            rows += _measure(f"localhost:{port}", "(b) one hop")
        finally:
            proc.terminate()
            proc.wait(30)
    out_dir = RESULTS / "grpc_path"
    out_dir.mkdir(parents=True, exist_ok=True)
    document = {"environment": environment(command="python -m bench.grpc_path"), "points": rows}
    (out_dir / "results.json").write_text(json.dumps(document, indent=2) + "\n")
    return out_dir


def main(argv: list[str]) -> int:
    if argv[:1] == ["replica-server"]:
        repo, model, port = argv[1:4]
        asyncio.run(_replica_server(repo, model, int(port)))
        return 0
    log(f"grpc_path: results in {run()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
