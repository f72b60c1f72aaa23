"""A request whose caller goes away (a cancelled gRPC call) is cancelled, as Triton cancels it.

A running Python model sees ``request.is_cancelled()``; the model's instance stays busy until its
``execute`` really returns, so a cancelled request never lets a second ``execute`` overlap the first.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from deployments.runtime.model import ModelRuntime
from repository_loader.model import DynamicBatching
from tests.backends.helpers import describe, request, spec

# Runs up to DELAY seconds, checking every 10 ms whether its request was cancelled (after its GRACE
# parameter's seconds); logs what it did (one line per event) to the file named by its LOG parameter.
CANCELLABLE_PY = """
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        self.log = parameters["LOG"]["string_value"]
        self.grace = float(parameters["GRACE"]["string_value"])

    def _note(self, text):
        with open(self.log, "a") as f:
            f.write(text + "\\n")

    def execute(self, requests):
        responses = []
        for request in requests:
            delay = float(pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy().reshape(-1)[0])
            self._note("start")
            begun = time.monotonic()
            end = begun + delay
            error = None
            while time.monotonic() < end:
                if time.monotonic() - begun >= self.grace and request.is_cancelled():
                    error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
                    break
                time.sleep(0.01)
            self._note("cancelled" if error else "finished")
            out = pb_utils.Tensor("Y", np.array([delay], dtype=np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out], error=error))
        return responses
""".replace("import json", "import json\nimport numpy as np")


async def _runtime(tmp_path: Path, batched: bool, grace_s: float = 0.0) -> tuple[ModelRuntime, Path]:
    folder = tmp_path / "cancellable"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(CANCELLABLE_PY)
    log = tmp_path / "events.log"
    log.write_text("")
    model = describe(
        "cancellable",
        folder,
        "python",
        [spec("DELAY", "FP32", [1])],
        [spec("Y", "FP32", [1])],
        parameters={"LOG": str(log), "GRACE": str(grace_s)},
        **({"max_batch_size": 4, "dynamic_batching": DynamicBatching()} if batched else {}),
    )
    runtime = ModelRuntime(model)
    await runtime.load()
    return runtime, log


def _delay(seconds: float, batched: bool) -> np.ndarray:
    return np.array([[seconds]] if batched else [seconds], dtype=np.float32)


async def _events(log: Path, count: int, within_s: float = 5.0) -> list[str]:
    """The model's first ``count`` events, waiting up to ``within_s`` for them."""
    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        events = log.read_text().split()
        if len(events) >= count or asyncio.get_running_loop().time() > deadline:
            return events
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("batched", [False, True], ids=["one at a time", "dynamic batcher"])
async def test_a_running_model_sees_its_request_cancelled_when_the_caller_leaves(
    tmp_path: Path, batched: bool
) -> None:
    runtime, log = await _runtime(tmp_path, batched)
    try:
        call = asyncio.ensure_future(runtime.infer(request("cancellable", DELAY=_delay(10.0, batched))))
        assert await _events(log, 1) == ["start"]
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        # the model stops within its 10 ms poll, not after its 10 s
        assert await _events(log, 2, within_s=2.0) == ["start", "cancelled"]
        # and the instance is free again: a next request runs to its end
        answer = await runtime.infer(request("cancellable", DELAY=_delay(0.05, batched)))
        assert answer.error is None
        assert float(np.asarray(answer.outputs["Y"]).reshape(-1)[0]) == pytest.approx(0.05)
        assert await _events(log, 4) == ["start", "cancelled", "start", "finished"]
        # counted as Triton counts it: nv_inference_request_failure{reason="CANCELED"}
        assert runtime.versions[1].failures == {"CANCELED": 1}
    finally:
        await runtime.close()


async def test_a_request_not_cancelled_is_not_seen_as_cancelled(tmp_path: Path) -> None:
    runtime, log = await _runtime(tmp_path, batched=False)
    try:
        answer = await runtime.infer(request("cancellable", DELAY=_delay(0.1, False)))
        assert answer.error is None and await _events(log, 2) == ["start", "finished"]
    finally:
        await runtime.close()


async def test_a_request_after_a_cancel_runs_once_the_cancelled_execute_returns(tmp_path: Path) -> None:
    """The model looks at cancellation only after 0.3 s here: a request sent right after the cancel
    runs after it, never beside it (the instance is busy until ``execute`` returns; the Python
    backend's one worker thread per instance keeps that order too)."""
    runtime, log = await _runtime(tmp_path, batched=False, grace_s=0.3)
    try:
        first = asyncio.ensure_future(runtime.infer(request("cancellable", DELAY=_delay(10.0, False))))
        assert await _events(log, 1) == ["start"]
        first.cancel()
        second = asyncio.ensure_future(runtime.infer(request("cancellable", DELAY=_delay(0.05, False))))
        with pytest.raises(asyncio.CancelledError):
            await first
        assert (await second).error is None
        assert await _events(log, 4) == ["start", "cancelled", "start", "finished"]
    finally:
        await runtime.close()
