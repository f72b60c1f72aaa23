"""The Python backend keeps Triton's rules for what ``execute`` returns and what a response sender sends.

Triton's ``L0_backend_python`` response_sender and decoupled suites check these
behaviours and error texts; here the same situations run through the backend
without a server.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from deployments.backends.python import PythonBackend
from deployments.backends.python_api.errors import TritonModelException
from deployments.backends.python_api.request import InferenceRequest
from deployments.backends.python_api.response_sender import (
    FINAL_BEFORE_RESPONSE,
    MORE_THAN_ONE,
    RESPONSE_REQUIRED,
    SENDER_CLOSED,
    UNSUPPORTED_FLAG,
    ResponseChannel,
)
from deployments.backends.registry import create_backend
from deployments.inference import InferResponse
from repository_loader.errors import ErrorCode, ServerError
from repository_loader.model import InstanceGroup, InstanceKind, SequenceBatching
from tests.backends.helpers import context, describe, python_backend, request, spec

MODELS = Path(__file__).parent / "python_models"
FAILED = "Failed to process the request(s) for model '{name}_0_0', message: "


def _backend(name: str, decoupled: bool) -> PythonBackend:
    backend: PythonBackend = python_backend(
        name,
        MODELS / "sender_rules",
        [spec("PLAN", "INT32", [6])],
        [spec("OUT", "INT32", [1])],
        decoupled=decoupled,
    )
    run = backend._run

    async def run_then_release(  # the model's thread sends once this is done
        pb_requests: list[InferenceRequest], channels: list[ResponseChannel]
    ) -> None:
        try:
            await run(pb_requests, channels)
        finally:
            backend._instance.delivered.set()

    backend._run = run_then_release  # type: ignore[method-assign]
    return backend


def _plan(pre=0, final_pre=0, answer=0, post=0, final_post=0, shape=0):
    return request("m", PLAN=np.array([pre, final_pre, answer, post, final_post, shape], np.int32))


def _values(responses: list[InferResponse]) -> list[int]:
    assert all(r.error is None for r in responses), [r.error for r in responses]
    return [int(r.outputs["OUT"][0]) for r in responses if r.outputs]


async def _stream(backend: PythonBackend, **plan: int) -> list[InferResponse]:
    responses = [r async for r in backend.stream(_plan(**plan))]
    await asyncio.to_thread(backend._instance.join)
    return responses


async def _infer(backend: PythonBackend, *plans: dict[str, int]) -> list[InferResponse]:
    responses = await backend.execute([_plan(**plan) for plan in plans])
    await asyncio.to_thread(backend._instance.join)
    return responses


# --- decoupled ------------------------------------------------------------------------------


async def test_decoupled_model_returning_a_response_fails_with_triton_text(caplog) -> None:
    backend = _backend("dec", decoupled=True)
    expected = FAILED.format(name="dec") + (
        "Python model 'dec_0_0' is using the decoupled mode and the execute function must return None."
    )
    with caplog.at_level(logging.ERROR, logger="deployments.backends.python"):
        (only,) = await _stream(backend, answer=1)
    assert only.final and only.error is not None
    assert only.error.code == ErrorCode.INTERNAL and only.error.message == expected
    assert expected in caplog.text


async def test_decoupled_error_after_final_reaches_only_the_log(caplog) -> None:
    backend = _backend("dec", decoupled=True)
    with caplog.at_level(logging.ERROR, logger="deployments.backends.python"):
        responses = await _stream(backend, pre=1, final_pre=1, answer=1)
    assert _values(responses) == [100]
    assert "must return None" in caplog.text


async def test_decoupled_send_after_the_error_is_refused() -> None:
    backend = _backend("dec", decoupled=True)
    (only,) = await _stream(backend, answer=1, post=1, final_post=1)
    assert only.error is not None and "must return None" in only.error.message
    assert backend._instance.refusals == [SENDER_CLOSED]


async def test_decoupled_responses_before_and_after_return() -> None:
    backend = _backend("dec", decoupled=True)
    responses = await _stream(backend, pre=1, post=3, final_post=1)
    assert _values(responses) == [100, 200, 201, 202]
    assert responses[-1].final and not any(r.final for r in responses[:-1])


async def test_decoupled_batch_answers_each_request_as_it_was_sent() -> None:
    backend = _backend("dec", decoupled=True)
    responses = await _infer(
        backend, {"final_pre": 1}, {"pre": 2, "final_pre": 1}, {"post": 1, "final_post": 1}
    )
    assert _values(responses) == [100, 101, 200]


async def test_send_after_final_raises_the_closed_sender_text() -> None:
    backend = _backend("dec", decoupled=True)
    await _stream(backend, pre=1, final_pre=1, post=1, final_post=0)
    assert backend._instance.refusals == [SENDER_CLOSED]


# --- non-decoupled --------------------------------------------------------------------------


async def test_non_decoupled_final_before_a_response_fails_with_triton_text() -> None:
    backend = _backend("nd", decoupled=False)
    (only,) = await _infer(backend, {"final_pre": 1})
    assert only.error is not None and only.error.code == ErrorCode.INTERNAL
    assert only.error.message.startswith(FAILED.format(name="nd"))
    assert FINAL_BEFORE_RESPONSE in only.error.message
    assert backend._instance.refusals == [FINAL_BEFORE_RESPONSE]


async def test_non_decoupled_first_response_is_the_answer() -> None:
    backend = _backend("nd", decoupled=False)
    # two sent: the first answers, the second is refused (its error goes only to the log)
    assert _values(await _infer(backend, {"pre": 2, "final_pre": 1})) == [100]
    assert backend._instance.refusals == [MORE_THAN_ONE]
    # sent, then one returned: the sent one answers
    assert _values(await _infer(backend, {"pre": 1, "final_pre": 1, "answer": 1})) == [100]
    # returned, then one sent later: the returned one answers, the later send is refused
    backend._instance.refusals.clear()
    assert _values(await _infer(backend, {"answer": 1, "post": 1, "final_post": 1})) == [0]
    assert backend._instance.refusals == [MORE_THAN_ONE]
    # none returned, one sent later: that one answers
    (late,) = await _infer(backend, {"post": 1, "final_post": 1})
    assert _values([late]) == [200] and late.final


async def test_non_decoupled_batch_mixing_returned_and_sent_answers() -> None:
    backend = _backend("nd", decoupled=False)
    responses = await _infer(backend, {"answer": 1}, {"pre": 1, "final_pre": 1}, {"post": 1, "final_post": 1})
    assert _values(responses) == [0, 100, 200]


@pytest.mark.parametrize(
    ("shape", "text"),
    [
        (1, "Expected a list in the execute return, found type '<class 'tuple'>'."),
        (
            2,
            "Expected an 'InferenceResponse' object in the execute function return list, found type '<class 'int'>'.",
        ),
    ],
)
async def test_non_decoupled_wrong_return_fails_the_batch(shape: int, text: str) -> None:
    backend = _backend("nd", decoupled=False)
    responses = await _infer(backend, {"answer": 1, "shape": shape}, {"answer": 1, "shape": shape})
    assert [r.error.message if r.error else None for r in responses] == [FAILED.format(name="nd") + text] * 2


async def test_sender_flag_and_argument_checks() -> None:
    channel = ResponseChannel(asyncio.get_running_loop())
    sender = InferenceRequest.from_server(_plan(), ["OUT"], channel).get_response_sender()
    with pytest.raises(TritonModelException) as unsupported:
        sender.send(flags=2)
    with pytest.raises(TritonModelException) as missing:
        sender.send()
    assert str(unsupported.value) == UNSUPPORTED_FLAG and str(missing.value) == RESPONSE_REQUIRED


async def test_instance_name_is_tritons() -> None:
    backend = _backend("named", decoupled=False)
    assert backend.initialize_args()["model_instance_name"] == "named_0_0"


async def test_an_instance_of_a_later_group_keeps_its_groups_name() -> None:
    groups = (InstanceGroup("first", InstanceKind.CPU, 1), InstanceGroup("second", InstanceKind.CPU, 2))
    model = replace(describe("g", MODELS / "sender_rules", "python", [], []), instance_groups=groups)
    for given, expected in (("second_1", "second_1"), ("first_0", "first_0"), ("replica-x", "first_0")):
        backend = create_backend(replace(context(model), instance_name=given))
        assert backend.initialize_args()["model_instance_name"] == expected


async def test_response_for_a_rescheduled_request_fails_with_triton_text() -> None:
    model = describe(
        "resched",
        MODELS / "reschedule_answer",
        "python",
        [spec("IN", "INT32", [1])],
        [spec("OUT", "INT32", [1])],
        sequence_batching=SequenceBatching(iterative=True),
    )
    backend = create_backend(context(model))
    backend.load()
    (only,) = await backend.execute([request("resched", IN=np.array([1], np.int32))])
    assert only.error is not None
    assert only.error.message.startswith(
        FAILED.format(name="resched")
        + "Expected a None object in the execute function return list for reschduled request, found type '<class '"
    )
    assert only.error.message.endswith("InferenceResponse'>'.")


def test_force_cpu_only_input_tensors_takes_yes_or_no() -> None:
    io = ([spec("X", "FP32", [3])], [spec("Y", "FP32", [3])])
    for value in ("yes", "no"):
        backend = python_backend(
            "dlpack_identity",
            MODELS / "dlpack_identity",
            *io,
            parameters={"FORCE_CPU_ONLY_INPUT_TENSORS": value},
        )
        assert backend._host_inputs is (value == "yes")
        backend.unload()
    model = describe(
        "dlpack_identity",
        MODELS / "dlpack_identity",
        "python",
        *io,
        parameters={"FORCE_CPU_ONLY_INPUT_TENSORS": "No"},
    )
    with pytest.raises(ServerError) as raised:
        create_backend(context(model)).load()
    assert raised.value.code == ErrorCode.UNSUPPORTED
    assert str(raised.value) == "Incorrect value for FORCE_CPU_ONLY_INPUT_TENSORS: No'"
