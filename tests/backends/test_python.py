"""Python backend: Triton-style model.py files run unchanged and give Triton's results."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from deployments.backends.base import Backend
from deployments.backends.python import PythonBackend
from deployments.backends.registry import create_backend
from deployments.inference import InferRequest, InferResponse
from repository_loader.errors import ErrorCode, InvalidArgument, NotFound, Unavailable
from repository_loader.model import InstanceKind
from tests.backends.helpers import (
    TRITON_INITIALIZE_ARGS,
    context,
    describe,
    infer_through_runtime,
    python_backend,
    request,
    spec,
)

MODELS = Path(__file__).parent / "python_models"


class LocalExecutor:
    """Runs BLS requests on backends loaded in this process."""

    def __init__(self) -> None:
        self.backends: dict[str, Backend] = {}
        self.calls: list[InferRequest] = []

    async def infer(self, request: InferRequest) -> InferResponse:
        self.calls.append(request)
        backend = self.backends.get(request.model_name)
        if backend is None:
            return InferResponse(error=NotFound(f"model '{request.model_name}' is not loaded"))
        return (await backend.execute([request]))[0]


def _python(name: str, inputs, outputs, executor=None, folder: str | None = None, **kwargs) -> PythonBackend:
    backend: PythonBackend = python_backend(
        name, MODELS / (folder or name), inputs, outputs, executor, **kwargs
    )
    return backend


def _add_sub(executor=None, name: str = "add_sub", datatype: str = "FP32") -> PythonBackend:
    return _python(
        name,
        [spec("INPUT0", datatype, [4]), spec("INPUT1", datatype, [4])],
        [spec("OUTPUT0", datatype, [4]), spec("OUTPUT1", datatype, [4])],
        executor,
        folder="add_sub",
        max_batch_size=8,
    )


async def test_add_sub_gets_the_whole_batch_in_one_execute() -> None:
    backend = _add_sub()
    rng = np.random.default_rng(0)
    pairs = [(rng.random((n, 4), np.float32), rng.random((n, 4), np.float32)) for n in (1, 2, 3)]
    responses = await backend.execute([request("add_sub", INPUT0=a, INPUT1=b) for a, b in pairs])
    assert backend._instance.last_batch_size == 3
    for (a, b), response in zip(pairs, responses, strict=True):
        assert response.error is None
        np.testing.assert_allclose(response.outputs["OUTPUT0"], a + b)
        np.testing.assert_allclose(response.outputs["OUTPUT1"], a - b)
        assert response.model_name == "add_sub" and response.model_version == "1"
    backend.unload()


async def test_initialize_receives_triton_args() -> None:
    backend = _add_sub()
    args = backend._instance.args
    assert set(args) == TRITON_INITIALIZE_ARGS
    config = json.loads(args["model_config"])
    assert config["name"] == "add_sub" and config["max_batch_size"] == 8
    assert [i["data_type"] for i in config["input"]] == ["TYPE_FP32", "TYPE_FP32"]
    assert args["model_instance_kind"] == "CPU" and args["model_version"] == "1"
    assert args["model_repository"] == str(MODELS / "add_sub")
    instance = backend._instance
    backend.unload()
    assert instance.finalized


async def test_config_json_is_passed_when_the_description_has_it() -> None:
    model = describe(
        "add_sub",
        MODELS / "add_sub",
        "python",
        [spec("INPUT0", "INT32", [4]), spec("INPUT1", "INT32", [4])],
        [spec("OUTPUT0", "INT32", [4]), spec("OUTPUT1", "INT32", [4])],
        config_json={
            "name": "add_sub",
            "input": [{"name": n, "data_type": "TYPE_INT32", "dims": [4]} for n in ("INPUT0", "INPUT1")],
            "output": [
                {"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [4]},
                {"name": "OUTPUT1", "data_type": "TYPE_INT16", "dims": [4]},
            ],
        },
    )
    backend = create_backend(context(model))
    backend.load()
    assert backend._instance.output1_dtype == np.int16
    backend.unload()


async def test_requested_outputs_are_filtered_as_triton_does() -> None:
    backend = _add_sub()
    a = np.ones((1, 4), np.float32)
    (response,) = await backend.execute([request("add_sub", ["OUTPUT1"], INPUT0=a, INPUT1=a)])
    assert list(response.outputs) == ["OUTPUT1"]
    backend.unload()


async def test_strings_round_trip_as_bytes() -> None:
    backend = _python(
        "strings",
        [spec("TEXT", "BYTES", [-1])],
        [spec("UPPER", "BYTES", [-1]), spec("LENGTH", "INT32", [-1])],
    )
    text = np.array(["héllo".encode(), b"ab", b""], dtype=object)
    (response,) = await backend.execute([request("strings", TEXT=text)])
    assert list(response.outputs["UPPER"]) == ["HÉLLO".encode(), b"AB", b""]
    np.testing.assert_array_equal(response.outputs["LENGTH"], [len(t) for t in text])
    backend.unload()


async def test_pytorch_inside_model_py() -> None:
    torch = pytest.importorskip("torch")
    backend = _python(
        "torch_add_sub",
        [spec("INPUT0", "FP32", [-1]), spec("INPUT1", "FP32", [-1])],
        [spec("OUTPUT0", "FP32", [-1]), spec("OUTPUT1", "FP32", [-1])],
    )
    a, b = np.arange(4, dtype=np.float32), np.full(4, 0.5, np.float32)
    (response,) = await backend.execute([request("torch_add_sub", INPUT0=a, INPUT1=b)])
    out0 = response.outputs["OUTPUT0"]
    assert isinstance(out0, torch.Tensor)
    np.testing.assert_allclose(out0.numpy(), a + b)
    np.testing.assert_allclose(response.outputs["OUTPUT1"], a - b)
    backend.unload()


def _repeat() -> PythonBackend:
    return _python(
        "repeat",
        [spec("IN", "INT32", [-1])],
        [spec("OUT", "INT32", [1]), spec("IDX", "UINT32", [1])],
        decoupled=True,
    )


async def test_decoupled_stream_yields_every_response_then_final() -> None:
    backend = _repeat()
    values = np.array([4, 2, 0, 7], np.int32)
    streamed = [r async for r in backend.stream(request("repeat", IN=values))]
    content = [r for r in streamed if r.outputs]
    assert [int(r.outputs["OUT"][0]) for r in content] == list(values)
    assert [int(r.outputs["IDX"][0]) for r in content] == [0, 1, 2, 3]
    assert all(not r.final for r in content)
    assert streamed[-1].final and all(r.error is None for r in streamed)
    backend.unload()


async def test_decoupled_execute_collects_responses_per_request() -> None:
    backend = _repeat()
    responses = await backend.execute(
        [request("repeat", IN=np.array([1, 2], np.int32)), request("repeat", IN=np.array([3], np.int32))]
    )
    assert [int(r.outputs["OUT"][0]) for r in responses] == [1, 2, 3]
    assert [r.final for r in responses] == [False, True, True]
    backend.unload()


async def test_bls_from_sync_execute_runs_the_target_backend() -> None:
    executor = LocalExecutor()
    executor.backends["add_sub"] = _add_sub(executor)
    bls = _python(
        "bls",
        [spec("INPUT0", "FP32", [4]), spec("INPUT1", "FP32", [4])],
        [spec("OUTPUT0", "FP32", [4]), spec("OUTPUT1", "FP32", [4])],
        executor,
        max_batch_size=8,
        parameters={"MODEL_NAME": "add_sub"},
    )
    a, b = np.full((2, 4), 3, np.float32), np.ones((2, 4), np.float32)
    (response,) = await bls.execute([request("bls", INPUT0=a, INPUT1=b)])
    assert response.error is None
    np.testing.assert_allclose(response.outputs["OUTPUT0"], a + b)
    np.testing.assert_allclose(response.outputs["OUTPUT1"], a - b)
    assert executor.calls[0].inputs["INPUT0"] is a  # handed on, not copied
    bls.unload()


async def test_bls_error_surfaces_as_model_error() -> None:
    executor = LocalExecutor()
    bls = _python(
        "bls",
        [spec("INPUT0", "FP32", [4]), spec("INPUT1", "FP32", [4])],
        [spec("OUTPUT0", "FP32", [4]), spec("OUTPUT1", "FP32", [4])],
        executor,
        max_batch_size=8,
        parameters={"MODEL_NAME": "missing"},
    )
    a = np.ones((1, 4), np.float32)
    (response,) = await bls.execute([request("bls", INPUT0=a, INPUT1=a)])
    assert response.error is not None and "missing" in response.error.message
    bls.unload()


async def test_bls_from_async_execute_runs_concurrently() -> None:
    executor = LocalExecutor()
    executor.backends["add_sub"] = _add_sub(executor)
    model = _python(
        "bls_async",
        [spec("INPUT0", "FP32", [4]), spec("INPUT1", "FP32", [4])],
        [spec("OUTPUT0", "FP32", [4])],
        executor,
        max_batch_size=8,
    )
    a, b = np.full((1, 4), 5, np.float32), np.full((1, 4), 2, np.float32)
    (response,) = await model.execute([request("bls_async", INPUT0=a, INPUT1=b)])
    np.testing.assert_allclose(response.outputs["OUTPUT0"], 2 * np.abs(a - b))
    assert len(executor.calls) == 2
    model.unload()


async def test_auto_complete_config_model_runs_unchanged() -> None:
    import triton_python_backend_utils as pb_utils
    from deployments.backends.python import import_model

    module = import_model(MODELS / "auto_complete" / "1" / "model.py", "auto_complete")
    completed = module.TritonPythonModel.auto_complete_config(
        pb_utils.ModelConfig({"name": "auto_complete", "max_batch_size": 0, "input": [], "output": []})
    ).as_dict()
    assert completed["max_batch_size"] == 4 and "dynamic_batching" in completed
    to_spec = lambda t: spec(t["name"], t["data_type"].removeprefix("TYPE_"), t["dims"])  # noqa: E731
    backend = _python(
        "auto_complete",
        [to_spec(t) for t in completed["input"]],
        [to_spec(t) for t in completed["output"]],
        max_batch_size=completed["max_batch_size"],
        config_json=completed,
    )
    x = np.array([[1.5, -2.0]], np.float32)
    (response,) = await backend.execute([request("auto_complete", INPUT=x)])
    np.testing.assert_allclose(response.outputs["OUTPUT"], 2 * x)
    backend.unload()


def _failing() -> PythonBackend:
    return _python("failing", [spec("MODE", "BYTES", [1])], [spec("OUT", "INT32", [1])])


@pytest.mark.parametrize(
    ("mode", "code", "text"),
    [
        (b"invalid", ErrorCode.INVALID_ARG, "bad value for MODE"),
        (b"unsupported", ErrorCode.UNSUPPORTED, "no"),
        (b"raise", ErrorCode.INTERNAL, "asked to raise"),
        (b"crash", ErrorCode.INTERNAL, "ZeroDivisionError"),
        (b"short", ErrorCode.INTERNAL, "do not match the number of InferenceRequest objects"),
    ],
)
async def test_model_errors_become_responses_with_codes(mode: bytes, code: ErrorCode, text: str) -> None:
    backend = _failing()
    (response,) = await backend.execute([request("failing", MODE=np.array([mode], dtype=object))])
    assert response.error is not None and response.error.code == code
    assert text in response.error.message
    (ok,) = await backend.execute([request("failing", MODE=np.array([b"ok"], dtype=object))])
    assert ok.error is None and int(ok.outputs["OUT"][0]) == 1
    backend.unload()


async def test_invalid_request_is_rejected_before_the_model() -> None:
    backend = _add_sub()
    (response,) = await infer_through_runtime(
        backend, [request("add_sub", INPUT0=np.ones((1, 4), np.float32))]
    )
    assert isinstance(response.error, InvalidArgument) and "INPUT1" in response.error.message
    backend.unload()


def test_missing_class_or_file_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.py").write_text("class Other:\n    pass\n")
    model = describe("m", tmp_path / "m", "python", [], [])
    with pytest.raises(Unavailable, match="TritonPythonModel"):
        create_backend(context(model)).load()
    model = describe("gone", tmp_path / "gone", "python", [], [])
    with pytest.raises(Unavailable, match="gone"):
        create_backend(context(model)).load()


def test_failing_initialize_is_unavailable() -> None:
    model = describe(
        "repeat", MODELS / "repeat", "python", [spec("IN", "INT32", [-1])], [spec("OUT", "INT32", [1])]
    )
    with pytest.raises(Unavailable, match="decoupled"):
        create_backend(context(model, kind=InstanceKind.CPU)).load()


async def test_sync_exec_from_a_worker_thread_reaches_the_loop() -> None:
    """exec() from a thread the model starts goes through the replica's running loop."""
    import triton_python_backend_utils as pb_utils

    executor = LocalExecutor()
    executor.backends["add_sub"] = _add_sub(executor)
    bls = _python(
        "bls",
        [spec("INPUT0", "FP32", [4]), spec("INPUT1", "FP32", [4])],
        [spec("OUTPUT0", "FP32", [4]), spec("OUTPUT1", "FP32", [4])],
        executor,
        max_batch_size=8,
        parameters={"MODEL_NAME": "add_sub"},
    )
    await bls.execute(
        [request("bls", INPUT0=np.ones((1, 4), np.float32), INPUT1=np.ones((1, 4), np.float32))]
    )
    x = pb_utils.Tensor("INPUT0", np.ones((1, 4), np.float32))
    call = pb_utils.InferenceRequest(
        model_name="add_sub",
        requested_output_names=["OUTPUT0"],
        inputs=[x, pb_utils.Tensor("INPUT1", x.as_numpy())],
    )
    response = await asyncio.to_thread(call.exec)
    np.testing.assert_allclose(
        pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy(), 2 * x.as_numpy()
    )
    with pytest.raises(pb_utils.TritonModelException, match="async_exec"):
        call.exec()  # on the loop thread itself: would block the loop
    bls.unload()


