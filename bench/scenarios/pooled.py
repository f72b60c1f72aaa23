"""A hot pooled model against the same model with a deployment of its own, on one server.

The server runs with one model host (``--model-hosts 1``, docs/hosts.md) and serves ``identity_py``
twice: ``identity_py_pooled`` on the host, and ``identity_py_dedicated`` (``ray.placement:
dedicated``) in its own replica. perf_analyzer measures each over HTTP, one after the other and then
once more in the other order, at concurrency 1 and 8. The notes hold the pooled model's throughput
over the dedicated one's at each level (``pooled_over_dedicated:<level>``, from the two rounds
together): what a request pays for going through a host that holds many models.
"""

from __future__ import annotations

from bench.pa_runner import run_perf_analyzer
from bench.results import Report, Run
from bench.scenarios.common import (
    BENCH_MODELS,
    free_port,
    log,
    make_repository,
    new_report,
    save_report,
    start_this_server,
    work_dir,
)
from repository_loader.plan import DEDICATED, PLACEMENT_PARAMETER
from repository_loader.proto import model_config_pb2

NAME = "pooled"
MODEL = "identity_py"
POOLED = "identity_py_pooled"
OWN = "identity_py_dedicated"
LEVELS = [1.0, 8]
QUICK_LEVELS = [1.0]


def _dedicated(config: model_config_pb2.ModelConfig) -> None:
    config.parameters[PLACEMENT_PARAMETER].string_value = DEDICATED


def run(quick: bool = False) -> Report:
    """Run the scenario and save it under ``bench/results/pooled/``."""
    work = work_dir(NAME)
    repo = make_repository(
        work / "repo", [(BENCH_MODELS / MODEL, POOLED, None), (BENCH_MODELS / MODEL, OWN, _dedicated)]
    )
    levels = QUICK_LEVELS if quick else LEVELS
    report = new_report(NAME, model=MODEL, levels=levels)
    handle = start_this_server(
        repo, free_port(), log_path=work / "this_server.log", extra_args=["--model-hosts", "1"]
    )
    with handle:
        for round_, order in enumerate(((POOLED, OWN), (OWN, POOLED))):
            for model in order:
                label = f"{model} (round {round_ + 1})"
                log(f"{NAME}: {label}")
                report.runs.append(run_perf_analyzer(handle.url, model, levels, label=label))
    report.notes |= ratios(report.runs)
    log(f"{NAME}: results in {save_report(report, 'a hot pooled model against a dedicated one')}")
    return report


def ratios(runs: list[Run]) -> dict[str, float]:
    """``pooled_over_dedicated:<level>``: the pooled model's throughput over the dedicated one's, each
    summed over the rounds."""
    totals: dict[str, dict[float, float]] = {POOLED: {}, OWN: {}}
    for run in runs:
        model = POOLED if run.label.startswith(POOLED) else OWN
        for level, value in run.throughput_by_level().items():
            totals[model][level] = totals[model].get(level, 0.0) + value
    return {
        f"pooled_over_dedicated:{level:g}": round(value / totals[OWN][level], 3)
        for level, value in totals[POOLED].items()
        if totals[OWN].get(level)
    }
