"""``/generate`` and ``/generate_stream`` over HTTP with a decoupled model, under uvicorn: Triton's
mapping of fields to input shapes, its error texts, and which errors are JSON and which are events."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import numpy as np
import pytest
import requests

from deployments.inference import InferRequest, InferResponse
from deployments.protocol.http import ServerHTTPApp
from deployments.runtime.checks import ModelSchema
from repository_loader.errors import InternalError, InvalidArgument
from repository_loader.model import TensorSpec
from tests.protocol.fakes import FakeDataPlane, FakeModel, _description
from tests.protocol.test_end_to_end import BackgroundServer

LLM = dataclasses.replace(
    _description(
        "llm",
        (
            TensorSpec("PROMPT", "BYTES", (1, 1)),
            TensorSpec("STREAM", "BOOL", (1, 1)),
            TensorSpec("input_ids", "INT32", (1, -1), optional=True),
        ),
        (TensorSpec("TEXT", "BYTES", (1, -1)),),
    ),
    decoupled=True,
)


class LLMDataPlane(FakeDataPlane):
    """Serves ``llm``, a decoupled model that echoes PROMPT: once, or, with STREAM, ``REPETITION``
    times then a final response that is empty or (``FAIL_LAST``) an error."""

    def __init__(self) -> None:
        super().__init__([FakeModel(LLM, lambda inputs, version: {})])

    async def infer_stream(self, request: InferRequest) -> AsyncGenerator[InferResponse, None]:
        self.requests.append(request)
        try:
            ModelSchema.from_description(LLM).check_request(request)
        except InvalidArgument as error:
            yield InferResponse.failed(request, error)
            return
        params = request.parameters
        prompt = request.inputs["PROMPT"]
        text = np.empty((1, 0), dtype=object) if params.get("OUTPUT_0_DIM") else prompt
        if not request.inputs["STREAM"].reshape(-1)[0]:
            yield InferResponse(outputs={"TEXT": text}, model_name="llm", model_version="1")
            return
        for _ in range(params.get("REPETITION", 1)):
            yield InferResponse(outputs={"TEXT": text}, model_name="llm", model_version="1", final=False)
        if params.get("FAIL_LAST"):
            yield InferResponse(error=InternalError("An Error Occurred"))
        else:
            yield InferResponse(model_name="llm", model_version="1")


@pytest.fixture(scope="module")
def dataplane() -> LLMDataPlane:
    return LLMDataPlane()


@pytest.fixture(scope="module")
def server(dataplane) -> Iterator[BackgroundServer]:
    with BackgroundServer(ServerHTTPApp(dataplane)) as running:
        yield running


def post(server: BackgroundServer, route: str, body: Any) -> requests.Response:
    data = body if isinstance(body, str) else json.dumps(body)
    return requests.post(f"http://{server.url}/v2/models/llm/{route}", data=data, timeout=20)


def events(reply: requests.Response) -> list[dict[str, Any]]:
    assert reply.headers["Content-Type"] == "text/event-stream; charset=utf-8"
    chunks = reply.content.split(b"\n\n")
    assert chunks[-1] == b""
    assert all(c.startswith(b"data: ") for c in chunks[:-1])
    return [json.loads(c[len(b"data: ") :]) for c in chunks[:-1]]


def test_fields_take_the_inputs_shapes(server, dataplane):
    reply = post(server, "generate", {"PROMPT": "hello world", "STREAM": False, "input_ids": [100, 200]})
    assert reply.status_code == 200, reply.text
    assert reply.headers["Content-Type"] == "application/json"
    assert reply.json() == {"model_name": "llm", "model_version": "1", "TEXT": "hello world"}
    inputs = dataplane.requests[-1].inputs
    assert {name: tensor.shape for name, tensor in inputs.items()} == {
        "PROMPT": (1, 1),
        "STREAM": (1, 1),
        "input_ids": (1, 2),
    }
    assert inputs["input_ids"].dtype == np.int32 and inputs["STREAM"].dtype == np.bool_


def test_the_request_id_comes_back(server, dataplane):
    reply = post(server, "generate", {"PROMPT": "hi", "id": "42", "STREAM": False})
    assert reply.json()["id"] == "42" and dataplane.requests[-1].id == "42"
    for body in ({"PROMPT": "hi", "STREAM": False}, {"PROMPT": "hi", "id": "", "STREAM": False}):
        assert "id" not in post(server, "generate", body).json()


def test_a_stream_sends_one_event_per_response(server):
    for body in (
        {"PROMPT": ["hello"], "STREAM": True, "REPETITION": 3},
        {"PROMPT": ["hello"], "STREAM": True, "parameters": {"REPETITION": 3}},
    ):
        reply = post(server, "generate_stream", body)
        assert reply.status_code == 200
        assert [e["TEXT"] for e in events(reply)] == ["hello"] * 3


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "expected number of inputs between 2 and 3 but got 0"),
        ({"abc": 123}, "expected number of inputs between 2 and 3 but got 0"),
        ({"PROMPT": "hello"}, "expected number of inputs between 2 and 3 but got 1"),
        ({"STREAM": False, "other": "param"}, "expected number of inputs between 2 and 3 but got 1"),
        ({"PROMPT": 123, "STREAM": False}, "attempt to access JSON non-string as string"),
        ({"PROMPT": "hello", "STREAM": "false"}, "attempt to access JSON non-boolean as boolean"),
        ({"PROMPT": True, "STREAM": 123}, "attempt to access JSON non-string as string"),
        ({"STREAM": 123, "PROMPT": True}, "attempt to access JSON non-boolean as boolean"),
        ({"PROMPT": {"USER": "a"}, "STREAM": True}, "attempt to access JSON non-string as string"),
        ({"PROMPT": "a", "STREAM": True, "input_ids": ["x"]}, "non-signed-integer as signed-integer"),
        ('{"PROMPT": "a", "STREAM": false, "PROMPT": "b"}', "input 'PROMPT' already exists in request"),
        (
            '{"PROMPT": "a", "STREAM": false, "STREAM": true, "PROMPT": "b"}',
            "input 'STREAM' already exists in request",
        ),
        (
            {"PROMPT": "a", "STREAM": True, "PARAMS": {"P": 0}},
            "parameter 'PARAMS' has invalid type. It should be either 'int', 'bool', or 'string'.",
        ),
        ({"PROMPT": "a", "STREAM": True, "parameters": 1}, "Expected JSON object for keyword: 'parameters'"),
        (
            {"PROMPT": "a", "STREAM": True, "parameters": {"nested": {"twice": 1}}},
            "Converting keyword: 'parameters': parameter 'nested' has invalid type.",
        ),
        ({"PROMPT": "a", "STREAM": True, "id": 3}, "Unable to parse 'id'"),
        ("not json", "failed to parse the request JSON buffer: Invalid value. at 0"),
    ],
)
def test_refused_requests_are_json_on_both_routes(server, body, message):
    for route in ("generate", "generate_stream"):
        reply = post(server, route, body)
        assert reply.status_code == 400, (route, reply.text)
        assert reply.headers["Content-Type"] == "application/json"
        assert message in reply.json()["error"], route


def test_a_first_response_that_fails_is_an_event_under_its_status(server):
    reply = post(
        server, "generate_stream", {"PROMPT": ["hi"], "STREAM": True, "REPETITION": 0, "FAIL_LAST": True}
    )
    assert reply.status_code == 500
    assert events(reply) == [{"error": "An Error Occurred"}]
    reply = post(
        server, "generate_stream", {"PROMPT": ["hi"], "STREAM": True, "REPETITION": 1, "FAIL_LAST": True}
    )
    assert reply.status_code == 200
    assert events(reply) == [
        {"model_name": "llm", "model_version": "1", "TEXT": "hi"},
        {"error": "An Error Occurred"},
    ]


@pytest.mark.parametrize("repetition", [0, 2])
def test_generate_wants_exactly_one_response(server, repetition):
    body = {"PROMPT": "hi", "STREAM": True, "REPETITION": repetition}
    assert post(server, "generate_stream", body).status_code == 200
    reply = post(server, "generate", body)
    assert reply.headers["Content-Type"] == "application/json"
    assert "generate expects model to produce exactly 1 response" in reply.json()["error"]


def test_one_response_either_way(server):
    for stream in (True, False):
        body = {"PROMPT": "hi", "STREAM": stream}
        assert post(server, "generate", body).status_code == 200
        assert post(server, "generate_stream", body).status_code == 200


def test_an_output_with_no_elements_is_an_empty_list(server):
    reply = post(server, "generate", {"PROMPT": "hi", "STREAM": False, "OUTPUT_0_DIM": True})
    assert reply.json()["TEXT"] == []


def test_a_compressed_body_is_refused(server):
    reply = requests.post(
        f"http://{server.url}/v2/models/llm/generate",
        data=b"x",
        headers={"Content-Encoding": "gzip"},
        timeout=20,
    )
    assert reply.status_code == 400
    assert reply.json()["error"] == "Unsupported content-encoding, only 'identity' is supported."
