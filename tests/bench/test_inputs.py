"""Requests built from model metadata: shapes, binary and JSON forms."""

import json

import numpy as np
import pytest

from bench.inputs import InputSpecError, infer_body, parse_shape_options, request_pool, tensor_specs

META = {
    "name": "m",
    "inputs": [
        {"name": "IMAGE", "datatype": "UINT8", "shape": [-1, -1, -1]},
        {"name": "TEXT", "datatype": "BYTES", "shape": [-1, 1]},
    ],
    "outputs": [{"name": "OUT", "datatype": "FP32", "shape": [-1, 4]}],
}


def test_shapes_from_metadata_batch_and_options():
    shapes = parse_shape_options(["IMAGE:32,100"])
    specs = tensor_specs(META, max_batch_size=8, batch_size=2, shapes=shapes)
    assert [(s.name, s.shape) for s in specs] == [("IMAGE", (2, 32, 100)), ("TEXT", (2, 1))]
    with pytest.raises(InputSpecError, match="IMAGE"):
        tensor_specs(META, max_batch_size=8)
    with pytest.raises(InputSpecError):
        parse_shape_options(["IMAGE=3"])


def test_binary_body_carries_header_then_raw_tensors():
    specs = tensor_specs(META, 8, 2, parse_shape_options(["IMAGE:2,3"]))
    image = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    text = np.array([[b"ab"], [b"xyz"]], dtype=np.object_)
    body, headers = infer_body(specs, [image, text], ["OUT"], binary=True)
    n = int(headers["Inference-Header-Content-Length"])
    header = json.loads(body[:n])
    assert header["inputs"][0]["parameters"]["binary_data_size"] == 12
    assert header["outputs"] == [{"name": "OUT", "parameters": {"binary_data": True}}]
    rest = body[n:]
    assert rest[:12] == image.tobytes()
    assert rest[12:] == b"\x02\x00\x00\x00ab\x03\x00\x00\x00xyz"


def test_json_body_and_request_pool_variants():
    specs = tensor_specs({"name": "m", "inputs": [{"name": "X", "datatype": "FP32", "shape": [4]}]}, 0)
    body, headers = infer_body(specs, [np.ones(4, np.float32)], [], binary=False)
    assert json.loads(body)["inputs"][0]["data"] == [1.0, 1.0, 1.0, 1.0]
    assert headers["Content-Type"] == "application/json"
    pool = request_pool("localhost:1", "m", specs, [], variants=4)
    assert len(set(pool)) == 4
    assert pool[0].startswith(b"POST /v2/models/m/infer HTTP/1.1\r\n")
