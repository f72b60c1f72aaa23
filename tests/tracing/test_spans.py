"""Which requests the tracer traces and the spans a model's runtime makes, without Ray: spans go to
an in-memory exporter; and how the server application's board hands settings to replicas."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from deployments.inference import InferRequest
from deployments.tracing import TRACER, TraceParent, parse_trace_config
from deployments.tracing.control import LocalTraces
from deployments.tracing.spans import Tracer
from deployments.tracing.store import read_changes
from tests.backends.helpers import describe, spec

ON = ["mode=opentelemetry", "level=TIMESTAMPS", "rate=2", "opentelemetry,bsp_schedule_delay=1"]
CLIENT = "00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01"


def _tracer(flags: list[str] = ON) -> tuple[Tracer, InMemorySpanExporter]:
    tracer, exporter = Tracer(), InMemorySpanExporter()
    tracer.configure(parse_trace_config(flags), exporter=exporter)
    return tracer, exporter


async def test_off_until_a_setting_traces_and_only_in_opentelemetry_mode() -> None:
    assert not _tracer(["mode=opentelemetry"])[0].active
    assert not _tracer(["level=TIMESTAMPS"])[0].active  # triton mode: no spans
    tracer, _ = _tracer(["mode=opentelemetry"])
    traces = LocalTraces(parse_trace_config(["mode=opentelemetry"]), tracer=tracer)
    await traces.update("m", read_changes({"trace_level": ["TIMESTAMPS"]}))
    assert tracer.active and tracer.state.effective("m").level and not tracer.state.effective("n").level


async def test_every_rate_th_request_is_traced_and_a_sent_context_always() -> None:
    tracer, exporter = _tracer()
    sampled = [await tracer.start("m", None, "HTTP", 0) for _ in range(4)]
    assert [s is not None for s in sampled] == [False, True, False, True]
    root = await tracer.start("m", CLIENT, "HTTP", 0)
    assert root is not None and root.parent.trace_id == int("0af7651916cd43dd8448eb211c12666c", 16)
    root.finish(1, 2, 3)
    tracer.flush()
    span = exporter.get_finished_spans()[-1]
    assert (
        span.name == "InferRequest" and span.parent is not None and span.parent.span_id == 0xB7AD6B7169242424
    )


async def test_the_count_is_asked_for_each_trace() -> None:
    asked: list[str] = []

    async def take(model: str) -> bool:
        asked.append(model)
        return len(asked) <= 1

    tracer, _ = _tracer(["mode=opentelemetry", "level=TIMESTAMPS", "rate=1", "count=1"])
    tracer.take = take
    assert await tracer.start("m", None, "HTTP", 0) is not None
    assert await tracer.start("m", None, "HTTP", 0) is None and asked == ["m", "m"]


IDENTITY_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
            for r in requests
        ]
"""


async def test_a_model_runtime_makes_the_model_and_compute_spans_under_the_request(tmp_path: Path) -> None:
    from deployments.runtime.model import ModelRuntime

    (tmp_path / "identity" / "1").mkdir(parents=True)
    (tmp_path / "identity" / "1" / "model.py").write_text(IDENTITY_PY)
    exporter = InMemorySpanExporter()
    TRACER.configure(parse_trace_config(ON), exporter=exporter)
    try:
        model = describe(
            "identity", tmp_path / "identity", "python", [spec("X", "FP32", [4])], [spec("Y", "FP32", [4])]
        )
        runtime = ModelRuntime(model)
        await runtime.load()
        parent = TraceParent(0x1234, 0x5678, 7)
        request = InferRequest("identity", {"X": np.ones(4, np.float32)}, id="r", trace=parent)
        response = await runtime.infer(request)
        assert response.error is None
        TRACER.flush()
        spans = {s.name: s for s in exporter.get_finished_spans()}
        model, compute = spans[runtime.model.name], spans["compute"]
        assert (
            model.parent is not None and model.parent.span_id == 0x5678 and model.context.trace_id == 0x1234
        )
        assert compute.parent is not None and compute.parent.span_id == model.context.span_id
        assert [e.name for e in model.events] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
        assert [e.name for e in compute.events] == [
            "COMPUTE_START",
            "COMPUTE_INPUT_END",
            "COMPUTE_OUTPUT_START",
            "COMPUTE_END",
        ]
        assert model.attributes is not None and model.attributes["triton.trace_parent_id"] == 7
        await runtime.close()
    finally:
        TRACER.configure(parse_trace_config([]))


async def test_a_change_answers_once_the_following_replicas_hold_it() -> None:
    from deployments.serve.traces import TraceBoard

    board = TraceBoard(ack_timeout_s=5.0)
    traces = LocalTraces(parse_trace_config(["mode=opentelemetry"]), tracer=Tracer(), changed=board.publish)
    board.state = traces.state
    replica = Tracer()
    replica.configure(parse_trace_config(["mode=opentelemetry"]))
    assert await board.wait("r1", 0, 0.01) is None  # nothing new: the poll times out

    async def follow() -> None:
        while True:
            state = await board.wait("r1", replica.state.version, 5.0)
            if state is not None:
                replica.apply(state, force=True)

    following = asyncio.ensure_future(follow())
    await asyncio.sleep(0.01)
    await traces.update(None, read_changes({"trace_level": ["TIMESTAMPS"]}))
    assert replica.state.version == traces.state.version and replica.active
    following.cancel()
