"""The triton_python_backend_utils API through model files written in Triton's documented style.

Models run in the Python backend; BLS goes to a fake executor that runs other
backends of this process (streaming, model control), no Ray.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import triton_python_backend_utils as pb_utils
from deployments import custom_metrics
from deployments.backends.base import Backend
from deployments.backends.python import PythonBackend
from deployments.backends.registry import create_backend
from deployments.inference import InferRequest, InferResponse
from repository_loader.errors import ErrorCode, NotFound, Unavailable
from repository_loader.model import SequenceBatching
from tests.backends.helpers import TRITON_INITIALIZE_ARGS, context, describe, request, spec

MODELS = Path(__file__).parent / "python_models"


class LocalExecutor:
    """Runs BLS requests on backends of this process: ``infer``, ``stream`` and model control."""

    def __init__(self) -> None:
        self.backends: dict[str, Backend] = {}
        self.loadable: dict[str, Any] = {}  # name -> a function that loads it
        self.calls: list[InferRequest] = []

    def _backend(self, name: str) -> Backend:
        backend = self.backends.get(name)
        if backend is None:
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        return backend

    async def infer(self, request: InferRequest) -> InferResponse:
        self.calls.append(request)
        try:
            backend = self._backend(request.model_name)
        except NotFound as error:
            return InferResponse(error=error)
        return (await backend.execute([request]))[0]

    async def stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        self.calls.append(request)
        async for response in self._backend(request.model_name).stream(request):
            yield response

    async def load_model(self, name: str, config: str, files: dict[str, bytes]) -> None:
        if name not in self.loadable:
            raise Unavailable(f"failed to load '{name}': not in the repository")
        self.backends[name] = self.loadable[name]()

    async def unload_model(self, name: str, unload_dependents: bool) -> None:
        self._backend(name).unload()
        del self.backends[name]

    async def is_model_ready(self, name: str, version: str) -> bool:
        return name in self.backends


def _python(name: str, inputs, outputs, executor=None, **kwargs) -> PythonBackend:
    backend = create_backend(
        context(describe(name, MODELS / name, "python", inputs, outputs, **kwargs), executor)
    )
    assert isinstance(backend, PythonBackend)
    backend.load()
    return backend


def _add_sub(executor=None) -> PythonBackend:
    model = describe(
        "add_sub",
        MODELS / "add_sub",
        "python",
        [spec("INPUT0", "FP32", [4]), spec("INPUT1", "FP32", [4])],
        [spec("OUTPUT0", "FP32", [4]), spec("OUTPUT1", "FP32", [4])],
    )
    backend = create_backend(context(model, executor))
    backend.load()
    return backend


def _repeat() -> PythonBackend:
    return _python(
        "repeat",
        [spec("IN", "INT32", [-1])],
        [spec("OUT", "INT32", [1]), spec("IDX", "UINT32", [1])],
        decoupled=True,
    )


def _strings(*values: str) -> np.ndarray:
    return np.array([v.encode() for v in values], dtype=object)


# --- BLS -----------------------------------------------------------------------------


async def test_bls_target_name_from_a_bytes_input() -> None:
    executor = LocalExecutor()
    executor.backends["add_sub"] = _add_sub(executor)
    bls = _python(
        "bls_by_name",
        [spec("MODEL_NAME", "BYTES", [1]), spec("INPUT0", "FP32", [4]), spec("INPUT1", "FP32", [4])],
        [spec("OUTPUT0", "FP32", [4]), spec("OUTPUT1", "FP32", [4])],
        executor,
    )
    a, b = np.arange(4, dtype=np.float32), np.ones(4, np.float32)
    call = request("bls_by_name", MODEL_NAME=_strings("add_sub"), INPUT0=a, INPUT1=b)
    call.id, call.correlation_id = "7", 42
    (response,) = await bls.execute([call])
    assert response.error is None
    np.testing.assert_allclose(response.outputs["OUTPUT0"], a + b)
    np.testing.assert_allclose(response.outputs["OUTPUT1"], a - b)
    sent = executor.calls[-1]
    assert sent.model_name == "add_sub" and sent.model_version == "1" and sent.id == "bls-7"
    assert sent.correlation_id == 42 and sent.parameters == {"caller": "bls_by_name"}
    assert sent.timeout_us == 10_000_000
    assert [o.name for o in sent.requested_outputs] == ["OUTPUT0", "OUTPUT1"]
    (missing,) = await bls.execute([request("bls_by_name", MODEL_NAME=_strings("nope"), INPUT0=a, INPUT1=b)])
    assert missing.error is not None and missing.error.code == ErrorCode.NOT_FOUND
    assert "'nope'" in missing.error.message
    bls.unload()


@pytest.mark.parametrize("caller", ["bls_decoupled_sync", "bls_decoupled_async"])
async def test_bls_streams_a_decoupled_model_in_order(caller: str) -> None:
    executor = LocalExecutor()
    executor.backends["repeat"] = _repeat()
    bls = _python(
        caller,
        [spec("IN", "INT32", [-1])],
        [spec("VALUES", "INT32", [-1]), spec("COUNT", "INT32", [1])],
        executor,
    )
    values = np.array([5, 3, 9, 1], np.int32)
    (response,) = await bls.execute([request(caller, IN=values)])
    assert response.error is None, response.error
    copies = 1 if caller.endswith("sync") and not caller.endswith("async") else 2
    assert list(response.outputs["VALUES"]) == list(values) * copies
    assert int(response.outputs["COUNT"][0]) == len(values) * copies
    bls.unload()
    executor.backends["repeat"].unload()


async def test_exec_decoupled_yields_responses_then_an_empty_final_one() -> None:
    executor = LocalExecutor()
    executor.backends["repeat"] = _repeat()
    bls = _python(
        "bls_decoupled_sync", [spec("IN", "INT32", [-1])], [spec("VALUES", "INT32", [-1])], executor
    )
    await bls.execute(
        [request("bls_decoupled_sync", IN=np.array([1], np.int32))]
    )  # the bridge knows the loop
    call = pb_utils.InferenceRequest(
        model_name=b"repeat",
        requested_output_names=["OUT"],
        inputs=[pb_utils.Tensor("IN", np.array([4, 2], np.int32))],
    )
    import asyncio

    from deployments.backends.python_api.context import reset_bridge, set_bridge

    token = set_bridge(bls._bridge, default=False)
    try:
        responses = await asyncio.to_thread(lambda: list(call.exec(decoupled=True)))
        awaited = await call.async_exec(decoupled=True)
    finally:
        reset_bridge(token)
    assert [len(r.output_tensors()) for r in responses] == [1, 1, 0]
    assert [r._final for r in responses] == [False, False, True]
    assert not hasattr(awaited, "__anext__") and iter(awaited) is awaited
    assert [len(r.output_tensors()) for r in awaited] == [1, 1, 0]
    bls.unload()
    executor.backends["repeat"].unload()


def test_bls_request_arguments() -> None:
    req = pb_utils.InferenceRequest(
        model_name=np.array([b"m"], dtype=object)[0],
        model_version="3",
        inputs=[],
        requested_output_names=["Y"],
        correlation_id="seq-1",
        flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
        timeout=5,
        parameters='{"k": "v"}',
        preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0),
    )
    server = req.to_server()
    assert (server.model_name, server.model_version, server.correlation_id) == ("m", "3", "seq-1")
    assert server.sequence_start and not server.sequence_end and server.timeout_us == 5
    assert server.parameters == {"k": "v"} and req.timeout() == 5
    with pytest.raises(pb_utils.TritonModelException, match="bool, int or str"):
        pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], parameters={"x": 1.5})
    with pytest.raises(pb_utils.TritonModelException, match="JSON"):
        pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], parameters="not json")


async def test_bls_timeout_answers_with_an_error() -> None:
    import asyncio

    class Slow(LocalExecutor):
        async def infer(self, request: InferRequest) -> InferResponse:
            await asyncio.sleep(1)
            return InferResponse()

    from deployments.backends.python_api.bls import BlsBridge
    from deployments.backends.python_api.context import reset_bridge, set_bridge

    token = set_bridge(BlsBridge(Slow(), asyncio.get_running_loop()), default=False)
    try:
        call = pb_utils.InferenceRequest(
            model_name="slow", inputs=[], requested_output_names=[], timeout=20_000
        )
        response = await call.async_exec()
    finally:
        reset_bridge(token)
    assert response.has_error() and response.error().code() == pb_utils.TritonError.UNAVAILABLE
    assert "timeout" in response.error().message()


async def test_bls_model_control_reaches_the_executor() -> None:
    executor = LocalExecutor()
    executor.loadable["add_sub"] = lambda: _add_sub(executor)
    control = _python(
        "model_control",
        [spec("ACTION", "BYTES", [1]), spec("TARGET", "BYTES", [1])],
        [spec("READY", "BOOL", [1])],
        executor,
    )

    async def run(action: str, target: str = "add_sub") -> InferResponse:
        (response,) = await control.execute(
            [request("model_control", ACTION=_strings(action), TARGET=_strings(target))]
        )
        return response

    assert not (await run("ready")).outputs["READY"][0]
    assert (await run("load")).outputs["READY"][0] and "add_sub" in executor.backends
    assert not (await run("unload")).outputs["READY"][0] and "add_sub" not in executor.backends
    refused = await run("load", "missing")
    assert refused.error is not None and "not in the repository" in refused.error.message
    control.unload()


async def test_model_control_without_the_capability_is_refused() -> None:
    import asyncio

    from deployments.backends.python_api.bls import BlsBridge
    from deployments.backends.python_api.context import reset_bridge, set_bridge

    class InferOnly:
        async def infer(self, request: InferRequest) -> InferResponse:
            return InferResponse()

    token = set_bridge(BlsBridge(InferOnly(), asyncio.get_running_loop()), default=False)
    try:
        with pytest.raises(pb_utils.TritonModelException, match="not supported"):
            await asyncio.to_thread(pb_utils.load_model, "x")
    finally:
        reset_bridge(token)


# --- requests, responses, errors ------------------------------------------------------------


async def test_request_api_and_initialize_args() -> None:
    backend = _python(
        "request_api", [spec("IN", "INT32", [-1])], [spec("INFO", "BYTES", [1]), spec("OUT", "INT32", [-1])]
    )
    call = request("request_api", IN=np.array([1, 2], np.int32))
    call.id, call.correlation_id, call.timeout_us = "r1", "seq", 1500
    call.sequence_start = True
    call.parameters = {"p": 1, "s": "x"}
    (response,) = await backend.execute([call])
    info = json.loads(response.outputs["INFO"][0])
    assert info["request_id"] == "r1" and info["correlation_id"] == "seq"
    assert info["flags"] == pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START and info["timeout"] == 1500
    assert info["parameters"] == {"p": 1, "s": "x"} and info["requested_output_names"] == ["INFO", "OUT"]
    assert info["inputs"] == ["IN"] and info["is_cancelled"] is False
    assert info["args"] == sorted(TRITON_INITIALIZE_ARGS)
    assert response.parameters == {"echoed": True}
    backend.unload()


@pytest.mark.parametrize(
    "name",
    [
        "UNKNOWN",
        "INTERNAL",
        "NOT_FOUND",
        "INVALID_ARG",
        "UNAVAILABLE",
        "UNSUPPORTED",
        "ALREADY_EXISTS",
        "CANCELLED",
    ],
)
async def test_triton_error_codes_reach_the_server_error(name: str) -> None:
    backend = _python("error_codes", [spec("CODE", "BYTES", [1])], [spec("OUT", "INT32", [1])])
    (response,) = await backend.execute([request("error_codes", CODE=_strings(name))])
    assert response.error is not None and response.error.code == ErrorCode(name)
    assert response.error.message == f"failed with {name}"
    from repository_loader.errors import STATUS_TABLE

    assert (response.error.http_status, response.error.grpc_status) == STATUS_TABLE[ErrorCode(name)]
    backend.unload()


async def test_model_exception_fails_the_whole_batch() -> None:
    backend = _python("error_codes", [spec("CODE", "BYTES", [1])], [spec("OUT", "INT32", [1])])
    ok, failing = await backend.execute(
        [request("error_codes", CODE=_strings("OK")), request("error_codes", CODE=_strings("EXCEPTION"))]
    )
    for response in (ok, failing):
        assert response.error is not None and response.error.code == ErrorCode.INTERNAL
        assert "the whole batch failed" in response.error.message
    backend.unload()


# --- decoupled ------------------------------------------------------------------------


ITERATIVE = SequenceBatching(iterative=True)  # what Triton requires of a model that reschedules


def _reschedule(**kwargs: Any) -> PythonBackend:
    kwargs.setdefault("sequence_batching", ITERATIVE)
    return _python(
        "reschedule", [spec("IN", "INT32", [1])], [spec("OUT", "INT32", [1])], decoupled=True, **kwargs
    )


async def test_rescheduled_request_runs_again_until_released() -> None:
    backend = _reschedule()
    streamed = [r async for r in backend.stream(request("reschedule", IN=np.array([3], np.int32)))]
    assert [int(r.outputs["OUT"][0]) for r in streamed] == [2, 1, 0]
    assert [r.final for r in streamed] == [False, False, True]
    assert backend._instance.executions == 3
    responses = await backend.execute(
        [request("reschedule", IN=np.array([2], np.int32)), request("reschedule", IN=np.array([1], np.int32))]
    )
    assert [int(r.outputs["OUT"][0]) for r in responses] == [1, 0, 0]
    assert backend._instance.executions == 5
    backend.unload()


async def test_rescheduling_needs_an_iterative_sequence_model() -> None:
    # Triton's scheduler refuses a RESCHEDULE release unless the model runs iterative sequences
    backend = _reschedule(sequence_batching=None)
    streamed = [r async for r in backend.stream(request("reschedule", IN=np.array([3], np.int32)))]
    assert [int(r.outputs["OUT"][0]) for r in streamed if r.outputs] == [2]
    assert streamed[-1].final and streamed[-1].error is not None
    assert streamed[-1].error.code == ErrorCode.INVALID_ARG
    assert streamed[-1].error.message.startswith(
        "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, but model 'reschedule'"
    )
    assert backend._instance.executions == 1  # not run again
    backend.unload()


async def test_a_request_held_past_the_idle_limit_comes_back_without_its_sequence() -> None:
    # Triton's sequence batcher releases the slot of a sequence idle longer than its limit: the
    # rescheduled request then lacks START, as L0_iterative_sequence's test_reschedule_error expects
    backend = _reschedule(
        sequence_batching=SequenceBatching(iterative=True, max_sequence_idle_microseconds=1)
    )
    call = request("reschedule", IN=np.array([3], np.int32))
    call.correlation_id = 42
    streamed = [r async for r in backend.stream(call)]
    assert streamed[-1].error is not None and streamed[-1].error.code == ErrorCode.INVALID_ARG
    assert streamed[-1].error.message == (
        "inference request for sequence 42 to model 'reschedule' must specify the START flag on the "
        "first request of the sequence"
    )
    backend.unload()


async def test_response_sender_rejects_a_second_final() -> None:
    backend = _repeat()
    streamed = [r async for r in backend.stream(request("repeat", IN=np.array([], np.int32)))]
    assert len(streamed) == 1 and streamed[0].final and not streamed[0].outputs
    backend.unload()


# --- custom metrics and the logger -----------------------------------------------------------


async def test_custom_metrics_model_and_prometheus_text(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="triton_python_backend"):
        backend = _python("custom_metrics", [spec("IN", "FP32", [-1])], [spec("COUNT", "FP64", [1])])
        for values in ([0.5, 2.0, 7.0], [20.0]):
            (response,) = await backend.execute([request("custom_metrics", IN=np.array(values, np.float32))])
            assert response.error is None
    assert float(response.outputs["COUNT"][0]) == 2.0
    text = custom_metrics.render_prometheus()
    labels = 'model="custom_metrics",version="1"'
    expected = [
        "# HELP custom_requests_total Requests this model executed",
        "# TYPE custom_requests_total counter",
        f"custom_requests_total{{{labels}}} 2",
        "# HELP custom_execute_latency_ns Cumulative time spent in execute",
        "# TYPE custom_execute_latency_ns counter",
        "# HELP custom_last_input_size Elements of the last input",
        "# TYPE custom_last_input_size gauge",
        f"custom_last_input_size{{{labels}}} 1",
        "# HELP custom_input_value Input values",
        "# TYPE custom_input_value histogram",
        f"custom_input_value_count{{{labels}}} 4",
        f"custom_input_value_sum{{{labels}}} 29.5",
        f'custom_input_value_bucket{{{labels},le="1"}} 1',
        f'custom_input_value_bucket{{{labels},le="5"}} 2',
        f'custom_input_value_bucket{{{labels},le="10"}} 3',
        f'custom_input_value_bucket{{{labels},le="+Inf"}} 4',
    ]
    lines = text.splitlines()
    assert [line for line in lines if not line.startswith("custom_execute_latency_ns{")] == expected
    assert any(
        line.startswith('custom_execute_latency_ns{model="custom_metrics",version="1"} ') for line in lines
    )
    messages = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "triton_python_backend"]
    assert ("INFO", "model 'custom_metrics': initialized") in messages
    assert ("DEBUG", "model 'custom_metrics': request of 3 values") in messages
    assert {
        ("WARNING", "model 'custom_metrics': a warning"),
        ("ERROR", "model 'custom_metrics': an error"),
    } <= set(messages)
    assert all(r.pathname.endswith("model.py") for r in caplog.records if r.name == "triton_python_backend")
    backend.unload()
    import gc

    gc.collect()
    assert "custom_requests_total" not in custom_metrics.render_prometheus()  # released with the model
