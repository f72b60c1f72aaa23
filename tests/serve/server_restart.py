"""How long the server application is away after a ``kill -9`` of its replica, with and without the
spare worker (``spare_worker``, deployments/serve/spare.py), in one run.

``python -m tests.serve.server_restart --out bench/results/recovery/server_restart.json``

For each setting a server of its own (tests/serve/standalone.py, ``add_one`` loaded in explicit
mode) has its server replica killed ``--kills`` times, ``--every-s`` apart; a client polls
``/v2/health/ready`` every 10 ms from the kill until it answers 200 from a new replica. Recorded per
kill: the seconds to that answer, whether anything but 503 or 200 came meanwhile, and whether the new
replica started in the spare worker (and the spare's resident memory before the kill).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from deployments.serve import spare
from tests.serve import processes, recovery_models
from tests.serve.standalone import Server, http

POLL_S = 0.01
SERVER_TITLE = "ServeReplica:triton:"


def _server_pid(server: Server) -> int:
    (pid,) = [p for p in processes.alive(server.track()) if SERVER_TITLE in processes.command(p)]
    return pid


def _spares(server: Server) -> set[int]:
    return processes.spare_workers(server.track(), spare.SERVER_PRELOAD)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def _kill_once(server: Server) -> dict[str, Any]:
    pid = _server_pid(server)
    spares = _spares(server)
    rss = [_rss_mib(p) for p in spares]
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    others: list[str] = []
    while True:
        elapsed = time.monotonic() - killed
        if elapsed > 60:
            raise TimeoutError("the server application did not come back within 60 s")
        try:
            status: Any = http(f"{server.url}/v2/health/ready", timeout=5)[0]
        except OSError as exc:
            status = type(exc).__name__
        if status == 200 and pid not in processes.alive(server.track()):
            break
        if status not in (200, 503):
            others.append(f"{elapsed:.3f}s {status}")
        time.sleep(POLL_S)
    return {
        "ready_after_s": round(elapsed, 3),
        "other_answers": others,
        "spares_before": len(spares),
        "spare_rss_mib": max(rss) if rss else None,
        "started_in_spare": _server_pid(server) in spares,
    }


def measure(spare_worker: bool, kills: int, every_s: float) -> dict[str, Any]:
    repo = recovery_models.build(Path(tempfile.mkdtemp(prefix="trs-restart-")))
    server = Server(
        repo, args={"model_control_mode": "explicit", "load_model": ["add_one"], "spare_worker": spare_worker}
    )
    try:
        server.wait_ready(["add_one"])
        runs = []
        for _ in range(kills):
            time.sleep(every_s)
            runs.append(_kill_once(server))
        times = [r["ready_after_s"] for r in runs]
        rss = [r["spare_rss_mib"] for r in runs if r["spare_rss_mib"] is not None]
        return {
            "spare_worker": spare_worker,
            "runs": runs,
            "median_s": round(statistics.median(times), 2),
            "max_s": round(max(times), 2),
            "spare_rss_mib": max(rss) if rss else None,
        }
    finally:
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results/recovery/server_restart.json")
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--every-s", type=float, default=10.0, help="pause before each kill")
    args = parser.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    results = {
        "with_spare": measure(True, args.kills, args.every_s),
        "without_spare": measure(False, args.kills, args.every_s),
    }
    results["ratio_median"] = round(
        results["with_spare"]["median_s"] / results["without_spare"]["median_s"], 2
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = (
        f".venv/bin/python -m tests.serve.server_restart --out {args.out} --kills {args.kills} "
        f"--every-s {args.every_s:g}"
    )
    out.write_text(json.dumps({"command": command, "commit": commit, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
