"""Large gRPC inference messages with their tensor bytes outside protobuf (``raw_tail``): the same
wire bytes and the same decoded request, with the received bytes read in place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from deployments.inference import InferResponse
from deployments.protocol import grpc_codec, grpc_http1, raw_tail
from deployments.protocol.grpc import GRPCInferenceServicer
from deployments.protocol.grpc_http1 import GrpcOverHttp1
from deployments.protocol.proto import grpc_service_pb2 as pb
from deployments.protocol.raw_tail import RAW_INPUT_FIELD, Tailed, split
from tests.protocol.grpc_fakes import StreamingFakeDataPlane, grpc_models
from tests.protocol.test_grpc_http1 import _call, _frame


def _request(*raws: bytes) -> Any:
    message = pb.ModelInferRequest(model_name="m", model_version="1", id="x")
    for i, raw in enumerate(raws):
        message.inputs.add(name=f"IN{i}", datatype="UINT8", shape=[len(raw)])
        message.raw_input_contents.append(raw)
    message.outputs.add(name="OUT")
    message.parameters["sequence_id"].int64_param = 7
    return message


def test_a_split_request_reads_as_the_message_with_its_raw_bytes_in_place() -> None:
    whole = _request(b"\x01" * 100_000, b"ab", b"")
    data = whole.SerializeToString()
    tailed = split(data, pb.ModelInferRequest, "raw_input_contents", RAW_INPUT_FIELD)
    assert [bytes(r) for r in tailed.raw_input_contents] == list(whole.raw_input_contents)
    assert all(isinstance(r, memoryview) and r.obj is data for r in tailed.raw_input_contents)
    assert tailed.model_name == "m" and [t.name for t in tailed.inputs] == ["IN0", "IN1", "IN2"]
    assert tailed.parameters["sequence_id"].int64_param == 7
    # the same request once decoded, its tensors views on the received bytes
    decoded, expected = grpc_codec.decode_infer_request(tailed), grpc_codec.decode_infer_request(whole)
    assert decoded.inputs.keys() == expected.inputs.keys() and decoded.correlation_id == 7
    for name in expected.inputs:
        np.testing.assert_array_equal(decoded.inputs[name], expected.inputs[name])
    assert decoded.inputs["IN0"].base is not None


@pytest.mark.parametrize("cut", [1, 3, 100])
def test_a_truncated_message_is_a_decode_error(cut: int) -> None:
    data = _request(b"\x01" * 1000).SerializeToString()
    with pytest.raises(DecodeError):
        split(data[:-cut], pb.ModelInferRequest, "raw_input_contents", RAW_INPUT_FIELD)


def test_a_tailed_response_is_the_same_message_in_parts() -> None:
    big = np.arange(100_000, dtype=np.float32).reshape(2, 50_000)
    response = InferResponse(outputs={"A": big, "B": np.array([b"x", b"yz"], dtype=object)}, model_name="m")
    plain = grpc_codec.encode_infer_response(response, None)
    tailed = grpc_codec.encode_infer_response(response, None, tailed=True)
    assert isinstance(tailed, Tailed) and not isinstance(plain, Tailed)
    parts = tailed.parts()
    assert any(isinstance(p, memoryview) and p.obj is big for p in parts)  # the output, not a copy
    joined = b"".join(parts)
    assert tailed.ByteSize() == len(joined) == plain.ByteSize()
    assert pb.ModelInferResponse.FromString(joined) == plain
    # a small answer stays a plain message
    small = InferResponse(outputs={"A": big[:, :4]}, model_name="m")
    assert not isinstance(grpc_codec.encode_infer_response(small, None, tailed=True), Tailed)


@pytest.fixture(scope="module")
def lane(tmp_path_factory: pytest.TempPathFactory) -> GrpcOverHttp1:
    return GrpcOverHttp1(
        GRPCInferenceServicer(StreamingFakeDataPlane(grpc_models(Path(tmp_path_factory.mktemp("m")))))
    )


async def test_a_large_call_over_http1_is_answered_from_parts(lane: GrpcOverHttp1) -> None:
    words = [b"w%d" % i for i in range(30_000)]
    request = pb.ModelInferRequest(model_name="strings")
    request.inputs.add(name="TEXT", datatype="BYTES", shape=[len(words)])
    request.raw_input_contents.append(grpc_codec.serialize_bytes_tensor(np.array(words, dtype=object)))
    assert request.ByteSize() > raw_tail.TAIL_MIN_BYTES
    head, data, tail, sent = await _call(lane, "ModelInfer", _frame(request.SerializeToString()), chunk=65536)
    assert tail == {"grpc-status": "0"} and int.from_bytes(data[1:5], "big") == len(data) - 5
    bodies = [m for m in sent if m["type"] == "http.response.body"]
    assert len(bodies) > 2 and not bodies[-1]["more_body"]  # prefix, the message, each raw entry
    answer = pb.ModelInferResponse.FromString(data[5:])
    outputs = {o.name: i for i, o in enumerate(answer.outputs)}
    upper = answer.raw_output_contents[outputs["UPPER"]]
    assert upper == grpc_codec.serialize_bytes_tensor(np.array([w.upper() for w in words], dtype=object))


async def test_a_large_request_that_is_not_a_message_is_refused(lane: GrpcOverHttp1) -> None:
    data = _request(b"\x01" * 100_000).SerializeToString()[:-10]
    head, body, _, _ = await _call(lane, "ModelInfer", _frame(data))
    assert head["grpc-status"] == "13" and "failed to parse the request message" in head["grpc-message"]


def test_the_lane_splits_only_large_infer_calls() -> None:
    assert grpc_http1.TAIL_MIN_BYTES == raw_tail.TAIL_MIN_BYTES
