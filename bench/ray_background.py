"""What Ray's own processes cost a request's round trip at concurrency 1, on a small machine.

Every node of this server runs Ray's processes beside the model replicas and HAProxy: the GCS, the
raylet, the dashboard and its agents, the Serve controller, the proxy actor, idle workers. None is on
a request's path, but on two cores each of their periodic wake-ups takes a core from the client,
HAProxy or the replica for a moment. This measures how much of the latency tail that is.

This server is started on ``identity_py``; one closed-loop keep-alive HTTP client in this process
(JSON requests, concurrency 1) measures windows in turn: with every process running, with every
background process stopped (``SIGSTOP``: all of the server's processes except the replicas and
HAProxy), and with each group of them stopped alone. Each group goes on again (``SIGCONT``) as soon
as its window ends, whatever happens in it. The client is Python, so its own figures are higher than
perf_analyzer's: read the ratios between the modes of one run.

    python -m bench.ray_background [--rounds 3] [--seconds 6]

Results go to ``bench/results/ray_background/results.json`` with the command and the environment.

``--compare KEY=VALUE ...`` measures settings instead: each round starts the server twice, with the
request path's settings as they are and with these added, and measures one running window on each
(the same client), with the CPU each group of processes took in it, then times an unload and a load of
the model through the repository API (the server runs with explicit model control), since settings
that slow Ray's loops slow the control plane too; the two alternate, so a drift of the machine falls on
both. Results go to ``bench/results/ray_background/compare.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import signal
import statistics
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bench.cpu_split import CpuSnapshot, take_snapshot
from bench.env import save_measurement
from bench.scenarios.common import BENCH_MODELS, free_port, make_repository, start_this_server, work_dir

MODEL = "identity_py"
RUNNING = "nothing stopped"
ALL = "all background stopped"
GROUPS: dict[str, tuple[str, ...]] = {
    "Serve controller": ("ServeController",),
    "GCS and raylet": ("gcs_server", "raylet/raylet"),
    "dashboard, agents and monitors": (
        "dashboard",
        "DashboardAgent",
        "runtime_env",
        "log_monitor",
        "monitor.py",
    ),
}
OTHERS = "other actors and the launcher"
QUANTILES = (0.5, 0.9, 0.95, 0.99)


def group_of(cmdline: str) -> str | None:
    """The background group of one of the server's processes; ``None`` for what serves requests (a
    replica of the server application or of a model, HAProxy), which always runs."""
    program = cmdline.split(" ", 1)[0]
    if "ServeReplica:" in cmdline or program.endswith("haproxy"):
        return None
    for group, marks in GROUPS.items():
        if any(mark in cmdline for mark in marks):
            return group
    return OTHERS


def latency_figures(latencies_s: Sequence[float], seconds: float) -> dict[str, float]:
    """Requests per second and the quantiles (microseconds) of one window's round trips."""
    ordered = sorted(latencies_s)
    if not ordered:
        raise ValueError("the window answered no request")
    found = {"requests_per_s": len(ordered) / seconds}
    for q in QUANTILES:
        found[f"p{round(q * 100)}_us"] = 1e6 * ordered[min(len(ordered) - 1, math.floor(len(ordered) * q))]
    return found


