"""Triton's generate extension: JSON fields to input tensors and outputs back to JSON fields."""

from __future__ import annotations

import json

import numpy as np
import pytest

from deployments.inference import InferResponse
from deployments.protocol.generate import decode_generate_request, generate_document, sse_event
from repository_loader.errors import InvalidArgument
from repository_loader.model import TensorSpec
from tests.protocol.fakes import _description

TEXT = _description(
    "llm",
    (
        TensorSpec("text_input", "BYTES", (1,)),
        TensorSpec("max_tokens", "INT32", (1,)),
        TensorSpec("stop", "BOOL", (1,)),
        TensorSpec("bias", "FP32", (-1,)),
    ),
    (TensorSpec("text_output", "BYTES", (1,)),),
)
BATCHED = _description("b", (TensorSpec("x", "FP32", (2,)),), (TensorSpec("y", "FP32", (2,)),), 8)


def test_fields_named_as_inputs_become_tensors_and_the_rest_parameters() -> None:
    body = {
        "text_input": "hello",
        "max_tokens": 3,
        "stop": True,
        "bias": [0.5, 1],
        "temperature": 0.2,
        "parameters": {"stream": False},
    }
    request = decode_generate_request(json.dumps(body).encode(), TEXT, "1")
    assert (request.model_name, request.model_version) == ("llm", "1")
    assert request.inputs["text_input"].tolist() == [b"hello"]
    assert request.inputs["max_tokens"].dtype == np.int32 and request.inputs["max_tokens"].tolist() == [3]
    assert request.inputs["stop"].dtype == np.bool_
    assert request.inputs["bias"].dtype == np.float32 and request.inputs["bias"].shape == (2,)
    assert request.parameters == {"stream": False, "temperature": 0.2}


def test_a_batching_model_gets_a_batch_of_one() -> None:
    request = decode_generate_request(b'{"x": [1, 2]}', BATCHED, "")
    assert request.inputs["x"].shape == (1, 2)


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[1]", b'{"parameters": 3}', b'{"max_tokens": "many"}', b'{"other": {"a": 1}}'],
)
def test_bad_bodies_are_invalid_arguments(body: bytes) -> None:
    with pytest.raises(InvalidArgument):
        decode_generate_request(body, TEXT, "")


def test_outputs_become_fields() -> None:
    response = InferResponse(
        outputs={
            "text_output": np.array([b"w\xc3\xb6rd"], dtype=np.object_),
            "index": np.array([[4]], dtype=np.int32),
            "scores": np.array([0.5, 0.25], dtype=np.float32),
        },
        model_name="llm",
        model_version="1",
    )
    document = generate_document(response)
    assert document == {
        "model_name": "llm",
        "model_version": "1",
        "text_output": "wörd",
        "index": 4,
        "scores": [0.5, 0.25],
    }
    assert sse_event({"a": 1}) == b'data: {"a":1}\n\n'