async def test_non_decoupled_model_may_answer_through_the_sender() -> None:
    backend = _python("sender_once", [spec("IN", "INT32", [-1])], [spec("OUT", "INT32", [-1])])
    first, second = await backend.execute(
        [
            request("sender_once", IN=np.array([1, 2], np.int32)),
            request("sender_once", IN=np.array([5], np.int32)),
        ]
    )
    np.testing.assert_array_equal(first.outputs["OUT"], [2, 3])
    np.testing.assert_array_equal(second.outputs["OUT"], [6])
    assert first.final and second.final
    assert backend._instance.closed_sender_refused
    backend.unload()


async def test_a_decoupled_request_whose_sender_is_let_go_before_final_ends_with_an_error() -> None:
    """The model's response thread dies after one response: the stream ends with an error naming the
    missing final flag instead of waiting for ever (the sender goes with the thread)."""
    import asyncio
    import gc
    import time

    backend = _python("dying_sender", [spec("IN", "INT32", [1])], [spec("OUT", "INT32", [1])], decoupled=True)

    async def collect() -> list:
        return [r async for r in backend.stream(request("dying_sender", IN=np.array([1], np.int32)))]

    task = asyncio.ensure_future(collect())
    deadline = time.monotonic() + 30
    while not task.done():  # the thread's frame (and the sender in it) is freed when the thread ends
        assert time.monotonic() < deadline, "the stream never ended"
        gc.collect()
        await asyncio.sleep(0.02)
    streamed = task.result()
    assert int(streamed[0].outputs["OUT"][0]) == 1
    assert streamed[-1].final and streamed[-1].error is not None
    assert "without sending the final flag" in streamed[-1].error.message
    backend.unload()


async def test_a_model_written_for_numpy_1_runs_unchanged() -> None:
    """Triton 2.51's Python-backend stub runs on NumPy 1: a model may use the aliases NumPy 2 removed."""
    from deployments.backends.python_api import numpy1

    backend = _python("numpy1", [spec("INPUT0", "FP32", [1])], [spec("OUTPUT0", "FP32", [4])])
    (response,) = await backend.execute([request("numpy1", INPUT0=np.zeros(1, np.float32))])
    assert response.error is None, response.error
    out = response.outputs["OUTPUT0"]
    assert np.isnan(out[0]) and out[1] == np.inf and out[2] == -np.inf and np.signbit(out[3])
    assert numpy1.restore() == []  # restored once, for every model of the process
