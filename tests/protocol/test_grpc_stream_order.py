"""A stream's requests of one sequence reach the model in the order they were sent, even where each
travels on its own (to the replica owning the sequence) and a later one would get there first;
requests of different sequences, and without one, still run side by side."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import numpy as np

from deployments.inference import InferRequest, InferResponse
from deployments.protocol.grpc import GRPCInferenceServicer
from deployments.protocol.proto import grpc_service_pb2 as pb
from tests.protocol.grpc_fakes import StreamingFakeDataPlane


class ForwardingCalls:
    """Stands in for the inference calls: each request reaches "the owner" after a delay of its own
    (the first step of each sequence the slowest), where its arrival is recorded."""

    def __init__(self) -> None:
        self.arrived: list[tuple[Any, int]] = []
        self.inside = self.most_inside = 0

    async def schema(self, name: str, version: str) -> tuple[Any, None]:
        return SimpleNamespace(decoupled=False), None

    async def infer_one(self, request: InferRequest, description: Any) -> InferResponse:
        step = int(np.asarray(request.inputs["STEP"]).reshape(-1)[0])
        self.inside += 1
        self.most_inside = max(self.most_inside, self.inside)
        await asyncio.sleep(0.2 if step == 0 else 0.01)  # on the way to the owner
        self.inside -= 1
        self.arrived.append((request.correlation_id, step))
        return InferResponse(outputs={"STEP": np.array([step], np.int32)}, model_name=request.model_name)


def _message(sequence: int | str, step: int) -> Any:
    message = pb.ModelInferRequest(model_name="seq")
    message.inputs.add(name="STEP", datatype="INT32", shape=[1])
    message.raw_input_contents.append(np.array([step], np.int32).tobytes())
    if isinstance(sequence, str):
        message.parameters["sequence_id"].string_param = sequence
    elif sequence:
        message.parameters["sequence_id"].int64_param = sequence
    return message


async def _run(messages: list[Any]) -> tuple[ForwardingCalls, int]:
    servicer = GRPCInferenceServicer(StreamingFakeDataPlane([]))
    calls = ForwardingCalls()
    servicer.calls = calls  # type: ignore[assignment]

    async def requests() -> AsyncIterator[Any]:
        for message in messages:
            yield message

    context = SimpleNamespace(invocation_metadata=lambda: ())
    answers = [a async for a in servicer.ModelStreamInfer(requests(), context)]
    return calls, len(answers)


async def test_a_sequences_requests_arrive_in_order_and_sequences_run_side_by_side() -> None:
    messages = [_message(seq, step) for step in range(3) for seq in (7, "s")]
    calls, answered = await _run(messages)
    assert answered == 6
    for seq in (7, "s"):
        assert [step for s, step in calls.arrived if s == seq] == [0, 1, 2]
    assert calls.most_inside == 2  # one request of each sequence at a time, both sequences at once


async def test_requests_without_a_sequence_are_not_held_back() -> None:
    calls, answered = await _run([_message(0, 0), _message(0, 1), _message(0, 2)])
    assert answered == 3 and [step for _, step in calls.arrived] == [1, 2, 0]  # as they got there
    assert calls.most_inside == 3
