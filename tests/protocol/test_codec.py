"""The HTTP infer codec: decoding, encoding, compression; with the runtime's check of decoded requests."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.http._utils import _get_inference_request

from deployments.inference import InferResponse, RequestedOutput
from deployments.protocol import codec, compression
from deployments.runtime.checks import ModelSchema
from repository_loader.errors import InvalidArgument, Unsupported
from tests.protocol.fakes import LABELS, add_sub_model, bytes_model, onnx_classifier

ADD_SUB = ModelSchema.from_description(add_sub_model().description)
STRINGS = ModelSchema.from_description(bytes_model().description)


def client_body(inputs, outputs=None, **kwargs):
    """A request body exactly as tritonclient builds it, with its header length."""
    args = dict(request_id="", sequence_id=0, sequence_start=False, sequence_end=False, priority=0)
    args.update(timeout=None, custom_parameters=None)
    args.update(kwargs)
    return _get_inference_request(inputs, outputs=outputs, **args)


def fp32_inputs(a, b, binary=True):
    inputs = []
    for name, value in (("INPUT0", a), ("INPUT1", b)):
        tensor = httpclient.InferInput(name, list(value.shape), "FP32")
        tensor.set_data_from_numpy(value, binary_data=binary)
        inputs.append(tensor)
    return inputs


def decode(body, length=None, schema=ADD_SUB, name="add_sub"):
    """Decode as the HTTP front end does, then check as the model runtime does with every request."""
    request, binary_output = codec.decode_infer_request(body, length, name)
    schema.check_request(request)
    return request, binary_output


def json_body(inputs, **extra):
    return json.dumps({"inputs": inputs, **extra}).encode()


def fp32(name="INPUT0", shape=(1, 16), **extra):
    entry = {"name": name, "datatype": "FP32", "shape": list(shape)}
    entry.update(extra)
    return entry


def pair(**extra):
    data = list(range(16))
    return [fp32("INPUT0", data=data, **extra), fp32("INPUT1", data=data, **extra)]


# --- decoding ---------------------------------------------------------------


def test_binary_inputs_are_views_on_the_body():
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = -a
    body, length = client_body(fp32_inputs(a, b))
    request, binary_output = decode(body, length)
    start = np.frombuffer(body, np.uint8).ctypes.data
    for name, expected in (("INPUT0", a), ("INPUT1", b)):
        array = request.inputs[name]
        np.testing.assert_array_equal(array, expected)
        address = array.__array_interface__["data"][0]
        assert start + length <= address < start + len(body)
        assert not array.flags.owndata
        assert np.shares_memory(array, np.frombuffer(body, np.uint8))
    assert binary_output is True  # tritonclient asks for binary outputs when it names none
    assert request.requested_outputs is None


def test_json_flat_and_nested_data():
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    flat = json_body(
        [fp32("INPUT0", (2, 16), data=a.ravel().tolist()), fp32("INPUT1", (2, 16), data=a.tolist())]
    )
    request, binary_output = decode(flat)
    np.testing.assert_array_equal(request.inputs["INPUT0"], a)
    np.testing.assert_array_equal(request.inputs["INPUT1"], a)
    assert request.inputs["INPUT1"].dtype == np.float32
    assert binary_output is False


def test_json_and_binary_inputs_mix():
    a = np.linspace(0, 1, 16, dtype=np.float32).reshape(1, 16)
    inputs = fp32_inputs(a, a * 3)
    inputs[0].set_data_from_numpy(a, binary_data=False)
    body, length = client_body(inputs)
    request, _ = decode(body, length)
    np.testing.assert_allclose(request.inputs["INPUT0"], a)
    np.testing.assert_array_equal(request.inputs["INPUT1"], a * 3)


def test_bytes_binary_and_json():
    text = np.array([b"alpha", b"", "\u00e9t\u00e9".encode()], dtype=object)
    for binary in (True, False):
        tensor = httpclient.InferInput("TEXT", [3], "BYTES")
        tensor.set_data_from_numpy(text, binary_data=binary)
        body, length = client_body([tensor])
        request, _ = decode(body, length, STRINGS, "strings")
        assert request.inputs["TEXT"].dtype == object
        assert request.inputs["TEXT"].tolist() == text.tolist()
    nested = json_body([{"name": "TEXT", "datatype": "BYTES", "shape": [2], "data": [["a"], ["b"]]}])
    assert decode(nested, None, STRINGS, "strings")[0].inputs["TEXT"].tolist() == [b"a", b"b"]


def test_request_id_outputs_and_parameters():
    a = np.ones((1, 16), np.float32)
    outputs = [httpclient.InferRequestedOutput("OUTPUT1", binary_data=False, class_count=2)]
    outputs.append(httpclient.InferRequestedOutput("OUTPUT0"))
    body, length = client_body(
        fp32_inputs(a, a),
        outputs=outputs,
        request_id="req-7",
        sequence_id=42,
        sequence_start=True,
        sequence_end=False,
        priority=3,
        timeout=1500,
        custom_parameters={"temperature": 0.5, "mode": "fast"},
    )
    request, binary_output = decode(body, length)
    assert request.id == "req-7"
    assert (request.correlation_id, request.sequence_start, request.sequence_end) == (42, True, False)
    assert (request.priority, request.timeout_us) == (3, 1500)
    assert request.parameters == {"temperature": 0.5, "mode": "fast"}
    assert request.requested_outputs == [
        RequestedOutput("OUTPUT1", binary=False, class_count=2),
        RequestedOutput("OUTPUT0", binary=True, class_count=0),
    ]
    assert binary_output is False


def test_string_sequence_id():
    request, _ = decode(json_body(pair(), parameters={"sequence_id": "abc", "sequence_end": True}))
    assert request.correlation_id == "abc" and request.sequence_end


def test_without_schema_decodes_by_declared_types():
    body = json_body([{"name": "x", "datatype": "INT64", "shape": [2, 2], "data": [[1, 2], [3, 4]]}])
    request, _ = codec.decode_infer_request(body, None, "anything")
    assert request.inputs["x"].dtype == np.int64 and request.inputs["x"].tolist() == [[1, 2], [3, 4]]


@pytest.mark.parametrize(
    ("body", "length", "message"),
    [
        (json_body([fp32("NOPE", data=[0] * 16)] + pair()[1:]), None, "unexpected inference input 'NOPE'"),
        (json_body(pair()[:1]), None, "missing required input(s) ['INPUT1']"),
        (json_body([{**pair()[0], "datatype": "INT32"}, pair()[1]]), None, "'INPUT0' data-type is 'INT32'"),
        (
            json_body([fp32("INPUT0", (1, 8), data=[0] * 8), pair()[1]]),
            None,
            "unexpected shape for input 'INPUT0'",
        ),
        (json_body([fp32("INPUT0", (1,), data=[0]), pair()[1]]), None, "Expected [-1,16], got [1]"),
        (
            json_body([fp32(n, (9, 16), data=[0] * 144) for n in ("INPUT0", "INPUT1")]),
            None,
            "batch-size must be <= 8",
        ),
        (json_body([fp32("INPUT0", data=[0] * 15), pair()[1]]), None, "'INPUT0' has 15 elements"),
        (
            json_body([fp32("INPUT0", data=["x"] * 16), pair()[1]]),
            None,
            "'INPUT0' of data-type FP32 takes numbers",
        ),
        (json_body([fp32("INPUT0", (2, 16), data=[0] * 32), pair()[1]]), None, "share one batch-size"),
        (json_body(pair() + pair()[:1]), None, "'INPUT0' appears more than once"),
        (json_body([fp32("INPUT0"), pair()[1]]), None, "'INPUT0' has neither 'data' nor binary_data_size"),
        (json_body([{**pair()[0], "shape": [1, "16"]}, pair()[1]]), None, "'INPUT0' needs a 'shape'"),
        (json_body([{**pair()[0], "datatype": "FP99"}, pair()[1]]), None, "data-type is 'FP99'"),
        (b'{"inputs": [', None, "failed to parse the request JSON"),
        (b"[1, 2]", None, "must be an object"),
        (b'{"inputs": 3}', None, "'inputs' must be a list"),
        (json_body(pair(), id=5), None, "'id' must be a string"),
        (json_body(pair(), outputs=[{"name": "NOPE"}]), None, "unexpected inference output 'NOPE'"),
        (json_body(pair(), parameters={"priority": -1}), None, "'priority' must be a non-negative"),
        (json_body(pair(), parameters={"sequence_id": 1.5}), None, "'sequence_id' must be"),
        (json_body(pair(), parameters={"binary_data_output": "yes"}), None, "'binary_data_output'"),
        (
            json_body(pair(), outputs=[{"name": "OUTPUT0", "parameters": {"classification": "2"}}]),
            None,
            "classification",
        ),
    ],
)
def test_invalid_requests_name_the_fault(body, length, message):
    with pytest.raises(InvalidArgument) as info:
        decode(body, length)
    assert message in info.value.message


def binary_pair_body():
    a = np.zeros((1, 16), np.float32)
    return client_body(fp32_inputs(a, a))


def test_header_length_that_lies():
    body, length = binary_pair_body()
    with pytest.raises(InvalidArgument, match="failed to parse the request JSON"):
        decode(body, length - 3)  # cuts the JSON short
    with pytest.raises(InvalidArgument, match="inference header size should be in range"):
        codec.parse_header_length(str(len(body) + 1).encode(), len(body))
    with pytest.raises(InvalidArgument, match="must be an integer"):
        codec.parse_header_length(b"12a", len(body))
    with pytest.raises(InvalidArgument, match="beyond the JSON header"):
        decode(body + b"\0" * 4, length)
    with pytest.raises(InvalidArgument, match="only 60 remain"):
        decode(body[:-4], length)
    header_only = json_body([fp32(n, parameters={"binary_data_size": 64}) for n in ("INPUT0", "INPUT1")])
    with pytest.raises(InvalidArgument, match="no Inference-Header-Content-Length header"):
        decode(header_only, None)


def test_binary_size_must_match_the_shape():
    header = json.dumps(
        {"inputs": [fp32(n, parameters={"binary_data_size": 60}) for n in ("INPUT0", "INPUT1")]}
    )
    body = header.encode() + b"\0" * 120
    # Triton's words (tritonclient's and Triton's qa tests look for them)
    with pytest.raises(
        InvalidArgument,
        match=r"input byte size mismatch for input 'INPUT0' for model '\w+'\. Expected 64, got 60",
    ):
        decode(body, len(header))


@pytest.mark.parametrize(
    ("count", "message"),
    [
        (2, r"expected 3 string elements for inference input 'S' for model 'm', got 2"),
        (5, r"unexpected number of string elements 4 for inference input 'S' for model 'm', expecting 3"),
    ],
)
def test_a_bytes_input_with_another_element_count_is_refused_in_tritons_words(count: int, message: str):
    from repository_loader.datatypes import serialize_bytes_tensor

    data = serialize_bytes_tensor(np.array([b"x"] * count, dtype=object))
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "S",
                    "datatype": "BYTES",
                    "shape": [3],
                    "parameters": {"binary_data_size": len(data)},
                }
            ]
        }
    )
    with pytest.raises(InvalidArgument, match=message):
        codec.decode_infer_request(header.encode() + data, len(header), "m")


def test_truncated_binary_bytes_tensor():
    header = json.dumps(
        {
            "inputs": [
                {"name": "TEXT", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 6}}
            ]
        }
    )
    body = header.encode() + b"\x09\0\0\0ab"
    with pytest.raises(InvalidArgument, match="'TEXT': BYTES tensor data is truncated"):
        decode(body, len(header), STRINGS, "strings")


# --- encoding ---------------------------------------------------------------


def parse(body, length):
    return httpclient.InferResult.from_response_body(body, header_length=length)


def response(**outputs):
    return InferResponse(outputs=outputs, model_name="add_sub", model_version="2", id="r1")


def test_json_outputs_of_every_numeric_type():
    arrays = {
        "b": np.array([[True, False]]),
        "i8": np.array([[-3, 4]], np.int8),
        "u64": np.array([[2**63 + 1]], np.uint64),
        "f16": np.array([[0.5, -1.25]], np.float16),
        "f64": np.array([[1e-300]], np.float64),
    }
    datatypes = {"b": "BOOL", "i8": "INT8", "u64": "UINT64", "f16": "FP16", "f64": "FP64"}
    body, length = codec.encode_infer_response(response(**arrays), None)
    assert length is None
    doc = json.loads(body)
    assert (doc["model_name"], doc["model_version"], doc["id"]) == ("add_sub", "2", "r1")
    result = parse(body, None)
    for name, array in arrays.items():
        assert result.get_output(name)["datatype"] == datatypes[name]
        np.testing.assert_array_equal(result.as_numpy(name), array)
        assert result.as_numpy(name).dtype == array.dtype


def test_binary_outputs_by_default_and_per_output():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(4, dtype=np.int64)
    body, length = codec.encode_infer_response(response(A=a, B=b), None, binary_output=True)
    assert length is not None and len(body) == length + a.nbytes + b.nbytes
    header = json.loads(body[:length])
    assert [o["parameters"]["binary_data_size"] for o in header["outputs"]] == [24, 32]
    result = parse(body, length)
    np.testing.assert_array_equal(result.as_numpy("A"), a)
    np.testing.assert_array_equal(result.as_numpy("B"), b)
    requested = [RequestedOutput("B", binary=False), RequestedOutput("A")]
    body, length = codec.encode_infer_response(response(A=a, B=b), requested, binary_output=True)
    header = json.loads(body[:length])
    assert [o["name"] for o in header["outputs"]] == ["B", "A"]
    assert header["outputs"][0]["data"] == [0, 1, 2, 3]
    np.testing.assert_array_equal(parse(body, length).as_numpy("A"), a)


def test_non_contiguous_output_is_sent_in_logical_order():
    a = np.arange(12, dtype=np.int32).reshape(3, 4).T
    body, length = codec.encode_infer_response(response(A=a), [RequestedOutput("A", binary=True)])
    np.testing.assert_array_equal(parse(body, length).as_numpy("A"), a)


def test_bytes_outputs_json_and_binary():
    text = np.array([[b"x", b"\xc3\xa9"]], dtype=object)
    for binary in (False, True):
        body, length = codec.encode_infer_response(response(T=text), [RequestedOutput("T", binary=binary)])
        assert (length is not None) is binary
        decoded = parse(body, length).as_numpy("T").tolist()
        expected = text.tolist() if binary else [["x", "\u00e9"]]  # JSON strings come back as str
        assert decoded == expected
    with pytest.raises(InvalidArgument, match="'T' holds bytes that are not UTF-8"):
        codec.encode_infer_response(
            response(T=np.array([b"\xff"], dtype=object)), [RequestedOutput("T", False)]
        )


def test_missing_requested_output():
    with pytest.raises(InvalidArgument, match="did not produce the requested output 'C'"):
        codec.encode_infer_response(response(A=np.zeros(1)), [RequestedOutput("C")])


def test_classification_with_labels_batched(tmp_path: Path):
    schema = ModelSchema.from_description(onnx_classifier(tmp_path).description)
    scores = np.array([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3]], np.float32)
    requested = [RequestedOutput("PROB", binary=False, class_count=2)]
    body, _ = codec.encode_infer_response(response(PROB=scores), requested, schema=schema)
    out = json.loads(body)["outputs"][0]
    assert out["datatype"] == "BYTES" and out["shape"] == [2, 2]
    assert out["data"] == [
        f"0.700000:1:{LABELS[1]}",
        f"0.200000:2:{LABELS[2]}",
        f"0.500000:0:{LABELS[0]}",
        f"0.300000:2:{LABELS[2]}",
    ]


def test_classification_without_labels_or_batching():
    out = codec.classify(np.array([3, 9, 1, 9], np.int32), 10, False, None)
    assert out.shape == (4,)
    assert out.tolist() == [b"9.000000:1", b"9.000000:3", b"3.000000:0", b"1.000000:2"]
    with pytest.raises(InvalidArgument, match="numeric output"):
        codec.classify(np.array([b"a"], dtype=object), 1, False, None)


# --- compression ------------------------------------------------------------


def test_request_decompression():
    data = b'{"inputs": []}' * 10
    assert compression.decompress(gzip.compress(data), "gzip") == data
    assert compression.decompress(zlib.compress(data), "deflate") == data
    raw = zlib.compressobj(wbits=-15)
    assert compression.decompress(raw.compress(data) + raw.flush(), "deflate") == data
    assert compression.decompress(data, "identity") is data
    with pytest.raises(InvalidArgument, match="failed to decompress the gzip"):
        compression.decompress(b"not gzip", "gzip")
    with pytest.raises(Unsupported, match="'br'"):
        compression.decompress(data, "br")


@pytest.mark.parametrize(
    ("accept", "chosen"),
    [
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("br, deflate;q=0.5, gzip", "deflate"),
        ("gzip;q=0, deflate", "deflate"),
        ("identity", None),
        ("", None),
        (None, None),
    ],
)
def test_choose_encoding(accept, chosen):
    assert compression.choose_encoding(accept) == chosen


def test_response_compression_roundtrip():
    body = b'{"outputs": []}' * 20
    assert gzip.decompress(compression.compress(body, "gzip")) == body
    assert zlib.decompress(compression.compress(body, "deflate")) == body


def test_parameters_starting_with_triton_are_refused_but_the_one_clients_may_send():
    for params in ({"triton_": True}, {"triton_x": 1, "key": "v"}):
        with pytest.raises(
            InvalidArgument, match="parameter keys starting with 'triton_' are reserved for Triton"
        ):
            decode(json_body(pair(), parameters=params))
    request, _ = decode(json_body(pair(), parameters={"triton_enable_empty_final_response": True}))
    assert request.parameters == {"triton_enable_empty_final_response": True}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_of_several_miscounted_bytes_inputs_the_last_is_named(protocol: str):
    """Triton validates every input before it answers and names the last one at fault."""
    from deployments.protocol import grpc_codec
    from deployments.protocol.proto import grpc_service_pb2 as pb
    from repository_loader.datatypes import serialize_bytes_tensor

    data = serialize_bytes_tensor(np.array([b"1"] * 14, dtype=object))
    names = ("INPUT0", "INPUT1")
    message = r"expected 16 string elements for inference input 'INPUT1' for model 'm', got 14"
    if protocol == "http":
        params = {"binary_data_size": len(data)}
        header = json.dumps(
            {
                "inputs": [
                    {"name": n, "datatype": "BYTES", "shape": [1, 16], "parameters": params} for n in names
                ]
            }
        )
        with pytest.raises(InvalidArgument, match=message):
            codec.decode_infer_request(header.encode() + data + data, len(header), "m")
        return
    request = pb.ModelInferRequest(model_name="m")
    for name in names:
        request.inputs.add(name=name, datatype="BYTES", shape=[1, 16])
        request.raw_input_contents.append(data)
    with pytest.raises(InvalidArgument, match=message):
        grpc_codec.decode_infer_request(request)
