"""Decoupled models through the model runtime: every response in order, statistics, cancellation."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deployments.runtime.model import ModelRuntime
from repository_loader.model import DynamicBatching, ModelDescription, TensorSpec
from tests.backends.helpers import describe, request, spec
from tests.serve.streaming_models import UNTIL_CANCELLED_PY

MODELS = Path(__file__).resolve().parent / "python_models"


async def _runtime(model: ModelDescription) -> ModelRuntime:
    runtime = ModelRuntime(model)
    await runtime.load()
    return runtime


def _written_model(
    tmp_path: Path, name: str, source: str, inputs: list[TensorSpec], outputs: list[TensorSpec], **kw: Any
) -> ModelDescription:
    """A Python model ``name`` whose ``model.py`` is ``source``, written under ``tmp_path``."""
    folder = tmp_path / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(source)
    return describe(name, folder, "python", inputs, outputs, **kw)


async def _until_cancelled(tmp_path: Path, batched: bool = False) -> ModelRuntime:
    """The decoupled model that streams until its request is cancelled (it marks that in ``tmp_path``);
    ``batched``: under the dynamic batcher."""
    model = _written_model(
        tmp_path,
        "until_cancelled",
        UNTIL_CANCELLED_PY,
        [spec("X", "INT32", [1])],
        [spec("Y", "INT32", [1])],
        decoupled=True,
        parameters={"MARKER_DIR": str(tmp_path)},
        **({"max_batch_size": 4, "dynamic_batching": DynamicBatching()} if batched else {}),
    )
    return await _runtime(model)


async def test_infer_stream_yields_every_response_and_counts_the_request() -> None:
    model = describe(
        "repeat",
        MODELS / "repeat",
        "python",
        [spec("IN", "INT32", [-1])],
        [spec("OUT", "INT32", [1]), spec("IDX", "UINT32", [1])],
        decoupled=True,
    )
    runtime = await _runtime(model)
    try:
        streamed = [
            r async for r in runtime.infer_stream(request("repeat", IN=np.array([5, 6, 7], np.int32)))
        ]
        assert [int(r.outputs["OUT"][0]) for r in streamed if r.outputs] == [5, 6, 7]
        assert streamed[-1].final and all(r.model_version == "1" for r in streamed)
        bad = [r async for r in runtime.infer_stream(request("repeat", WRONG=np.array([1], np.int32)))]
        assert len(bad) == 1 and bad[0].error is not None
        stats = runtime.statistics()[0]
        assert stats["inference_stats"]["success"]["count"] == 1
        assert stats["inference_stats"]["fail"]["count"] == 1
        assert stats["execution_count"] == 1
        # nv_inference_request_failure's reason: refused before the model, as Triton counts it
        assert runtime.versions[1].failures == {"OTHER": 1}
    finally:
        await runtime.close()


@pytest.mark.parametrize("batched", [False, True], ids=["alone", "dynamic_batching"])
async def test_closing_the_stream_cancels_the_request(tmp_path: Path, batched: bool) -> None:
    runtime = await _until_cancelled(tmp_path, batched)
    try:
        x = np.array([[9]] if batched else [9], np.int32)
        stream = runtime.infer_stream(request("until_cancelled", X=x))
        seen = [await stream.__anext__() for _ in range(3)]
        assert [int(r.outputs["Y"][0]) for r in seen] == [0, 1, 2]
        await asyncio.wait_for(stream.aclose(), 10)
        await _until((tmp_path / "9.cancelled").exists)  # the model's thread looks every 10 ms
        assert runtime.versions[1].failures == {"CANCELED": 1}  # left before its final response
    finally:
        await runtime.close()


async def test_ongoing_counts_the_requests_inside_the_replica(tmp_path: Path) -> None:
    """What Serve's autoscaling scales on: a stream counts while it runs, and not after it closes."""
    runtime = await _until_cancelled(tmp_path)
    try:
        assert runtime.ongoing == 0
        streams = [
            runtime.infer_stream(request("until_cancelled", X=np.array([i], np.int32))) for i in (1, 2)
        ]
        for stream in streams:
            await stream.__anext__()
        assert runtime.ongoing == 2
        await asyncio.wait_for(streams[0].aclose(), 10)
        assert runtime.ongoing == 1
        await asyncio.wait_for(streams[1].aclose(), 10)
        assert runtime.ongoing == 0
        # a request refused before it runs is not left counted
        [bad] = [
            r async for r in runtime.infer_stream(request("until_cancelled", WRONG=np.array([1], np.int32)))
        ]
        assert bad.error is not None and runtime.ongoing == 0
    finally:
        await runtime.close()


# Decoupled, dynamically batched: each request of a batch answered from a thread with the batch's size
# and its index in the batch; the first request of every batch gets an error instead.
BATCH_REPORT_PY = """
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for index, request in enumerate(requests):
            threading.Thread(target=self._answer, args=(request.get_response_sender(), index, len(requests))).start()
        return None

    def _answer(self, sender, index, size):
        if index == 0:
            error = pb_utils.TritonError("the first of the batch fails")
            sender.send(pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        out = pb_utils.Tensor("SEEN", np.array([[index, size]], np.int32))
        sender.send(pb_utils.InferenceResponse([out]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


async def test_decoupled_requests_share_a_dynamic_batch_and_each_gets_its_own_answers(tmp_path: Path) -> None:
    """As in Triton, the dynamic batcher batches a decoupled model's requests: one ``execute`` for the
    batch, one response sender per request (before: each request ran alone, so each was the first)."""
    model = _written_model(
        tmp_path,
        "batch_report",
        BATCH_REPORT_PY,
        [spec("IN", "INT32", [1])],
        [spec("SEEN", "INT32", [2])],
        max_batch_size=8,
        decoupled=True,
        dynamic_batching=DynamicBatching(preferred_batch_size=(3,), max_queue_delay_microseconds=2_000_000),
    )
    runtime = await _runtime(model)
    try:

        async def stream(value: int) -> list:
            req = request("batch_report", IN=np.array([[value]], np.int32))
            return [r async for r in runtime.infer_stream(req)]

        answers = await asyncio.gather(*(stream(v) for v in range(3)))
        errors = [a for a in answers if a[0].error is not None]
        assert len(errors) == 1 and "the first of the batch fails" in errors[0][0].error.message
        seen = sorted(tuple(a[0].outputs["SEEN"][0]) for a in answers if a[0].error is None)
        assert seen == [(1, 3), (2, 3)]  # one batch of three
        assert all(a[-1].final for a in answers)
        # the batch is counted when ``execute`` returns, which may follow the answers
        await _until(lambda: runtime.statistics()[0]["execution_count"] > 0)
        stats = runtime.statistics()[0]
        assert stats["execution_count"] == 1 and stats["inference_count"] == 3
        assert stats["inference_stats"]["success"]["count"] == 2
        assert stats["inference_stats"]["fail"]["count"] == 1
    finally:
        await runtime.close()


async def _until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Until ``condition()`` holds (other tasks and threads run meanwhile); fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.01)
