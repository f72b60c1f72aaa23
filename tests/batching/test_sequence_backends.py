"""The sequence batcher with real backends: implicit state, a Python accumulator, an ONNX state model."""

from __future__ import annotations

import random
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from deployments.backends.base import BackendContext
from deployments.inference import InferRequest, InferResponse, RequestedOutput
from deployments.runtime.batching import make_scheduler
from deployments.runtime.sequence import SequenceBatcher
from deployments.runtime.sequence_config import backend_model
from tests.batching.sequence_models import MODELS, from_text, running_sums

STATE = """
  state [ {
    input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 1 ]
    %s
  } ]
"""


def state_model(path: Path, initial: str = "", strategy: str = "direct { }") -> object:
    text = f"""
name: "state"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: 5000000
  {strategy}
  {STATE % initial}
}}
"""
    return from_text(text, path)


def state_request(
    cid: int, value: float, start: bool = False, end: bool = False, **kw: object
) -> InferRequest:
    return InferRequest(
        model_name="state",
        inputs={"IN": np.full((1, 1), value, dtype=np.float32)},
        correlation_id=cid,
        sequence_start=start,
        sequence_end=end,
        **kw,  # type: ignore[arg-type]
    )


async def fake_state_model(requests: Sequence[InferRequest]) -> list[InferResponse]:
    """STATE_OUT = STATE_IN + IN; OUT = STATE_OUT (what the ONNX model below computes)."""
    responses = []
    for r in requests:
        total = r.inputs["STATE_IN"] + r.inputs["IN"]
        wanted = r.output_names(["OUT", "STATE_OUT"])
        responses.append(InferResponse(outputs={n: total for n in wanted}))
    return responses


async def sums(batcher: object, sequences: dict[int, list[float]]) -> dict[int, list[float]]:
    import asyncio

    async def one(cid: int, values: list[float]) -> list[float]:
        got = []
        for i, v in enumerate(values):
            response = await batcher.submit(state_request(cid, v, start=i == 0, end=i == len(values) - 1))  # type: ignore[attr-defined]
            assert response.error is None, response.error
            assert set(response.outputs) == {"OUT"}  # the state never reaches the client
            got.append(float(response.outputs["OUT"][0, 0]))
        return got

    results = await asyncio.gather(*(one(c, v) for c, v in sequences.items()))
    return dict(zip(sequences, results, strict=True))


async def test_implicit_state_is_kept_per_sequence_and_reset_on_start(tmp_path: Path) -> None:
    batcher = SequenceBatcher(state_model(tmp_path), fake_state_model)  # type: ignore[arg-type]
    assert await sums(batcher, {1: [1.0, 2.0, 3.0], 2: [10.0, 10.0]}) == {1: [1.0, 3.0, 6.0], 2: [10.0, 20.0]}
    await batcher.submit(state_request(3, 5.0, start=True))
    restarted = await batcher.submit(state_request(3, 1.0, start=True))
    assert restarted.outputs["OUT"][0, 0] == 1.0


async def test_state_output_is_asked_for_even_when_the_client_names_its_outputs(tmp_path: Path) -> None:
    batcher = SequenceBatcher(state_model(tmp_path), fake_state_model)  # type: ignore[arg-type]
    for i, value in enumerate((1.0, 2.0)):
        response = await batcher.submit(
            state_request(1, value, start=i == 0, requested_outputs=[RequestedOutput("OUT")])
        )
        assert set(response.outputs) == {"OUT"}
    assert response.outputs["OUT"][0, 0] == 3.0


