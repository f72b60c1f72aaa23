"""The raw limit: the CRNN model served with dynamic batching, against onnxruntime called directly.

The server runs the example model (its own dynamic-batching config, with one and with two CPU
instances) at concurrency 16 with two rows per request; its statistics say which batch sizes it
formed. The server is then stopped and the same ONNX file runs in this process through onnxruntime
(one session, its default threads) at those batch sizes, in the same proportions. The served
throughput as a fraction of that direct throughput is the scenario's number, per configuration.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from bench.peers import PeerSetupError
from bench.results import Report
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

NAME = "limit"
MODEL = "crnn"
ROWS = 2
CONCURRENCY = 16.0
# The example's own config (one CPU instance), and the same with two instances: on a small machine
# two single-threaded sessions keep the cores busier than one session whose threads wait on each
# other whenever the request path takes a core away.
CONFIGURATIONS = (("1 instance", 1), ("2 instances", 2))


def time_batch(session: Any, feeds: Mapping[str, np.ndarray], seconds: float) -> float:
    """Mean seconds per ``session.run`` on ``feeds``, timed for about ``seconds`` after one warm-up run."""
    session.run(None, dict(feeds))
    n, start = 0, time.perf_counter()
    while True:
        session.run(None, dict(feeds))
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return elapsed / n


def direct_limit(model_dir: Path, batch_sizes: Mapping[int, int], seconds: float = 2.0) -> dict[str, Any]:
    """Rows per second of onnxruntime in one process over the given batch-size mix (size -> executions)."""
    import onnxruntime as ort

    config = read_config(model_dir / "config.pbtxt")
    session = ort.InferenceSession(str(model_dir / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    per_size = {}
    for size in sorted(batch_sizes):
        feeds = {i.name: rng.random((size, *i.dims)).astype(np.float32) for i in config.input}
        per_size[size] = time_batch(session, feeds, seconds)
    rows = sum(size * count for size, count in batch_sizes.items())
    busy = sum(per_size[size] * count for size, count in batch_sizes.items())
    return {
        "seconds_per_batch": {str(k): v for k, v in per_size.items()},
        "rows_per_s_by_size": {str(k): k / v for k, v in per_size.items()},
        "infer_per_s": rows / busy if busy else 0.0,
    }


def run(quick: bool = False) -> Report:
    """Measure served vs direct throughput for each configuration and save under ``bench/results/limit/``."""
    work = work_dir(NAME)
    report = new_report(NAME, model=MODEL, rows_per_request=ROWS, concurrency=CONCURRENCY)
    configurations: dict[str, Any] = {}
    for label, instances in CONFIGURATIONS:
        repo = make_repository(work / "repo", [(EXAMPLES / MODEL, MODEL, set_instances(instances))])
        log(f"{NAME}: serving {MODEL} with dynamic batching, {label}")
        try:
            handle = start_this_server(repo, free_port(), log_path=work / f"server-{instances}.log")
        except PeerSetupError as exc:
            report.notes["skipped"] = str(exc)[-600:]
            save_report(report)
            return report
        with handle:
            tools = ("bench",) if quick else ("bench", "perf_analyzer")
            runs = measure(handle.url, MODEL, [CONCURRENCY], label, tools=tools, batch_size=ROWS)
        report.runs += runs
        served = runs[0].points[0]
        sizes = {int(k): int(v) for k, v in served.main_server(MODEL).get("batch_sizes", {}).items()}
        entry: dict[str, Any] = {"instances": instances}
        if not sizes:
            sizes = {ROWS: 1}
            entry["batch_sizes_assumed"] = "the server reported no batch statistics; timed batches of 2"
        log(f"{NAME}: onnxruntime directly at batch sizes {sizes}")
        limit = direct_limit(repo / MODEL, sizes, seconds=1.0 if quick else 3.0)
        served_by_tool = {r.tool: r.points[0].infer_per_s for r in runs if r.points}
        configurations[label] = entry | {
            "batch_sizes_formed": {str(k): v for k, v in sizes.items()},
            "direct": limit,
            "served_infer_per_s": served_by_tool,
            "fraction_of_limit": {
                tool: value / limit["infer_per_s"] for tool, value in served_by_tool.items()
            },
        }
    report.notes["configurations"] = configurations
    log(f"{NAME}: results in {save_report(report, 'CRNN served vs onnxruntime directly')}")
    return report
