"""One model's throughput as its replicas spread over the nodes of the multi-node cluster.

The three-node cluster of ``tools/netns_cluster.py`` (a head with no CPUs, a CPU node declaring 2 CPUs,
a GPU node declaring 1) serves three copies of the CRNN example with 1, 2 and 4 KIND_CPU replicas.
perf_analyzer (``--async``) sends its load through the head's ingress, so every request crosses to the
node that runs the replica HAProxy picks. The nodes share this machine's 2 cores, so the figure is a
ratio (2 and 4 replicas over 1, per concurrency), not a cluster's absolute throughput; where each
replica ran is in the notes. Needs root and ``ip`` (as the multi-node tests do).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.pa_runner import run_perf_analyzer
from bench.results import Report, Run
from bench.scenarios.common import log, make_repository, new_report, save_report, set_instances, work_dir
from repository_loader.plan import model_app_name
from tools import netns_cluster

NAME = "cluster_scaling"
SOURCE = Path(__file__).resolve().parents[2] / "examples" / "model_repository" / "crnn"
MODELS = {"crnn_x1": 1, "crnn_x2": 2, "crnn_x4": 4}
LEVELS = [4, 8, 16]
QUICK_LEVELS = [8]


def placement(models: Iterable[str]) -> dict[str, dict[str, int]]:
    """Model -> node name -> running replicas there."""
    names = {n.ip: n.name for n in netns_cluster.NODES}
    out: dict[str, dict[str, int]] = {}
    for model in models:
        app = netns_cluster.serve_details()["applications"].get(model_app_name(model), {})
        where = Counter(
            names.get(r["node_ip"], r["node_ip"])
            for d in app.get("deployments", {}).values()
            for r in d.get("replicas", [])
            if r.get("state") == "RUNNING"
        )
        out[model] = dict(where)
    return out


@contextmanager
def on_cluster(name: str, report: Report, repo: Path, models: Iterable[str]) -> Iterator[str | None]:
    """The three-node cluster serving ``repo``: yields the head's ingress (``host:port``) with the
    placement of ``models`` in the report's notes, and takes the cluster down after; yields None,
    with the reason in the notes, where no cluster can start here."""
    reason = netns_cluster.unavailable_reason()
    if reason:
        report.notes["skipped"] = {"cluster": reason}
        yield None
        return
    log(f"{name}: starting the three-node cluster")
    state = netns_cluster.up(model_repository=repo, log=log)
    try:
        report.notes["placement"] = placement(models)
        yield state.ingress(netns_cluster.HEAD)
    finally:
        netns_cluster.down(Path(state.dir), log=log)


def run(quick: bool = False) -> Report:
    """Run the scenario and save it under ``bench/results/cluster_scaling/``."""
    work = work_dir(NAME)
    repo = make_repository(work / "repo", [(SOURCE, name, set_instances(n)) for name, n in MODELS.items()])
    levels = QUICK_LEVELS if quick else LEVELS
    report = new_report(NAME, models=list(MODELS), levels=levels)
    with on_cluster(NAME, report, repo, MODELS) as url:
        if url is None:
            return report
        for model in MODELS:
            report.runs.append(
                run_perf_analyzer(
                    url,
                    model,
                    levels,
                    label=f"{model} through the head's ingress (perf_analyzer)",
                    measurement_interval_ms=3000,
                    max_trials=8,
                    extra=["--async"],
                )
            )
    report.notes |= summarize(report.runs)
    log(f"{NAME}: results in {save_report(report, 'CRNN replicas over the nodes of a three-node cluster')}")
    return report


def summarize(runs: list[Run]) -> dict[str, Any]:
    """2 and 4 replicas over 1, per concurrency."""
    by_model = {r.model: r.throughput_by_level() for r in runs}
    one = by_model.get("crnn_x1", {})
    out: dict[str, Any] = {}
    for model in ("crnn_x2", "crnn_x4"):
        many = by_model.get(model, {})
        out[f"{model}_over_crnn_x1"] = {f"{k:g}": many[k] / one[k] for k in sorted(many) if one.get(k)}
    return out
