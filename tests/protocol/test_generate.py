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


SHAPED = _description(
    "shaped",
    (
        TensorSpec("rows", "FP32", (4,)),
        TensorSpec("free", "INT8", (-1, -1)),
        TensorSpec("half", "FP16", (1,)),
        TensorSpec("count", "UINT8", (1,)),
    ),
    (TensorSpec("y", "FP32", (4,)),),
    max_batch_size=8,
)


def test_fixed_dimensions_divide_the_elements_and_the_innermost_variable_one_takes_the_rest() -> None:
    request = decode_generate_request(b'{"rows": [1, 2, 3, 4, 5, 6, 7, 8], "free": [1, 2, 3]}', SHAPED, "")
    assert request.inputs["rows"].shape == (2, 4)  # the batch dimension takes what is left
    assert request.inputs["free"].shape == (1, 1, 3)
    assert request.inputs["free"].dtype == np.int8


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"rows": [1, 2, 3]}', "The schema can not convert input 'rows' to tensor with proper shape"),
        (b'{"half": 1.5}', "receiving FP16 data via JSON is not supported"),
        (b'{"count": -1}', "attempt to access JSON non-unsigned-integer as unsigned-integer"),
        (b'{"rows": [[1], [2], [3], [4]]}', "Shape does not match true shape of 'data' field"),
        (b'{"rows": [1, 2, 3, "4"]}', "attempt to access JSON non-number as double"),
        (b"[1]", "attempt to get members for non-object"),
        (b'{"parameters": {"rows": 1}}', "Converting keyword: 'parameters': The schema can not convert"),
    ],
)
def test_fields_that_do_not_map_are_refused_in_tritons_words(body: bytes, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        decode_generate_request(body, SHAPED, "")


def test_parameters_keep_their_json_types() -> None:
    body = b'{"a": 1, "b": 1.5, "c": true, "d": "x", "huge": 18446744073709551615, "id": "7"}'
    request = decode_generate_request(body, SHAPED, "")
    assert request.parameters == {
        "a": 1,
        "b": 1.5,
        "c": True,
        "d": "x",
        "huge": 1.8446744073709552e19,
        "id": "7",
    }
    assert request.id == "7"


def test_the_response_carries_the_id_and_its_parameters() -> None:
    response = InferResponse(
        outputs={"y": np.array([1.0], np.float32)},
        parameters={"tokens": 3, "list": [1]},
        model_name="m",
        model_version="1",
        id="abc",
    )
    assert generate_document(response) == {
        "model_name": "m",
        "model_version": "1",
        "id": "abc",
        "tokens": 3,
        "y": 1.0,
    }
