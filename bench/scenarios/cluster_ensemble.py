"""The text-recognition ensemble on the multi-node cluster: steps in process, and steps on other nodes.

The three-node cluster of ``tools/netns_cluster.py`` serves the three step models and two copies of
``text_recognition``: ``text_recognition`` hosts its steps in its own replica (``placement: colocate``,
the default) and ``text_recognition_separate`` calls each step's own replica (``placement: separate``),
which Ray places on either worker node, so a request crosses nodes at each step. The CRNN step's ONNX
Runtime threads do not spin (``session.intra_op.allow_spinning: 0``, as in the ``ensemble`` scenario's
last variant). The load goes through the head's ingress. Where each replica ran is in the notes; the
nodes share this machine's 2 cores, so the figure is the ratio separate / in process.
"""

from __future__ import annotations

from typing import Any

from bench.results import Report, Run
from bench.scenarios.cluster_scaling import on_cluster
from bench.scenarios.common import EXAMPLES, log, make_repository, measure, new_report, save_report, work_dir
from bench.scenarios.ensemble import MODEL, SHAPES, STEPS, no_spinning
from bench.scenarios.ensemble import placement as ensemble_placement

NAME = "cluster_ensemble"
SEPARATE = f"{MODEL}_separate"
LEVELS = [1.0, 4, 8]
QUICK_LEVELS: list[float] = [8]


def run(quick: bool = False) -> Report:
    """Run the scenario and save it under ``bench/results/cluster_ensemble/``."""
    work = work_dir(NAME)
    steps = [(EXAMPLES / s, s, no_spinning if s == "crnn" else None) for s in STEPS]
    repo = make_repository(
        work / "repo",
        [
            *steps,
            (EXAMPLES / MODEL, MODEL, ensemble_placement("colocate")),
            (EXAMPLES / MODEL, SEPARATE, ensemble_placement("separate")),
        ],
    )
    levels = QUICK_LEVELS if quick else LEVELS
    report = new_report(NAME, models=[MODEL, SEPARATE], levels=levels, shapes=list(SHAPES))
    with on_cluster(NAME, report, repo, [*STEPS, MODEL, SEPARATE]) as url:
        if url is None:
            return report
        report.runs += measure(url, MODEL, levels, "steps in the ensemble's replica", shapes=SHAPES)
        report.runs += measure(
            url, SEPARATE, levels, "steps on their own replicas, over nodes", shapes=SHAPES
        )
    report.notes |= summarize(report.runs)
    log(f"{NAME}: results in {save_report(report, 'Ensemble on the three-node cluster')}")
    return report


def summarize(runs: list[Run]) -> dict[str, Any]:
    """Steps over nodes / steps in process, per concurrency."""
    if len(runs) < 2:
        return {}
    inside, over = runs[0].throughput_by_level(), runs[1].throughput_by_level()
    return {
        "separate_over_in_process": {f"{k:g}": over[k] / inside[k] for k in sorted(over) if inside.get(k)}
    }
