"""Sequence-batching models for the scheduler tests: configs and fake backends."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from deployments.inference import InferRequest, InferResponse
from deployments.runtime.sequence import SequenceBatcher
from repository_loader.config import parse_config
from repository_loader.describe import describe
from repository_loader.findings import Findings
from repository_loader.model import ModelDescription
from repository_loader.sequence_rules import check_sequence_batching

MODELS = Path(__file__).parent / "models"

CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: %s } ] }
  ]
"""

SCHEDULER_STATE = 'state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]'
"""An implicit state (``extra=``): the scheduler keeps the sequences' state, the backend none."""


def sequence_model(
    strategy: str = "direct { }",
    max_batch_size: int = 4,
    idle_us: int = 5_000_000,
    corrid_type: str = "TYPE_UINT64",
    extra: str = "",
    path: Path | None = None,
    instances: int = 0,
) -> ModelDescription:
    """A model with one FP32 input IN [1] and output OUT [1] under ``sequence_batching``; ``instances``:
    the count of its one KIND_CPU instance group (0: no ``instance_group``)."""
    text = f"""
name: "seq"
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  {strategy}
  {CONTROLS % corrid_type}
  {extra}
}}
"""
    if instances:
        text += f"instance_group [ {{ kind: KIND_CPU count: {instances} }} ]\n"
    return from_text(text, path or Path("/nonexistent/seq"))


def from_text(text: str, path: Path) -> ModelDescription:
    config = parse_config(text)
    findings = Findings(config.name, "config.pbtxt")
    check_sequence_batching(config, findings)
    assert not findings, findings.errors
    return describe(config, path, [1])


def req(
    cid: int | str, value: float = 0.0, start: bool = False, end: bool = False, rid: str = "", **kw: object
) -> InferRequest:
    data = np.full((1, 1), value, dtype=np.float32)
    return InferRequest(
        model_name="seq",
        inputs={"IN": data},
        id=rid or f"{cid}:{value}",
        correlation_id=cid,
        sequence_start=start,
        sequence_end=end,
        **kw,  # type: ignore[arg-type]
    )


class Accumulator:
    """A fake backend keeping a running sum per CORRID, driven by the control inputs.

    Records every batch as a list of (corrid, start, end, ready) rows, and
    fails a test if a row arrives for a sequence that was never started.
    ``gate``: batches wait for it before answering.
    """

    def __init__(self, delay: float = 0.0, gate: asyncio.Event | None = None) -> None:
        self.sums: dict[object, float] = {}
        self.batches: list[list[tuple[object, int, float, bool]]] = []
        self.inputs: list[list[dict[str, np.ndarray]]] = []
        self.delay = delay
        self.gate = gate
        self.active = 0
        self.max_active = 0

    async def __call__(self, requests: Sequence[InferRequest]) -> list[InferResponse]:
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            rows = []
            responses = []
            for r in requests:
                start = int(r.inputs["START"].reshape(-1)[0])
                end = float(r.inputs["END"].reshape(-1)[0])
                ready = bool(r.inputs["READY"].reshape(-1)[0])
                corrid = r.inputs["CORRID"].reshape(-1)[0]
                corrid = corrid.decode() if isinstance(corrid, bytes) else int(corrid)
                rows.append((corrid, start, end, ready))
                value = float(r.inputs["IN"].reshape(-1)[0])
                if ready:
                    if start:
                        self.sums[corrid] = 0.0
                    self.sums[corrid] += value
                    out = self.sums[corrid]
                else:
                    out = -1.0
                responses.append(InferResponse(outputs={"OUT": np.array([[out]], dtype=np.float32)}, id=r.id))
            self.batches.append(rows)
            self.inputs.append([dict(r.inputs) for r in requests])
            if self.gate is not None:
                await self.gate.wait()
            if self.delay:
                await asyncio.sleep(self.delay)
            return responses
        finally:
            self.active -= 1


def out(response: InferResponse) -> float:
    assert response.error is None, response.error
    return float(response.outputs["OUT"].reshape(-1)[0])


async def run_sequences(
    batcher: SequenceBatcher, sequences: dict[object, list[float]], spread: float = 0.0
) -> dict[object, list[float]]:
    """Send each sequence's values in order (one at a time per sequence), all sequences interleaved."""

    async def one(cid: object, values: list[float]) -> list[float]:
        results = []
        for i, v in enumerate(values):
            response = await batcher.submit(
                req(cid, v, start=i == 0, end=i == len(values) - 1)  # type: ignore[arg-type]
            )
            results.append(out(response))
            if spread:
                await asyncio.sleep(spread)
        return results

    got = await asyncio.gather(*(one(cid, values) for cid, values in sequences.items()))
    return dict(zip(sequences, got, strict=True))


def running_sums(values: list[float]) -> list[float]:
    return list(np.cumsum(values, dtype=np.float64))
