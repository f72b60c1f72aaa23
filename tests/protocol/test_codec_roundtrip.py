"""The server as a client of its own replicas: a request encoded by ``encode_infer_request`` decodes to
the same request, and a response encoded by the HTTP front end decodes back to the same outputs."""

from __future__ import annotations

import numpy as np
import pytest

from deployments.inference import InferRequest, InferResponse, RequestedOutput
from deployments.protocol.codec import (
    decode_infer_request,
    decode_infer_response,
    encode_infer_request,
    encode_infer_response,
)
from repository_loader.errors import (
    ExecutionTimeout,
    InternalError,
    InvalidArgument,
    NotFound,
    TooBusy,
    TooLarge,
    Unavailable,
    UnknownError,
    error_for_http_status,
)

TENSORS = {
    "F": np.arange(6, dtype=np.float32).reshape(2, 3),
    "I": np.array([[1, -2]], dtype=np.int64),
    "B": np.array([[True, False]]),
    "S": np.array([[b"ab", "\u00e9".encode(), b""]], dtype=object),
}


def test_a_request_encodes_to_what_the_front_end_decodes() -> None:
    request = InferRequest(
        "m",
        dict(TENSORS),
        model_version="2",
        id="r1",
        requested_outputs=[RequestedOutput("OUT", class_count=3)],
        parameters={"custom": "x", "n": 3},
        correlation_id="seq-7",
        sequence_start=True,
        priority=2,
        timeout_us=5000,
    )
    body, length = encode_infer_request(request)
    decoded, binary_output = decode_infer_request(body, length, "m", "2")
    assert binary_output is True
    assert (decoded.id, decoded.parameters, decoded.correlation_id) == (
        "r1",
        {"custom": "x", "n": 3},
        "seq-7",
    )
    assert (decoded.sequence_start, decoded.sequence_end, decoded.priority, decoded.timeout_us) == (
        True,
        False,
        2,
        5000,
    )
    # classification stays with the caller: the replica is asked for the raw output, binary
    assert [(o.name, o.binary, o.class_count) for o in decoded.requested_outputs or []] == [("OUT", True, 0)]
    for name, tensor in TENSORS.items():
        assert decoded.inputs[name].dtype == tensor.dtype and np.array_equal(decoded.inputs[name], tensor), (
            name
        )


def test_a_request_without_sequence_or_outputs_stays_plain() -> None:
    body, length = encode_infer_request(InferRequest("m", {"F": TENSORS["F"]}))
    decoded, _ = decode_infer_request(body, length, "m")
    assert decoded.requested_outputs is None and decoded.correlation_id == 0 and decoded.parameters == {}


@pytest.mark.parametrize("binary", [True, False])
def test_a_response_decodes_to_its_outputs_writable(binary: bool) -> None:
    response = InferResponse(dict(TENSORS), model_name="m", model_version="1", id="r", parameters={"k": 1})
    body, length = encode_infer_response(response, None, binary_output=binary)
    back = decode_infer_response(200, body, length)
    assert (back.model_name, back.model_version, back.id, back.parameters) == ("m", "1", "r", {"k": 1})
    for name, tensor in TENSORS.items():
        assert np.array_equal(back.outputs[name], tensor), name
    assert back.outputs["F"].flags.writeable


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, InvalidArgument),
        (404, NotFound),
        (503, Unavailable),
        (413, TooLarge),
        (429, TooBusy),
        (504, ExecutionTimeout),
        (502, UnknownError),
    ],
)
def test_an_error_answer_is_the_error_its_status_stands_for(status: int, cls: type) -> None:
    back = decode_infer_response(status, b'{"error":"it broke"}', None)
    assert type(back.error) is cls and back.error.message == "it broke" and back.outputs == {}
    assert type(error_for_http_status(status, "x")) is cls


@pytest.mark.parametrize(
    ("code", "cls"), [("INTERNAL", InternalError), ("UNKNOWN", UnknownError), (None, InternalError)]
)
def test_the_error_code_header_tells_apart_what_one_status_stands_for(code: str | None, cls: type) -> None:
    back = decode_infer_response(500, b'{"error":"x"}', None, code)
    assert type(back.error) is cls


def test_an_answer_that_is_not_json_is_an_error_of_its_status() -> None:
    back = decode_infer_response(502, b"<html>bad gateway</html>", None)
    assert type(back.error) is UnknownError and "not an inference response" in back.error.message
    with pytest.raises(InternalError, match="answered 200"):
        decode_infer_response(200, b"<html>", None)