async def test_a_state_output_the_configuration_lists_is_answered_when_asked_for(tmp_path: Path) -> None:
    """L0_implicit_state's ``_output`` model: the configuration lists the state's output, so a client
    that asks for it (or for every output) gets it, and the state still goes on; one that names only
    its other outputs does not."""
    from dataclasses import replace

    from repository_loader.model import TensorSpec

    model = state_model(tmp_path)
    listed = replace(model, outputs=(*model.outputs, TensorSpec("STATE_OUT", "FP32", (1,))))  # type: ignore[type-var]
    batcher = SequenceBatcher(listed, fake_state_model)  # type: ignore[arg-type]
    both = [RequestedOutput("OUT"), RequestedOutput("STATE_OUT")]
    first = await batcher.submit(state_request(1, 1.0, start=True, requested_outputs=both))
    assert set(first.outputs) == {"OUT", "STATE_OUT"} and first.outputs["STATE_OUT"][0, 0] == 1.0
    every = await batcher.submit(state_request(1, 2.0))
    assert set(every.outputs) == {"OUT", "STATE_OUT"} and every.outputs["STATE_OUT"][0, 0] == 3.0
    only = await batcher.submit(state_request(1, 3.0, end=True, requested_outputs=[RequestedOutput("OUT")]))
    assert set(only.outputs) == {"OUT"} and only.outputs["OUT"][0, 0] == 6.0


async def test_initial_state_from_a_data_file(tmp_path: Path) -> None:
    (tmp_path / "initial_state").mkdir()
    np.array([100.0], dtype=np.float32).tofile(tmp_path / "initial_state" / "hundred.bin")
    initial = 'initial_state: { data_type: TYPE_FP32 dims: [ 1 ] name: "h" data_file: "hundred.bin" }'
    batcher = SequenceBatcher(state_model(tmp_path, initial), fake_state_model)  # type: ignore[arg-type]
    assert await sums(batcher, {1: [1.0, 1.0]}) == {1: [101.0, 102.0]}


def _accumulator_backend(tmp_path: Path) -> tuple[object, object]:
    from deployments.backends.python import PythonBackend

    folder = tmp_path / "sequence_accumulator"
    shutil.copytree(MODELS / "sequence_accumulator", folder)
    model = from_text((folder / "config.pbtxt").read_text(), folder)
    backend = PythonBackend(BackendContext(backend_model(model), 1))
    backend.load()
    return model, backend


async def test_python_accumulator_64_interleaved_sequences(tmp_path: Path) -> None:
    model, backend = _accumulator_backend(tmp_path)
    scheduler = make_scheduler(model, backend.execute, max_concurrent_batches=2)  # type: ignore[arg-type, attr-defined]
    assert isinstance(scheduler, SequenceBatcher)
    rng = random.Random(11)
    sequences = {cid: [rng.randint(1, 9) for _ in range(rng.randint(1, 8))] for cid in range(1, 65)}

    async def one(cid: int, values: list[int]) -> list[int]:
        got = []
        for i, v in enumerate(values):
            response = await scheduler.submit(
                InferRequest(
                    model_name=model.name,  # type: ignore[attr-defined]
                    inputs={"IN": np.array([[v]], dtype=np.int32)},
                    correlation_id=cid,
                    sequence_start=i == 0,
                    sequence_end=i == len(values) - 1,
                )
            )
            assert response.error is None, response.error
            got.append(int(response.outputs["OUT"][0, 0]))
        return got

    import asyncio

    results = await asyncio.gather(*(one(c, v) for c, v in sequences.items()))
    for (_, values), got in zip(sequences.items(), results, strict=True):
        assert got == [int(x) for x in running_sums([float(v) for v in values])]
    await scheduler.close()
    backend.unload()  # type: ignore[attr-defined]


