"""Decoupled models through the model runtime: every response in order, statistics, cancellation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from deployments.runtime.model import ModelRuntime
from repository_loader.model import ModelDescription
from tests.backends.helpers import describe, request, spec
from tests.serve.streaming_models import UNTIL_CANCELLED_PY

MODELS = Path(__file__).resolve().parent / "python_models"


async def _runtime(model: ModelDescription) -> ModelRuntime:
    runtime = ModelRuntime(model)
    await runtime.load()
    return runtime


async def _until_cancelled(tmp_path: Path) -> ModelRuntime:
    """The decoupled model that streams until its request is cancelled (it marks that in ``tmp_path``)."""
    folder = tmp_path / "until_cancelled"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(UNTIL_CANCELLED_PY)
    model = describe(
        "until_cancelled",
        folder,
        "python",
        [spec("X", "INT32", [1])],
        [spec("Y", "INT32", [1])],
        decoupled=True,
        parameters={"MARKER_DIR": str(tmp_path)},
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
    finally:
        await runtime.close()


async def test_closing_the_stream_cancels_the_request(tmp_path: Path) -> None:
    runtime = await _until_cancelled(tmp_path)
    try:
        stream = runtime.infer_stream(request("until_cancelled", X=np.array([9], np.int32)))
        seen = [await stream.__anext__() for _ in range(3)]
        assert [int(r.outputs["Y"][0]) for r in seen] == [0, 1, 2]
        await asyncio.wait_for(stream.aclose(), 10)
        for _ in range(200):  # the model's thread looks every 10 ms
            if (tmp_path / "9.cancelled").exists():
                break
            await asyncio.sleep(0.01)
        assert (tmp_path / "9.cancelled").exists()
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
