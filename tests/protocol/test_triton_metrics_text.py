"""Triton's /metrics text from model runtimes (Ray-free): names, help lines, labels, sums, the listener,
and the compute time split into input, infer and output."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from deployments import custom_metrics
from deployments.backends.base import Backend, BackendContext, timed
from deployments.inference import InferRequest, InferResponse
from deployments.protocol.metrics_http import bind, start_metrics_server
from deployments.runtime.metrics import (
    COUNTERS,
    HostGauges,
    TritonMetrics,
    merge_model_metrics,
    render_triton,
    settled,
)
from deployments.runtime.model import VersionRuntime
from tests.backends.helpers import describe, spec

# As tritonserver 2.51 prints them (captured from the peer)
TRITON_HELP = [
    "# HELP nv_inference_request_success Number of successful inference requests, all batch sizes",
    "# HELP nv_inference_request_failure Number of failed inference requests, all batch sizes",
    "# HELP nv_inference_count Number of inferences performed (does not include cached requests)",
    "# HELP nv_inference_exec_count Number of model executions performed (does not include cached requests)",
    "# HELP nv_inference_request_duration_us Cumulative inference request duration in microseconds "
    "(includes cached requests)",
    "# HELP nv_inference_queue_duration_us Cumulative inference queuing duration in microseconds "
    "(includes cached requests)",
    "# HELP nv_inference_compute_input_duration_us Cumulative compute input duration in microseconds "
    "(does not include cached requests)",
    "# HELP nv_inference_compute_infer_duration_us Cumulative compute inference duration in microseconds "
    "(does not include cached requests)",
    "# HELP nv_inference_compute_output_duration_us Cumulative inference compute output duration in "
    "microseconds (does not include cached requests)",
    "# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting "
    "execution per-model.",
]


def _stats(version: str, success: int, fail: int, rows: int, execs: int) -> dict:
    durations = {
        k: {"count": 0, "ns": 0} for k in ("queue", "compute_input", "compute_infer", "compute_output")
    }
    durations["success"] = {"count": success, "ns": success * 2_000_000}
    durations["fail"] = {"count": fail, "ns": fail * 1_000_000}
    durations["compute_input"] = {"count": success, "ns": success * 3_000}
    return {
        "name": "m",
        "version": version,
        "inference_count": rows,
        "execution_count": execs,
        "inference_stats": durations,
        "batch_stats": [],
    }


def test_replicas_sum_into_tritons_families() -> None:
    one = {
        "stats": [_stats("1", 2, 1, 4, 2)],
        "pending": {"1": 1},
        "failures": {"1": {"BACKEND": 1}},
        "custom": [],
    }
    two = {"stats": [_stats("1", 3, 0, 3, 3)], "pending": {"1": 2}, "failures": {"1": {}}, "custom": []}
    text = render_triton({"m": merge_model_metrics([one, two])})
    lines = text.splitlines()
    assert [line for line in lines if line.startswith("# HELP")] == TRITON_HELP
    assert len(COUNTERS) == 9
    for line in (
        "# TYPE nv_inference_request_success counter",
        'nv_inference_request_success{model="m",version="1"} 5',
        'nv_inference_request_failure{model="m",reason="BACKEND",version="1"} 1',
        'nv_inference_request_failure{model="m",reason="REJECTED",version="1"} 0',
        'nv_inference_count{model="m",version="1"} 7',
        'nv_inference_exec_count{model="m",version="1"} 5',
        'nv_inference_request_duration_us{model="m",version="1"} 11000',
        'nv_inference_compute_input_duration_us{model="m",version="1"} 15',
        "# TYPE nv_inference_pending_request_count gauge",
        'nv_inference_pending_request_count{model="m",version="1"} 3',
    ):
        assert line in lines, line
    assert "ray_" not in text


def test_a_gone_replicas_counts_stand_and_its_pending_requests_do_not() -> None:
    live = {"stats": [_stats("1", 2, 1, 4, 2)], "pending": {"1": 1}, "failures": {"1": {"BACKEND": 1}}}
    gone = {"stats": [_stats("1", 3, 0, 3, 3)], "pending": {"1": 2}, "failures": {"1": {"BACKEND": 2}}}
    lines = render_triton({"m": merge_model_metrics([live, settled(gone)])}).splitlines()
    assert 'nv_inference_request_success{model="m",version="1"} 5' in lines
    assert 'nv_inference_request_failure{model="m",reason="BACKEND",version="1"} 3' in lines
    assert 'nv_inference_pending_request_count{model="m",version="1"} 1' in lines
    assert gone["pending"] == {"1": 2}  # the pushed snapshot itself is kept as it came


def test_custom_families_print_among_tritons_by_kind() -> None:
    families = [
        {
            "name": "c_hist",
            "description": "H",
            "kind": "histogram",
            "metrics": [{"labels": {}, "buckets": [1.0], "counts": [1, 0], "sum": 0.5}],
        },
        {
            "name": "c_gauge",
            "description": "G",
            "kind": "gauge",
            "metrics": [{"labels": {"a": "b"}, "value": 2.0}],
        },
        {"name": "c_total", "description": "C", "kind": "counter", "metrics": [{"labels": {}, "value": 3.0}]},
    ]
    host = {"counters": {"pooled": {"loads": 1}}, "resident": {"pooled": 100}}
    text = render_triton(
        {}, custom_metrics.merge_snapshots([families, families]), HostGauges().read(), hosts=[host]
    )
    order = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert order.index("nv_inference_compute_output_duration_us") < order.index("c_total")
    assert order.index("c_total") < order.index("nv_model_host_load_total")
    assert order.index("nv_model_host_load_duration_us") < order.index("nv_inference_pending_request_count")
    assert order.index("nv_cpu_memory_used_bytes") < order.index("nv_model_host_resident")
    assert order.index("nv_model_host_resident_gpu_bytes") < order.index("c_gauge") < order.index("c_hist")
    assert order[-1] == "c_hist"  # histograms last, as tritonserver prints them
    assert "c_total 6\n" in text and 'c_gauge{a="b"} 4\n' in text and "c_hist_count 2\n" in text
    assert 'nv_model_host_resident_bytes{model="pooled"} 100\n' in text


async def test_listener_answers_metrics_only_and_keeps_the_connection() -> None:
    async def render() -> str:
        return "# HELP x X\n# TYPE x counter\nx 1\n"

    server = await start_metrics_server(bind("127.0.0.1", 0), render)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for path, status in (("/metrics", b"200"), ("/other", b"404"), ("/metrics/", b"200")):
            writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.split()[1] == status
            length = int(
                next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split()[1]
            )
            body = await reader.readexactly(length)
            if status == b"200":
                assert b"text/plain; version=0.0.4" in head and body.endswith(b"x 1\n")
        writer.close()
    finally:
        server.close()
        await server.wait_closed()


class _Clock:
    """The clock the runtime and the backend's timers read, moved on only by :meth:`spend`, so the
    durations they measure are exactly what the backend spent, however loaded the machine is."""

    def __init__(self) -> None:
        self.now_ns = 10**12

    def read(self) -> int:
        return self.now_ns

    def spend(self, ms: int) -> None:
        self.now_ns += ms * 1_000_000


class _PhasedBackend(Backend):
    """Spends known times preparing inputs, computing and producing outputs."""

    clock: _Clock

    def load(self) -> None:
        pass

    async def execute(self, requests: Sequence[InferRequest]) -> list[InferResponse]:
        with timed("input"):
            self.clock.spend(20)
        self.clock.spend(40)
        with timed("output"):
            self.clock.spend(10)
        return [InferResponse(outputs={"OUT": r.inputs["IN"]}) for r in requests]


async def test_compute_time_is_split_into_input_infer_and_output(monkeypatch: pytest.MonkeyPatch) -> None:
    model = describe(
        "phased", Path("/nonexistent"), "phased", [spec("IN", "FP32", [1])], [spec("OUT", "FP32", [1])]
    )
    clock = _Clock()
    monkeypatch.setattr(time, "monotonic_ns", clock.read)
    monkeypatch.setattr(time, "perf_counter_ns", clock.read)
    backend = _PhasedBackend(BackendContext(model=model, version=1))
    backend.clock = clock
    runtime = VersionRuntime(model, 1, backend, TritonMetrics(counters=None))
    runtime.ready = True
    response = await runtime.infer(InferRequest("phased", {"IN": np.ones(1, np.float32)}))
    assert response.error is None
    stats = runtime.stats.to_json()["inference_stats"]
    ms = {k: stats[k]["ns"] / 1e6 for k in ("compute_input", "compute_infer", "compute_output")}
    assert ms == {"compute_input": 20, "compute_infer": 40, "compute_output": 10}
    assert runtime.pending == 0


def test_a_replica_pushes_a_report_when_it_changed_and_otherwise_once_a_heartbeat() -> None:
    from deployments.runtime.stats import PushGate

    gate = PushGate(heartbeat_s=5.0)
    report = {"stats": [{"version": "1", "inference_count": 0}]}
    assert gate.due(report, now=0.0)  # nothing sent yet
    gate.sent(report, now=0.0)
    assert not gate.due({"stats": [{"version": "1", "inference_count": 0}]}, now=1.0)  # an equal copy
    assert gate.due({"stats": [{"version": "1", "inference_count": 1}]}, now=1.0)  # a request counted
    assert not gate.due(report, now=4.9) and gate.due(report, now=5.0)  # idle: the heartbeat
    gate.sent(report, now=5.0)
    assert not gate.due(report, now=9.9)


def test_model_host_families_sum_over_host_replicas() -> None:
    from deployments.runtime.metrics import render_model_hosts

    assert render_model_hosts([]) == ""  # no hosts: nothing printed
    statuses = [
        {
            "counters": {"a": {"loads": 2, "load_failures": 0, "evictions": 1, "cold_start_s": 0.5}},
            "resident": {"a": 100},
        },
        {
            "counters": {"a": {"loads": 1, "evictions": 0, "cold_start_s": 0.25}, "b": {"loads": 1}},
            "resident": {"a": 50},
            "resident_gpu": {"a": 1024},
        },
    ]
    text = render_model_hosts(statuses)
    values = {
        line.split(" ")[0]: line.split(" ")[1] for line in text.splitlines() if not line.startswith("#")
    }
    assert values['nv_model_host_load_total{model="a"}'] == "3"
    assert values['nv_model_host_eviction_total{model="a"}'] == "1"
    assert values['nv_model_host_load_duration_us{model="a"}'] == "750000"
    assert (
        values['nv_model_host_resident{model="a"}'] == "2"
        and values['nv_model_host_resident{model="b"}'] == "0"
    )
    assert values['nv_model_host_resident_bytes{model="a"}'] == "150"
    assert values['nv_model_host_resident_gpu_bytes{model="a"}'] == "1024"
    assert values['nv_model_host_resident_gpu_bytes{model="b"}'] == "0"
    assert "# TYPE nv_model_host_load_total counter" in text and "# TYPE nv_model_host_resident gauge" in text


class _HeldBackend(Backend):
    """Answers each batch once the test releases it; records the batch sizes it ran."""

    release: asyncio.Event
    batches: list[int]

    def load(self) -> None:
        pass

    async def execute(self, requests: Sequence[InferRequest]) -> list[InferResponse]:
        self.batches.append(len(requests))
        await self.release.wait()
        return [InferResponse(outputs={"OUT": r.inputs["IN"]}) for r in requests]


async def test_requests_of_a_running_sequence_batch_are_no_longer_pending() -> None:
    """Triton's pending count is the requests waiting for an instance: a sequence batch's requests
    leave it when the batch starts, though the batcher runs copies of them (their control inputs)."""
    from tests.batching.sequence_models import req, sequence_model

    backend = _HeldBackend(BackendContext(model=sequence_model(), version=1))
    backend.release, backend.batches = asyncio.Event(), []
    runtime = VersionRuntime(sequence_model(), 1, backend, TritonMetrics(counters=None))
    runtime.ready = True
    # four sequences fill the batch (max_batch_size 4); two more requests of them wait behind it
    calls = [asyncio.ensure_future(runtime.infer(req(cid, 1.0, start=True))) for cid in (1, 2, 3, 4)]
    calls += [asyncio.ensure_future(runtime.infer(req(cid, 2.0))) for cid in (1, 2)]
    while not backend.batches:
        await asyncio.sleep(0.01)
    assert backend.batches == [4]
    assert runtime.pending == 2
    backend.release.set()
    responses = await asyncio.gather(*calls)
    assert all(r.error is None for r in responses)
    assert runtime.pending == 0
