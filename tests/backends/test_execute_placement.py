"""Where a sync ``execute`` runs: inline on the loop while calls are short, in the worker thread otherwise."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from deployments.backends.python import EXECUTE_MODE_PARAMETER, ExecutePlacement, PythonBackend
from deployments.backends.registry import create_backend
from repository_loader.errors import Unavailable
from tests.backends.helpers import context, describe, python_backend, request, spec
from tests.backends.test_python import LocalExecutor, _add_sub

MODELS = Path(__file__).parent / "python_models"


def _where(**parameters: str) -> PythonBackend:
    backend: PythonBackend = python_backend(
        "where",
        MODELS / "where",
        [spec("IN", "INT32", [1])],
        [spec("THREAD", "BYTES", [1])],
        parameters=parameters,
    )
    return backend


async def _threads(backend: PythonBackend, calls: int) -> list[str]:
    names = []
    for _ in range(calls):
        (response,) = await backend.execute([request(backend.model.name, IN=np.array([1], np.int32))])
        assert response.error is None, response.error
        names.append(response.outputs["THREAD"][0].decode())
    return names


def test_auto_goes_inline_after_short_calls_and_back_when_they_grow() -> None:
    placement = ExecutePlacement("auto", eligible=True, inline_below_s=0.001, thread_above_s=0.004)
    for _ in range(ExecutePlacement.SAMPLES_BEFORE_INLINE - 1):
        placement.record(0.0001)
        assert not placement.inline  # not enough evidence yet
    placement.record(0.0001)
    assert placement.inline
    placement.record(0.003)  # one slow call moves the average, not past the upper bound
    assert placement.inline
    for _ in range(10):
        placement.record(0.02)
    assert not placement.inline
    for _ in range(30):
        placement.record(0.0001)
    assert placement.inline


def test_fixed_modes_and_ineligible_models() -> None:
    assert ExecutePlacement("inline", eligible=True).inline
    thread = ExecutePlacement("thread", eligible=True)
    for _ in range(10):
        thread.record(0.00001)
    assert not thread.inline
    ineligible = ExecutePlacement("inline", eligible=False)
    assert ineligible.mode == "thread" and not ineligible.inline
    with pytest.raises(ValueError, match="EXECUTE_MODE"):
        ExecutePlacement("fast", eligible=True)


async def test_trivial_model_runs_on_the_loop_thread() -> None:
    backend = _where()
    names = await _threads(backend, 8)
    loop_thread = threading.current_thread().name
    assert names[0].startswith("python-model-where")  # measured in the worker thread first
    assert names[-1] == loop_thread
    backend.unload()


async def test_slow_model_stays_in_the_worker_thread() -> None:
    backend = _where(SLEEP_MS="5")
    names = await _threads(backend, 6)
    assert all(n.startswith("python-model-where") for n in names)
    backend.unload()


async def test_thread_mode_parameter_keeps_every_call_off_the_loop() -> None:
    backend = _where(**{EXECUTE_MODE_PARAMETER: "thread"})
    names = await _threads(backend, 8)
    assert all(n.startswith("python-model-where") for n in names)
    backend.unload()


def test_unknown_mode_is_a_load_error_naming_the_parameter() -> None:
    with pytest.raises(Unavailable, match="EXECUTE_MODE"):
        _where(**{EXECUTE_MODE_PARAMETER: "fast"})


async def test_sync_bls_hidden_in_a_helper_moves_the_model_to_its_thread() -> None:
    """Forced inline, a sync exec() on the loop thread re-runs that batch in the worker thread, once."""
    executor = LocalExecutor()
    executor.backends["add_sub"] = _add_sub(executor)
    model = describe(
        "hidden_bls",
        MODELS / "hidden_bls",
        "python",
        [spec("INPUT0", "FP32", [4]), spec("INPUT1", "FP32", [4])],
        [spec("OUTPUT0", "FP32", [4]), spec("THREAD", "BYTES", [1])],
        max_batch_size=8,
        parameters={EXECUTE_MODE_PARAMETER: "inline"},
    )
    backend = create_backend(context(model, executor))
    assert isinstance(backend, PythonBackend)
    backend.load()
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    for _ in range(2):
        (response,) = await backend.execute([request("hidden_bls", INPUT0=x, INPUT1=x)])
        assert response.error is None, response.error
        np.testing.assert_allclose(response.outputs["OUTPUT0"], 2 * x)
        assert response.outputs["THREAD"][0].decode().startswith("python-model-hidden_bls")
    assert len(executor.calls) == 2  # the BLS call ran once per request: the inline attempt stopped before it
    assert backend.placement.mode == "thread"
    backend.unload()


def test_models_doing_bls_in_model_py_are_never_inline() -> None:
    executor = LocalExecutor()
    model = describe(
        "bls",
        MODELS / "bls",
        "python",
        [spec("INPUT0", "FP32", [4]), spec("INPUT1", "FP32", [4])],
        [spec("OUTPUT0", "FP32", [4]), spec("OUTPUT1", "FP32", [4])],
        max_batch_size=8,
        parameters={"MODEL_NAME": "add_sub", EXECUTE_MODE_PARAMETER: "inline"},
    )
    backend = create_backend(context(model, executor))
    assert isinstance(backend, PythonBackend)
    backend.load()
    assert backend.placement.mode == "thread" and not backend.placement.inline
    backend.unload()
