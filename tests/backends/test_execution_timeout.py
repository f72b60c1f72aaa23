"""A model's ``execution_timeout_ms`` holds however fast its code usually is: a sync ``execute`` with a
time limit never moves onto the event loop, where no timer could interrupt it (no Ray running)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np

from deployments.backends.python import PythonBackend
from deployments.inference import InferRequest
from tests.backends.helpers import infer_through_runtime, python_backend, spec

MODEL_PY = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if value[0] < 0:
                time.sleep(3.0)  # a hang, long past the model's limit
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
        return out
"""


def _backend(tmp_path: Path, parameters: dict[str, str]) -> PythonBackend:
    folder = tmp_path / "fast" / "1"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(MODEL_PY)
    backend: PythonBackend = python_backend(
        "fast",
        tmp_path / "fast",
        [spec("IN", "FP32", [1])],
        [spec("OUT", "FP32", [1])],
        parameters=parameters,
    )
    return backend


def _request(value: float) -> InferRequest:
    return InferRequest("fast", {"IN": np.array([value], np.float32)})


async def test_a_fast_model_without_a_limit_moves_onto_the_loop(tmp_path: Path) -> None:
    backend = _backend(tmp_path, {})
    for _ in range(50):
        await backend.execute([_request(1.0)])
    assert backend.placement.inline  # the optimisation this limit must turn off


async def test_a_fast_model_with_a_limit_stays_on_its_thread_and_times_out(tmp_path: Path) -> None:
    backend = _backend(tmp_path, {"execution_timeout_ms": "300"})
    for _ in range(50):
        assert (await infer_through_runtime(backend, [_request(1.0)]))[0].error is None
    assert not backend.placement.inline
    started = time.monotonic()
    hung = (await asyncio.wait_for(infer_through_runtime(backend, [_request(-1.0)]), 10.0))[0]
    assert time.monotonic() - started < 2.0  # the timer fired, not the 3 s sleep's end
    assert hung.error is not None and "execution_timeout_ms" in hung.error.message


async def test_an_explicit_inline_mode_yields_to_the_limit(tmp_path: Path) -> None:
    backend = _backend(tmp_path, {"execution_timeout_ms": "300", "EXECUTE_MODE": "inline"})
    assert not backend.placement.inline