def summarize(windows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """The median over rounds of every figure, per mode, and for each mode its throughput and p99 over
    the running mode's (``throughput_ratio``, ``p99_ratio``)."""
    by_mode: dict[str, list[Mapping[str, Any]]] = {}
    for window in windows:
        by_mode.setdefault(str(window["mode"]), []).append(window)
    medians = {
        mode: {key: statistics.median(float(w[key]) for w in rows) for key in rows[0] if key != "mode"}
        for mode, rows in by_mode.items()
    }
    base = medians.get(RUNNING)
    if base is not None:
        for figures in medians.values():
            figures["throughput_ratio"] = figures["requests_per_s"] / base["requests_per_s"]
            figures["p99_ratio"] = figures["p99_us"] / base["p99_us"]
    return medians


class _Client:
    """One keep-alive HTTP connection sending the same JSON infer request in a closed loop."""

    def __init__(self, port: int) -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{MODEL}", timeout=30) as answer:
            meta = json.load(answer)
        spec = meta["inputs"][0]
        shape = [1 if d == -1 else int(d) for d in spec["shape"]]
        count = math.prod(shape)
        data: list[Any] = ["x"] * count if spec["datatype"] == "BYTES" else [1] * count
        tensor = {"name": spec["name"], "shape": shape, "datatype": spec["datatype"], "data": data}
        self.body = json.dumps({"inputs": [tensor]}).encode()
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def window(self, seconds: float) -> dict[str, float]:
        latencies: list[float] = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter()
            self.connection.request("POST", f"/v2/models/{MODEL}/infer", self.body)
            answer = self.connection.getresponse()
            answer.read()
            if answer.status != 200:
                raise RuntimeError(f"the server answered {answer.status}")
            latencies.append(time.perf_counter() - start)
        return latency_figures(latencies, seconds)


def _stopped_window(client: _Client, pids: Sequence[int], seconds: float) -> dict[str, float]:
    stopped: list[int] = []
    try:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        return client.window(seconds)
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def measure(rounds: int, seconds: float) -> dict[str, Any]:
    work = work_dir("ray_background")
    repo = make_repository(work / "repo", [(BENCH_MODELS / MODEL, MODEL, None)])
    http_port = free_port()
    with start_this_server(repo, http_port, log_path=work / "server.log") as server:
        time.sleep(10)  # past the start's own work (the controller's first rounds, the index)
        snapshot = take_snapshot()
        groups: dict[str, list[int]] = {}
        for pid in sorted(snapshot.descendants([server.process.pid])):
            group = group_of(snapshot.cmdlines.get(pid, ""))
            if group is not None:
                groups.setdefault(group, []).append(pid)
        modes: list[tuple[str, list[int]]] = [(RUNNING, []), (ALL, [p for g in groups.values() for p in g])]
        modes += [(group, pids) for group, pids in groups.items()]
        client = _Client(http_port)
        client.window(2.0)  # warm
        windows: list[dict[str, Any]] = []
        for turn in range(rounds):
            for mode, pids in modes:
                figures = _stopped_window(client, pids, seconds)
                windows.append({"mode": mode, **figures})
                print(
                    f"round {turn + 1} {mode}: {figures['requests_per_s']:,.0f} infer/s, p99 "
                    f"{figures['p99_us']:,.0f} us",
                    flush=True,
                )
                time.sleep(1.0)
    return {
        "model": MODEL,
        "seconds_per_window": seconds,
        "rounds": rounds,
        "processes_by_group": {group: len(pids) for group, pids in groups.items()},
        "windows": windows,
        "median": summarize(windows),
    }


DEFAULT = "as configured"
TUNED = "with the settings compared"


def group_cpu_ms_per_s(before: CpuSnapshot, after: CpuSnapshot, pids: Iterable[int]) -> dict[str, float]:
    """CPU milliseconds a second each group of ``pids`` took between two snapshots; what serves
    requests (no group) counts as ``"serving"``, and a process that started in between as idle."""
    wall = after.wall_s - before.wall_s
    out: dict[str, float] = {}
    for pid in pids:
        if pid not in after.cpu_s:
            continue
        group = group_of(after.cmdlines.get(pid, "")) or "serving"
        spent = after.cpu_s[pid] - before.cpu_s.get(pid, after.cpu_s[pid])
        out[group] = out.get(group, 0.0) + 1e3 * spent / wall
    return out


EXPLICIT = ("--model-control-mode=explicit", f"--load-model={MODEL}")


def _repository_call(port: int, action: str) -> float:
    """Seconds the repository API took to ``load`` or ``unload`` the model (it answers when done)."""
    url = f"http://127.0.0.1:{port}/v2/repository/models/{MODEL}/{action}"
    request = urllib.request.Request(
        url, data=b"{}", method="POST", headers={"Content-Type": "application/json"}
    )
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as answer:
        answer.read()
    return time.perf_counter() - start


def control_cycle(port: int) -> dict[str, float]:
    """What the control plane takes: the model unloaded, then loaded again (seconds each)."""
    unload_s = _repository_call(port, "unload")
    time.sleep(1.0)
    return {"unload_s": unload_s, "load_s": _repository_call(port, "load")}


def compare(settings: Mapping[str, str], rounds: int, seconds: float) -> dict[str, Any]:
    """The running window with the request path's settings as they are and with ``settings`` added,
    alternating over ``rounds`` fresh starts of each; medians per side and tuned / default."""
    work = work_dir("ray_background")
    repo = make_repository(work / "repo", [(BENCH_MODELS / MODEL, MODEL, None)])
    windows: list[dict[str, Any]] = []
    for turn in range(rounds):
        for mode, env in ((DEFAULT, {}), (TUNED, dict(settings))):
            http_port = free_port()
            with start_this_server(
                repo, http_port, log_path=work / "server.log", env=env, extra_args=EXPLICIT
            ) as server:
                time.sleep(10)  # past the start's own work
                pids = take_snapshot().descendants([server.process.pid])
                client = _Client(http_port)
                client.window(2.0)  # warm
                before = take_snapshot()
                figures = client.window(seconds)
                cpu = group_cpu_ms_per_s(before, take_snapshot(), pids)
                client.connection.close()
                figures |= control_cycle(http_port)
            windows.append({"mode": mode, **figures, "cpu_ms_per_s": cpu})
            print(
                f"round {turn + 1} {mode}: {figures['requests_per_s']:,.0f} infer/s, p99 "
                f"{figures['p99_us']:,.0f} us, unload {figures['unload_s']:.2f} s, load "
                f"{figures['load_s']:.2f} s, cpu ms/s {json.dumps({k: round(v, 1) for k, v in cpu.items()})}",
                flush=True,
            )
    medians = summarize({k: v for k, v in w.items() if k != "cpu_ms_per_s"} for w in windows)
    ratios = {}
    if DEFAULT in medians and TUNED in medians:
        base, tuned = medians[DEFAULT], medians[TUNED]
        ratios = {
            "throughput_ratio": tuned["requests_per_s"] / base["requests_per_s"],
            "p99_ratio": tuned["p99_us"] / base["p99_us"],
            "load_ratio": tuned["load_s"] / base["load_s"],
            "unload_ratio": tuned["unload_s"] / base["unload_s"],
        }
    cpu_medians: dict[str, dict[str, float]] = {}
    for mode in (DEFAULT, TUNED):
        rows = [w["cpu_ms_per_s"] for w in windows if w["mode"] == mode]
        groups = sorted({g for row in rows for g in row})
        cpu_medians[mode] = {g: statistics.median(row.get(g, 0.0) for row in rows) for g in groups}
    return {
        "model": MODEL,
        "settings": dict(settings),
        "cpu_ms_per_s": cpu_medians,
        "seconds_per_window": seconds,
        "rounds": rounds,
        "windows": windows,
        "median": medians,
        "tuned_over_default": ratios,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ray_background", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--compare", nargs="+", metavar="KEY=VALUE", help="settings to compare")
    args = parser.parse_args(argv)
    if args.compare:
        settings = dict(item.split("=", 1) for item in args.compare)
        compared = compare(settings, args.rounds, args.seconds)
        out = save_measurement("ray_background", compared, argv, file="compare.json")
        print(json.dumps(compared["tuned_over_default"], indent=1))
        print(f"written to {out}")
        return 0
    result = measure(args.rounds, args.seconds)
    out = save_measurement("ray_background", result, argv)
    print(json.dumps(result["median"], indent=1))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