def _onnx_state_model(folder: Path) -> None:
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["IN", "STATE_IN"], ["SUM"]), helper.make_node("Identity", ["SUM"], ["OUT"])]
        + [helper.make_node("Identity", ["SUM"], ["STATE_OUT"])],
        "running_sum",
        [
            helper.make_tensor_value_info("IN", TensorProto.FLOAT, [None, 1]),
            helper.make_tensor_value_info("STATE_IN", TensorProto.FLOAT, [None, 1]),
        ],
        [
            helper.make_tensor_value_info("OUT", TensorProto.FLOAT, [None, 1]),
            helper.make_tensor_value_info("STATE_OUT", TensorProto.FLOAT, [None, 1]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (folder / "1").mkdir(parents=True)
    onnx.save(model, str(folder / "1" / "model.onnx"))


@pytest.mark.parametrize("strategy", ["direct { }", "oldest { max_candidate_sequences: 16 }"])
async def test_onnx_model_with_implicit_state_64_interleaved_sequences(tmp_path: Path, strategy: str) -> None:
    folder = tmp_path / "state"
    _onnx_state_model(folder)
    from deployments.backends.onnxruntime import OnnxRuntimeBackend

    model = state_model(folder, strategy=strategy)
    backend = OnnxRuntimeBackend(BackendContext(backend_model(model), 1))  # type: ignore[arg-type]
    backend.load()
    batcher = make_scheduler(model, backend.execute, max_concurrent_batches=2)  # type: ignore[arg-type]
    rng = random.Random(5)
    sequences = {cid: [float(rng.randint(1, 9)) for _ in range(rng.randint(1, 8))] for cid in range(1, 65)}
    assert await sums(batcher, sequences) == {c: running_sums(v) for c, v in sequences.items()}
    await batcher.close()
    backend.unload()


async def test_a_direct_batchs_padding_counts_in_its_batch_size_not_in_the_inference_count(
    tmp_path: Path,
) -> None:
    """Sequences in slots 0 and 2 run together with slot 1 padded: the execution is of batch size 3
    (what the model ran) and the inference count grows by 2, as Triton counts them."""
    import asyncio

    from deployments.runtime.model import ModelRuntime

    folder = tmp_path / "sequence_accumulator"
    shutil.copytree(MODELS / "sequence_accumulator", folder)
    model = from_text((folder / "config.pbtxt").read_text(), folder)
    runtime = ModelRuntime(model)  # type: ignore[arg-type]
    await runtime.load()

    async def ask(cid: int, start: bool = False) -> None:
        inputs = {"IN": np.array([[1]], dtype=np.int32)}
        request = InferRequest(
            model_name="sequence_accumulator", inputs=inputs, correlation_id=cid, sequence_start=start
        )
        response = await runtime.infer(request)
        assert response.error is None, response.error

    try:
        for cid in (1, 2, 3):  # slots 0, 1, 2, one batch each: sizes 1, 2 and 3, the slots below padded
            await ask(cid, start=True)
        await asyncio.gather(ask(1), ask(3))  # slots 0 and 2: size 3, slot 1 padded
        stats = runtime.statistics()[0]
        assert stats["execution_count"] == 4 and stats["inference_count"] == 5  # not 1 + 2 + 3 + 3
        assert sorted(int(b["batch_size"]) for b in stats["batch_stats"]) == [1, 2, 3]
    finally:
        await runtime.close()


ITERATIVE_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Runs each sequence over two executions: the first reschedules its request, the second answers
    IN + the executions its sequence ID has seen (2; more where two requests shared an ID)."""

    def initialize(self, args):
        self.executions = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            key = request.correlation_id()
            self.executions[key] = self.executions.get(key, 0) + 1
            if self.executions[key] == 1:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(None)
                continue
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            out = (x + self.executions[key]).astype(x.dtype)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
'''


async def test_an_iterative_sequence_runs_a_request_again_until_the_model_answers(tmp_path: Path) -> None:
    """``iterative_sequence: true`` through the model runtime: requests without a sequence ID each become
    a sequence of their own (one ID each), which the model reschedules once and then answers."""
    from deployments.runtime.model import ModelRuntime

    folder = tmp_path / "iterative"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(ITERATIVE_PY)
    text = """
name: "iterative"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching { iterative_sequence: true }
"""
    runtime = ModelRuntime(from_text(text, folder))  # type: ignore[arg-type]
    await runtime.load()
    try:
        for value in (1, 5):
            request = InferRequest(model_name="iterative", inputs={"IN": np.array([value], dtype=np.int32)})
            response = await runtime.infer(request)
            assert response.error is None, response.error
            assert response.outputs["OUT"].tolist() == [value + 2]  # rescheduled once, its own sequence
        stats = runtime.statistics()[0]
        assert stats["inference_stats"]["success"]["count"] == 2
    finally:
        await runtime.close()
