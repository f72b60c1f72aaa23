"""How many threads HAProxy should run: this server with each count in turn, on one machine.

This server serves the ``identity_py`` model, started once per thread count and round
(``RAY_SERVE_HAPROXY_NBTHREAD``, which the launcher otherwise sizes to the node,
``deployments.serve.request_path.haproxy_threads``), and perf_analyzer measures it over HTTP and
gRPC at each concurrency. The counts take turns for ``--rounds`` rounds, so a slow moment of the
machine falls on each alike. Reported per protocol, concurrency and count: each round's infer/s,
their mean, and the mean over the first count's.

    python -m bench.haproxy_threads [--rounds 3] [--threads 1 --threads 2]

Results go to ``bench/results/haproxy_threads/results.json`` with the command and the environment.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from bench.env import save_measurement
from bench.pa_runner import run_perf_analyzer
from bench.scenarios.common import BENCH_MODELS, free_port, make_repository, start_this_server, work_dir

MODEL = "identity_py"
LEVELS = (1.0, 8.0, 32.0)
PROTOCOLS = ("http", "grpc")


def measure(rounds: int, threads: list[int], window_s: float) -> dict[str, Any]:
    """Each round starts this server once per thread count and sweeps ``LEVELS`` on both protocols."""
    work = work_dir("haproxy_threads")
    repo = make_repository(work / "repo", [(BENCH_MODELS / MODEL, MODEL, None)])
    rows: dict[str, dict[str, dict[str, list[float]]]] = {}  # protocol -> level -> threads -> infer/s
    for round_ in range(rounds):
        for count in threads:
            handle = start_this_server(
                repo,
                free_port(),
                grpc_port=free_port(),
                log_path=work / f"server-{round_}-{count}.log",
                env={"RAY_SERVE_HAPROXY_NBTHREAD": str(count)},
            )
            with handle:
                for protocol in PROTOCOLS:
                    port = handle.http_port if protocol == "http" else handle.grpc_port
                    run = run_perf_analyzer(
                        f"localhost:{port}",
                        MODEL,
                        LEVELS,
                        label=f"{count} threads, {protocol}",
                        measurement_interval_ms=int(window_s * 1000),
                        max_trials=4,
                        protocol=protocol,
                    )
                    for point in run.points:
                        level = rows.setdefault(protocol, {}).setdefault(f"c{int(point.level)}", {})
                        level.setdefault(str(count), []).append(round(point.infer_per_s, 1))
    base = str(threads[0])
    summary = {
        protocol: {
            level: {
                count: {
                    "infer_per_s": values,
                    "mean": round(statistics.fmean(values), 1),
                    "ratio": round(statistics.fmean(values) / statistics.fmean(by_count[base]), 2),
                }
                for count, values in by_count.items()
            }
            for level, by_count in levels.items()
        }
        for protocol, levels in rows.items()
    }
    return {"model": MODEL, "threads": threads, "rounds": rounds, "summary": summary}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.haproxy_threads", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, action="append", help="thread counts (default 1 and 2)")
    parser.add_argument("--seconds", type=float, default=2.0, help="perf_analyzer's window")
    args = parser.parse_args(argv)
    result = measure(args.rounds, args.threads or [1, 2], args.seconds)
    out = save_measurement("haproxy_threads", result, argv)
    print(json.dumps(result["summary"], indent=1))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
