"""The HTTP front end's part in tracing, without Ray: a client's ``traceparent`` becomes the root
span's parent; a call another replica sent (``x-triton-trace-step``) continues the caller's trace
with no root span of its own; and the trace setting routes answer with Triton's rules."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from deployments.protocol.http import ModelHTTPApp, ServerHTTPApp
from deployments.tracing import TRACER, TraceParent, parse_trace_config
from tests.protocol.fakes import FakeDataPlane, all_models
from tests.protocol.test_http_app import call, infer_body

CLIENT = "00-0af7651916cd43dd8448eb211c12666c-b7ad6b7169242424-01"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    found = InMemorySpanExporter()
    TRACER.configure(parse_trace_config(["mode=opentelemetry", "level=TIMESTAMPS", "rate=1"]), exporter=found)
    yield found
    TRACER.configure(parse_trace_config([]))


@pytest.fixture
def dataplane(tmp_path) -> FakeDataPlane:
    return FakeDataPlane(all_models(tmp_path))


async def test_a_client_traceparent_is_the_root_spans_parent(dataplane, exporter) -> None:
    x = np.ones((1, 16), np.float32)
    reply = await call(
        ModelHTTPApp(dataplane, "add_sub"),
        "POST",
        "/infer",
        infer_body(x, x),
        headers={"traceparent": CLIENT},
    )
    assert reply is not None and reply.status == 200
    TRACER.flush()
    (root,) = exporter.get_finished_spans()
    assert (
        root.name == "InferRequest" and root.parent is not None and root.parent.span_id == 0xB7AD6B7169242424
    )
    assert dataplane.requests[-1].trace == TraceParent(root.context.trace_id, root.context.span_id)


async def test_a_call_from_another_replica_continues_the_callers_trace(dataplane, exporter) -> None:
    x = np.ones((1, 16), np.float32)
    headers = {"traceparent": CLIENT, "x-triton-trace-step": "5"}
    reply = await call(
        ModelHTTPApp(dataplane, "add_sub"), "POST", "/infer", infer_body(x, x), headers=headers
    )
    assert reply is not None and reply.status == 200
    TRACER.flush()
    assert exporter.get_finished_spans() == ()
    assert dataplane.requests[-1].trace == TraceParent(
        0x0AF7651916CD43DD8448EB211C12666C, 0xB7AD6B7169242424, 5
    )


async def test_the_setting_routes_answer_tritons_documents_and_errors(dataplane) -> None:
    app = ModelHTTPApp(dataplane, "add_sub")
    reply = await call(app, "POST", "/trace/setting", json.dumps({"trace_rate": "3"}).encode())
    assert reply is not None and reply.status == 200 and reply.json()["trace_rate"] == "3"
    reply = await call(app, "POST", "/trace/setting", json.dumps({"trace_file": "x"}).encode())
    assert reply is not None and reply.status == 501  # UNSUPPORTED, as Triton maps it
    assert reply.json() == {"error": "trace file location can not be updated through network protocol"}
    server = ServerHTTPApp(dataplane)
    reply = await call(
        server, "POST", "/v2/models/nope/trace/setting", json.dumps({"trace_file": "x"}).encode()
    )
    assert reply is not None and reply.json() == {
        "error": "Request for unknown model : nope"
    }  # checked first
