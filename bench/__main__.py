"""``python -m bench``: measure a KServe v2 server, drive perf_analyzer, plot, or run a scenario.

python -m bench run -u localhost:8000 -m identity_fp32 --concurrency 1,2,4,8 --out bench/results/mine
python -m bench run -u localhost:8000 -m crnn -b 2 --request-rate 100,200 --json
python -m bench perf-analyzer -u localhost:8000 -m identity_fp32 --concurrency 1:8:1
python -m bench plot bench/results/mine/results.json
python -m bench scenario overhead
python -m bench summary      # bench/results/SUMMARY.md and the README's tables from the saved results
python -m bench summary --check   # fail on a README table or cited figure that the saved results no longer hold
python -m bench peers        # install perf_analyzer and tritonserver into .tools/
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from bench import peers, summary
from bench.env import environment
from bench.loadgen import run_client
from bench.measure import MeasureOptions, sweep
from bench.pa_runner import run_perf_analyzer
from bench.plots import plot_report
from bench.results import Report, Run, read_json, write_csv, write_json


def parse_levels(text: str) -> list[float]:
    """``1,2,4`` or ``start:end[:step]`` as a list of levels."""
    if ":" in text:
        parts = [float(x) for x in text.split(":")]
        start, end = parts[0], parts[1]
        step = parts[2] if len(parts) > 2 else 1.0
        out, v = [], start
        while v <= end + 1e-9:
            out.append(v)
            v += step
        return out
    return [float(x) for x in text.split(",") if x]


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-u", "--url", default="localhost:8000", help="server host:port (HTTP)")
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--concurrency", default=None, help="levels: 1,2,4 or 1:16:2 (default 1)")
    p.add_argument("--request-rate", default=None, help="open-loop request rates instead of concurrency")
    p.add_argument("-b", "--batch-size", type=int, default=1, help="rows per request")
    p.add_argument("--shape", action="append", default=[], help="NAME:d1,d2 for variable dims (no batch dim)")
    p.add_argument("--window", type=float, default=2.0, help="measurement window, seconds")
    p.add_argument("--tolerance", type=float, default=0.10, help="stability tolerance (fraction)")
    p.add_argument("--max-windows", type=int, default=10)
    p.add_argument("--label", default="", help="name of this configuration in results and plots")
    p.add_argument("--out", default=None, help="folder for results.json, results.csv and plots")


def _levels(args: argparse.Namespace) -> tuple[list[float], str]:
    if args.request_rate:
        return parse_levels(args.request_rate), "request_rate"
    return parse_levels(args.concurrency or "1"), "concurrency"


def save(report: Report, out_dir: str | Path, title: str = "") -> list[Path]:
    """Write a report's JSON, CSV and plots into ``out_dir``."""
    out = Path(out_dir)
    paths = [write_json(report, out / "results.json"), write_csv(report.runs, out / "results.csv")]
    if any(r.points for r in report.runs):
        paths += plot_report(report.runs, out, title or report.name)
    return paths


def print_table(runs: Sequence[Run]) -> None:
    """A short text table of the runs on stdout."""
    print(f"{'label':32} {'level':>7} {'infer/s':>10} {'avg us':>9} {'p50 us':>9} {'p99 us':>9} stable")
    for run in runs:
        for p in run.points:
            level = p.concurrency if p.concurrency is not None else p.request_rate
            print(
                f"{run.label[:32]:32} {level:>7g} {p.infer_per_s:>10,.1f} {p.latency_avg_us:>9,.0f} "
                f"{p.p50_us:>9,.0f} {p.p99_us:>9,.0f} {'yes' if p.stable else 'no'}"
            )


def cmd_run(args: argparse.Namespace) -> int:
    levels, mode = _levels(args)
    opts = MeasureOptions(
        window_s=args.window,
        tolerance=args.tolerance,
        max_windows=args.max_windows,
        batch_size=args.batch_size,
        binary=not args.json,
        shapes=args.shape,
        processes=args.processes,
        poisson=args.poisson,
        warmup_s=args.warmup,
    )
    runs = [run_client(sweep(args.url, args.model, levels, mode, label=args.label, opts=opts))]
    if args.compare_perf_analyzer:
        runs.append(_pa(args, levels, mode))
    return _finish(args, runs)


def _pa(args: argparse.Namespace, levels: list[float], mode: str) -> Run:
    label = f"{args.label or args.model} (perf_analyzer)"
    return run_perf_analyzer(
        args.url,
        args.model,
        levels,
        mode,
        label=label,
        batch_size=args.batch_size,
        shapes=args.shape,
        measurement_interval_ms=int(args.window * 1000),
        stability=int(args.tolerance * 100),
        max_trials=args.max_windows,
    )


def cmd_perf_analyzer(args: argparse.Namespace) -> int:
    levels, mode = _levels(args)
    return _finish(args, [_pa(args, levels, mode)])


def _finish(args: argparse.Namespace, runs: list[Run]) -> int:
    print_table(runs)
    if args.out:
        report = Report(args.label or args.model, environment(), runs)
        for path in save(report, args.out):
            print(path, file=sys.stderr)
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    report = read_json(args.results)
    for path in plot_report(report.runs, args.out or Path(args.results).parent, report.name):
        print(path)
    return 0


def cmd_scenario(args: argparse.Namespace) -> int:
    from bench.scenarios import run_scenario

    return run_scenario(args.name, quick=args.quick)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM ends a run as Ctrl-C does: through the ``finally`` blocks that stop its servers (they run
    in sessions of their own, so a signal to this process's group does not reach them)."""
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    parser = argparse.ArgumentParser(prog="python -m bench", description="Benchmark KServe v2 servers.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="measure with this tool")
    _common(run)
    run.add_argument("--json", action="store_true", help="JSON tensors instead of the binary extension")
    run.add_argument("--processes", type=int, default=1, help="client processes sharing the load")
    run.add_argument("--poisson", action="store_true", help="Poisson arrivals in request-rate mode")
    run.add_argument("--warmup", type=float, default=1.0, help="seconds of load before the first window")
    run.add_argument("--compare-perf-analyzer", action="store_true", help="also run perf_analyzer")
    run.set_defaults(func=cmd_run)
    pa = sub.add_parser("perf-analyzer", help="measure with the real perf_analyzer")
    _common(pa)
    pa.set_defaults(func=cmd_perf_analyzer)
    plot = sub.add_parser("plot", help="plot a results.json")
    plot.add_argument("results")
    plot.add_argument("--out", default=None)
    plot.set_defaults(func=cmd_plot)
    scen = sub.add_parser("scenario", help="run a named scenario into bench/results/<name>/")
    scen.add_argument("name")
    scen.add_argument("--quick", action="store_true", help="fewer levels and shorter windows")
    scen.set_defaults(func=cmd_scenario)
    summ = sub.add_parser(
        "summary", help="ratio tables of the saved scenario results: bench/results/SUMMARY.md and the README"
    )
    summ.add_argument("--check", action="store_true", help="write nothing; fail on a stale table or figure")
    summ.set_defaults(func=lambda a: summary.main(["--check"] if a.check else []))
    sub.add_parser("peers", help="install perf_analyzer and tritonserver").set_defaults(
        func=lambda a: peers.main([])
    )
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
