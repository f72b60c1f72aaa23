"""The text-recognition ensemble with and without the in-process (DLPack) hand-off.

``text_recognition`` chains image_preprocess -> crnn -> crnn_postprocess. With the ensemble's default
``placement`` (``colocate``) the steps share a replica and hand tensors on in process through DLPack;
with ``placement: separate`` every step is its own replica and tensors travel through host memory,
with ONNX Runtime's defaults and with its intra-op threads not spinning (``no_spinning``).
Both variants run on copies of the example models, one server run each.
"""

from __future__ import annotations

from typing import Any

from bench.peers import PeerSetupError
from bench.results import Report, Run
from bench.scenarios.common import (
    EXAMPLES,
    ConfigEdit,
    free_port,
    log,
    make_repository,
    measure,
    new_report,
    save_report,
    start_this_server,
    work_dir,
)

NAME = "ensemble"
MODEL = "text_recognition"
STEPS = ("image_preprocess", "crnn", "crnn_postprocess")
SHAPES = ("IMAGE:32,100",)
LEVELS = [1.0, 2, 4, 8, 16]
QUICK_LEVELS = [1.0, 8]


def placement(mode: str) -> ConfigEdit:
    """An edit setting the ensemble's ``placement`` parameter."""

    def edit(config: Any) -> None:
        config.parameters["placement"].string_value = mode

    return edit


def no_spinning(config: Any) -> None:
    """ONNX Runtime's intra-op threads sleep between runs instead of spinning (Triton's and ONNX Runtime's
    ``session.intra_op.allow_spinning`` parameter): spinning threads of one replica take the cores the
    other replicas of the pipeline need."""
    config.parameters["session.intra_op.allow_spinning"].string_value = "0"


# label, the ensemble's placement, the edit of the crnn step
VARIANTS: list[tuple[str, str, ConfigEdit | None]] = [
    ("in-process DLPack hand-off", "colocate", None),
    ("host hand-off, separate replicas", "separate", None),
    ("host hand-off, separate replicas, ONNX Runtime not spinning", "separate", no_spinning),
]


def run(quick: bool = False) -> Report:
    """Run both variants and save them under ``bench/results/ensemble/``."""
    work = work_dir(NAME)
    levels = QUICK_LEVELS if quick else LEVELS
    report = new_report(NAME, model=MODEL, levels=levels, shapes=list(SHAPES))
    for i, (label, mode, crnn_edit) in enumerate(VARIANTS):
        steps = [(EXAMPLES / s, s, crnn_edit if s == "crnn" else None) for s in STEPS]
        models = [*steps, (EXAMPLES / MODEL, MODEL, placement(mode))]
        repo = make_repository(work / f"repo{i}", models)
        log(f"{NAME}: {label}")
        try:
            handle = start_this_server(repo, free_port(), log_path=work / f"server{i}.log")
        except PeerSetupError as exc:
            report.notes.setdefault("skipped", {})[label] = str(exc)[-600:]
            continue
        with handle:
            report.runs += measure(handle.url, MODEL, levels, label, shapes=SHAPES)
    report.notes |= summarize(report.runs)
    log(f"{NAME}: results in {save_report(report, 'Ensemble hand-off')}")
    return report


def summarize(runs: list[Run]) -> dict[str, Any]:
    """Throughput of each separate-replica variant over the in-process one, per concurrency."""
    if len(runs) < 2:
        return {}
    first = {p.concurrency: p.infer_per_s for p in runs[0].points}
    out: dict[str, Any] = {}
    for run in runs[1:]:
        other = {p.concurrency: p.infer_per_s for p in run.points}
        out[f"{run.label} over in-process"] = {str(k): other[k] / first[k] for k in other if first.get(k)}
    return out
