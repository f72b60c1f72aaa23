"""The raw limit: the CRNN model served with dynamic batching, against onnxruntime called directly.

The server runs the example model (its own dynamic-batching config, with one and with two CPU
instances) at concurrency 16 with two rows per request; its statistics say which batch sizes it
formed. The same ONNX file runs in this process through onnxruntime (one session, its default
threads) at those batch sizes, in the same proportions, while no server runs: once before the server
starts and once after it stopped, and the mean of the two is the direct throughput (this machine's
speed drifts by more than 10% between minutes; both are recorded). The served
throughput as a fraction of that direct throughput is the scenario's number, per configuration.

While the bench client measures, the CPU of every process on the machine is read (``bench.cpu_split``)
and divided by the requests the server answered meanwhile: CPU milliseconds per request for the model
replicas, HAProxy, the client and everything else. Beside it, onnxruntime's own CPU per request at the
same batch sizes, with as many threads per session as the served instances use, and the CPU per
request the machine can spend in all at ``TARGET_FRACTION`` of the direct throughput: together they
say how much of each request's cost is the framework, and how much is serving it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from bench import cpu_split, server_stats
from bench.client import get_json
from bench.peers import PeerSetupError, ServerHandle
from bench.results import Report, Run
from bench.scenarios.common import (
    EXAMPLES,
    free_port,
    log,
    make_repository,
    measure,
    new_report,
    read_config,
    save_report,
    set_instances,
    start_this_server,
    work_dir,
)
from deployments.backends.onnxruntime import default_intra_op_threads

NAME = "limit"
MODEL = "crnn"
ROWS = 2
CONCURRENCY = 16.0
# The example's own config (one CPU instance), and the same with two instances: on a small machine
# two single-threaded sessions keep the cores busier than one session whose threads wait on each
# other whenever the request path takes a core away.
CONFIGURATIONS = (("1 instance", 1), ("2 instances", 2))
# The fraction of the direct throughput this project aims at; the CPU budget per request is given for it.
TARGET_FRACTION = 0.8
# Longer than the interval at which a model's replicas push their statistics to the server.
STATS_SETTLE_S = 2.5


def time_batch(session: Any, feeds: Mapping[str, np.ndarray], seconds: float) -> tuple[float, float]:
    """Mean wall and CPU seconds (all of this process's threads) per ``session.run`` on ``feeds``,
    timed for about ``seconds`` after one warm-up run."""
    session.run(None, dict(feeds))
    n, start, cpu = 0, time.perf_counter(), time.process_time()
    while True:
        session.run(None, dict(feeds))
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return elapsed / n, (time.process_time() - cpu) / n


Timings = dict[int, tuple[float, float]]  # batch size -> (wall, CPU) seconds per run


def time_sizes(model_dir: Path, sizes: Iterable[int], seconds: float = 2.0, threads: int = 0) -> Timings:
    """Wall and CPU seconds per onnxruntime run of the model in ``model_dir`` at each batch size, in
    this process; ``threads``: intra-op threads of the session (0: onnxruntime's default)."""
    import onnxruntime as ort

    config = read_config(model_dir / "config.pbtxt")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(
        str(model_dir / "1" / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )
    rng = np.random.default_rng(0)
    timings: Timings = {}
    for size in sorted(set(sizes)):
        feeds = {i.name: rng.random((size, *i.dims)).astype(np.float32) for i in config.input}
        timings[size] = time_batch(session, feeds, seconds)
    return timings


def over_mix(timings: Timings, batch_sizes: Mapping[int, int]) -> dict[str, Any]:
    """Rows per second and CPU milliseconds per row over a batch-size mix (size -> executions)."""
    rows = sum(size * count for size, count in batch_sizes.items())
    busy = sum(timings[size][0] * count for size, count in batch_sizes.items())
    cpu = sum(timings[size][1] * count for size, count in batch_sizes.items())
    return {
        "seconds_per_batch": {str(k): timings[k][0] for k in sorted(batch_sizes)},
        "rows_per_s_by_size": {str(k): k / timings[k][0] for k in sorted(batch_sizes)},
        "infer_per_s": rows / busy if busy else 0.0,
        "cpu_ms_per_row": 1000 * cpu / rows if rows else 0.0,
    }


def direct_limit(
    model_dir: Path, batch_sizes: Mapping[int, int], seconds: float = 2.0, threads: int = 0
) -> dict[str, Any]:
    """Rows per second, and CPU milliseconds per row, of onnxruntime in one process over the given
    batch-size mix (size -> executions); ``threads``: intra-op threads of the session (0: its default)."""
    return {"intra_op_threads": threads or "default"} | over_mix(
        time_sizes(model_dir, batch_sizes, seconds, threads), batch_sizes
    )


def bracketed(before: Timings, after: Timings) -> Timings:
    """Per batch size, the mean of the timings taken before serving and after it (the one there is,
    for sizes timed only once): the machine's speed drifts, and the served run lies between the two."""
    out: Timings = {}
    for size in set(before) | set(after):
        taken = [t for t in (before.get(size), after.get(size)) if t is not None]
        out[size] = (sum(t[0] for t in taken) / len(taken), sum(t[1] for t in taken) / len(taken))
    return out


async def _answered(url: str, model: str) -> int:
    """Requests the server has answered successfully for ``model`` so far."""
    stats = server_stats.parse_snapshot(await get_json(url, f"/v2/models/{model}/stats"))
    return sum(c.success_count for c in stats.values())


def measure_with_cpu(handle: ServerHandle, model: str, label: str) -> tuple[Run, dict[str, Any]]:
    """The bench client's run at ``CONCURRENCY``, and the machine's CPU per request meanwhile, by role."""
    url = handle.url
    answered0 = asyncio.run(_answered(url, model))
    before = cpu_split.take_snapshot()
    runs = measure(url, model, [CONCURRENCY], label, tools=("bench",), batch_size=ROWS)
    after = cpu_split.take_snapshot()
    # Load has stopped; the count now only has to take in what the other replicas push every second
    # (deployments.serve.model_app), so it is read once that has happened.
    time.sleep(STATS_SETTLE_S)
    answered = asyncio.run(_answered(url, model)) - answered0
    requests_per_s = answered / max(after.wall_s - before.wall_s, 1e-9)
    cores = cpu_split.cores_by_role(before, after, server_pids={handle.process.pid})
    return runs[0], {
        "requests_per_s": requests_per_s,
        "cores": cores,
        "cpu_ms_per_request": cpu_split.per_request_ms(cores, requests_per_s),
    }


def cpu_budget_ms(direct_rows_per_s: float, fraction: float = TARGET_FRACTION) -> float:
    """CPU milliseconds per request (of ``ROWS`` rows) this machine's cores allow at ``fraction`` of
    the direct throughput."""
    requests_per_s = fraction * direct_rows_per_s / ROWS
    return 1000 * len(os.sched_getaffinity(0)) / requests_per_s if requests_per_s > 0 else 0.0


def run(quick: bool = False) -> Report:
    """Measure served vs direct throughput for each configuration and save under ``bench/results/limit/``."""
    work = work_dir(NAME)
    report = new_report(NAME, model=MODEL, rows_per_request=ROWS, concurrency=CONCURRENCY)
    configurations: dict[str, Any] = {}
    for label, instances in CONFIGURATIONS:
        repo = make_repository(work / "repo", [(EXAMPLES / MODEL, MODEL, set_instances(instances))])
        seconds = 1.0 if quick else 3.0
        max_rows = read_config(repo / MODEL / "config.pbtxt").max_batch_size
        log(f"{NAME}: onnxruntime directly before serving, batches of {ROWS} to {max_rows} rows")
        before = time_sizes(repo / MODEL, range(ROWS, max_rows + 1, ROWS), seconds)
        log(f"{NAME}: serving {MODEL} with dynamic batching, {label}")
        try:
            handle = start_this_server(repo, free_port(), log_path=work / f"server-{instances}.log")
        except PeerSetupError as exc:
            report.notes["skipped"] = str(exc)[-600:]
            save_report(report)
            return report
        with handle:
            bench_run, cpu = measure_with_cpu(handle, MODEL, label)
            runs = [bench_run]
            if not quick:
                runs += measure(
                    handle.url, MODEL, [CONCURRENCY], label, tools=("perf_analyzer",), batch_size=ROWS
                )
        report.runs += runs
        served = runs[0].points[0]
        sizes = {int(k): int(v) for k, v in served.main_server(MODEL).get("batch_sizes", {}).items()}
        entry: dict[str, Any] = {"instances": instances}
        if not sizes:
            sizes = {ROWS: 1}
            entry["batch_sizes_assumed"] = "the server reported no batch statistics; timed batches of 2"
        log(f"{NAME}: onnxruntime directly after serving, at batch sizes {sizes}")
        after = time_sizes(repo / MODEL, sizes, seconds)
        limit = {"intra_op_threads": "default"} | over_mix(bracketed(before, after), sizes)
        limit["infer_per_s_before_serving"] = (
            over_mix(before, sizes)["infer_per_s"] if set(sizes) <= set(before) else None
        )
        limit["infer_per_s_after_serving"] = over_mix(after, sizes)["infer_per_s"]
        served_threads = default_intra_op_threads(instances)
        same_threads = direct_limit(repo / MODEL, sizes, seconds=seconds / 2, threads=served_threads)
        cpu["onnxruntime_cpu_ms_per_request"] = {
            "intra_op_threads": served_threads,
            "ms": same_threads["cpu_ms_per_row"] * ROWS,
        }
        cpu["budget_ms_per_request"] = {
            "fraction": TARGET_FRACTION,
            "ms": cpu_budget_ms(limit["infer_per_s"]),
        }
        served_by_tool = {r.tool: r.points[0].infer_per_s for r in runs if r.points}
        configurations[label] = entry | {
            "batch_sizes_formed": {str(k): v for k, v in sizes.items()},
            "direct": limit,
            "cpu": cpu,
            "served_infer_per_s": served_by_tool,
            "fraction_of_limit": {
                tool: value / limit["infer_per_s"] for tool, value in served_by_tool.items()
            },
        }
    report.notes["configurations"] = configurations
    log(f"{NAME}: results in {save_report(report, 'CRNN served vs onnxruntime directly')}")
    return report
