"""Request limits and strict input at the HTTP front end, Ray-free: refused with the right status
before the memory is spent."""

from __future__ import annotations

import asyncio
import gzip
import json
import math
import tracemalloc
import zlib
from typing import Any

import numpy as np
import pytest

from deployments.inference import InferResponse
from deployments.protocol import codec, compression
from deployments.protocol.http import ModelHTTPApp, ServerHTTPApp
from deployments.settings import RequestLimits, ServerSettings, SettingsError
from repository_loader.errors import InvalidArgument, TooLarge
from tests.protocol.fakes import FakeDataPlane, all_models


class Reply:
    def __init__(self, messages: list[dict]) -> None:
        assert messages[0]["type"] == "http.response.start"
        self.status = messages[0]["status"]
        self.headers = {k.decode(): v.decode() for k, v in messages[0]["headers"]}
        self.body = b"".join(m.get("body", b"") for m in messages[1:])

    def json(self) -> Any:
        return json.loads(self.body)


async def call(
    app: Any,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    raw_path: bytes | None = None,
    chunk: int = 0,
) -> tuple[Reply, int]:
    """One request as uvicorn hands it over (``path`` percent-decoded, ``raw_path`` as sent); returns
    the reply and how many body messages the application read."""
    size = chunk or max(1, len(body))
    parts = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
    read = 0

    async def receive() -> dict:
        nonlocal read
        if read >= len(parts):
            return {"type": "http.disconnect"}
        read += 1
        return {"type": "http.request", "body": parts[read - 1], "more_body": read < len(parts)}

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode() if raw_path is None else raw_path,
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode("utf-8")) for k, v in (headers or {}).items()],
    }
    await app(scope, receive, send)
    return Reply(sent), read


def add_sub_body(rows: int = 1) -> bytes:
    data = list(range(16 * rows))
    inputs = [
        {"name": n, "datatype": "FP32", "shape": [rows, 16], "data": data} for n in ("INPUT0", "INPUT1")
    ]
    return json.dumps({"inputs": inputs}).encode()


@pytest.fixture(scope="module")
def dataplane(tmp_path_factory) -> FakeDataPlane:
    return FakeDataPlane(all_models(tmp_path_factory.mktemp("models")))


def small_app(dataplane: FakeDataPlane, **limits: int) -> ModelHTTPApp:
    return ModelHTTPApp(dataplane, "add_sub", RequestLimits(**limits))


def assert_json_error(reply: Reply, status: int, fragment: str) -> None:
    assert reply.status == status, reply.body
    assert reply.headers["content-type"] == "application/json"
    assert fragment in reply.json()["error"]


# --- body size ------------------------------------------------------------


async def test_declared_content_length_over_the_limit_is_413_before_reading(dataplane):
    body = add_sub_body(8)
    app = small_app(dataplane, max_input_size=100)
    reply, read = await call(app, "POST", "/infer", body, {"content-length": str(len(body))})
    assert_json_error(reply, 413, "more than the limit of 100")
    assert read == 0


async def test_chunked_body_is_refused_once_the_running_total_passes_the_limit(dataplane):
    body = add_sub_body(8)
    app = small_app(dataplane, max_input_size=1000)
    reply, read = await call(app, "POST", "/infer", body, chunk=256)
    assert_json_error(reply, 413, "max_input_size")
    assert read == 4  # 1024 bytes read, not the whole body
    ok, _ = await call(app, "POST", "/infer", add_sub_body(1), chunk=256)
    assert ok.status == 200


@pytest.mark.parametrize("length", ["-1", "+10", " 10", "1_0", "ten"])
async def test_content_length_must_be_digits(dataplane, length):
    reply, _ = await call(small_app(dataplane), "POST", "/infer", add_sub_body(), {"content-length": length})
    assert_json_error(reply, 400, "Content-Length")


# --- compression ----------------------------------------------------------


def test_a_decompression_bomb_is_refused_while_inflating():
    bomb = gzip.compress(bytes(256 << 20))  # 256 MiB of zeros in about 250 kB
    tracemalloc.start()
    try:
        with pytest.raises(TooLarge, match="inflates to more than the limit of 4194304"):
            compression.decompress(bomb, "gzip", 4 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_compressed_body_over_the_inflated_limit_is_413(dataplane, encoding):
    body = add_sub_body(8)
    packed = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
    app = small_app(dataplane, max_decompressed_size=len(body) - 1)
    reply, _ = await call(app, "POST", "/infer", packed, {"content-encoding": encoding})
    assert_json_error(reply, 413, "inflates to more than the limit")
    fits = small_app(dataplane, max_decompressed_size=len(body))
    reply, _ = await call(fits, "POST", "/infer", packed, {"content-encoding": encoding})
    assert reply.status == 200


def test_inflate_reads_every_form_and_refuses_broken_streams():
    data = bytes(range(256)) * 5000
    assert compression.decompress(gzip.compress(data) + gzip.compress(b"tail"), "gzip") == data + b"tail"
    assert compression.decompress(zlib.compress(data), "deflate", len(data)) == data
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    assert compression.decompress(raw.compress(data) + raw.flush(), "deflate") == data
    with pytest.raises(InvalidArgument, match="truncated"):
        compression.decompress(gzip.compress(data)[:-12], "gzip")
    with pytest.raises(InvalidArgument, match="failed to decompress"):
        compression.decompress(b"not gzip", "gzip")


# --- tensors --------------------------------------------------------------


def tensor_body(datatype: str, shape: list[int], data: Any) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "X", "datatype": datatype, "shape": shape, "data": data}]}
    ).encode()


def test_shape_rank_and_element_limits():
    limits = RequestLimits(max_shape_rank=3, max_tensor_elements=100)
    with pytest.raises(InvalidArgument, match="4 dimensions, more than the limit of 3"):
        codec.decode_infer_request(tensor_body("FP32", [1, 1, 1, 1], [1]), None, "m", limits=limits)
    with pytest.raises(TooLarge, match="more than the limit of 100 elements"):
        codec.decode_infer_request(tensor_body("FP32", [10, 11], [1]), None, "m", limits=limits)
    with pytest.raises(TooLarge):  # a huge BYTES shape is refused before anything is allocated
        codec.decode_infer_request(tensor_body("BYTES", [1 << 40], ["a"]), None, "m")


@pytest.mark.parametrize(
    ("datatype", "data", "fragment"),
    [
        ("FP32", [1.0, None], "takes numbers, got null"),
        ("FP32", [True, 1.0], "takes numbers, got true"),
        ("FP32", ["3", 1.0], 'takes numbers, got "3"'),
        ("FP64", [[1.0], ["nan"]], 'got "nan"'),
        ("INT32", [1, 2.5], "takes integers, got 2.5"),
        ("INT32", [1, 2.0], "takes integers, got 2.0"),
        ("INT64", [False, 1], "takes integers, got false"),
        ("INT8", [1, 300], "out of the range of INT8"),
        ("UINT8", [1, -1], "out of the range of UINT8"),
        ("UINT64", [1, 1 << 64], "out of the range of UINT64"),
        ("BOOL", [True, 1], "takes true or false, got 1"),
        ("BYTES", ["a", 1], "takes strings"),
        ("BYTES", ["a", None], "takes strings"),
    ],
)
def test_json_data_must_match_its_datatype(datatype, data, fragment):
    with pytest.raises(InvalidArgument) as info:
        codec.decode_infer_request(tensor_body(datatype, [2], data), None, "m")
    assert fragment in info.value.message


def test_json_data_that_matches_is_read_exactly():
    cases = [
        ("FP32", [1, 2.5], np.float32),
        ("INT8", [-128, 127], np.int8),
        ("UINT64", [0, (1 << 64) - 1], np.uint64),
        ("BOOL", [True, False], np.bool_),
    ]
    for datatype, data, dtype in cases:
        request, _ = codec.decode_infer_request(tensor_body(datatype, [2], data), None, "m")
        np.testing.assert_array_equal(request.inputs["X"], np.array(data, dtype=dtype))
    # Triton's bare non-finite tokens, and the strings this server answers with
    body = b'{"inputs":[{"name":"X","datatype":"FP32","shape":[3],"data":[NaN,"Infinity",-Infinity]}]}'
    request, _ = codec.decode_infer_request(body, None, "m")
    x = request.inputs["X"]
    assert math.isnan(x[0]) and x[1] == np.inf and x[2] == -np.inf


def test_non_finite_outputs_are_strict_json_that_tritonclient_reads_back():
    values = np.array([1.5, np.nan, np.inf, -np.inf], dtype=np.float32)
    response = InferResponse(outputs={"Y": values}, model_name="m", model_version="1")
    body, _ = codec.encode_infer_response(response, None)

    def refuse(token: str) -> None:
        raise ValueError(f"bare {token} in JSON")

    doc = json.loads(body, parse_constant=refuse)
    assert doc["outputs"][0]["data"] == [1.5, "NaN", "Infinity", "-Infinity"]
    back = np.array(doc["outputs"][0]["data"], dtype=np.float32)  # what tritonclient's as_numpy does
    np.testing.assert_array_equal(back, values)


@pytest.mark.parametrize("value", [" 10", "10 ", "+10", "1_0", "-1", "１０", "0x10", ""])
def test_header_length_is_digits_only(value):
    with pytest.raises(InvalidArgument, match="must be an integer"):
        codec.parse_header_length(value.encode() if value.isascii() else value, 100)
    assert codec.parse_header_length(b"10", 100) == 10


# --- paths, URL and headers -------------------------------------------------


@pytest.mark.parametrize(
    ("path", "raw", "fragment"),
    [
        ("/v2/models/add_sub/infer", b"/v2/models/add_%73ub/infer", "percent-encodes 's'"),
        ("/v2/models/add_sub/ready", b"/v2/models/add_%73ub/ready", "/v2/models/add_sub/ready"),
        ("/v2/models/add_sub/config", b"/v2/models/add_%73ub/config", "percent-encodes"),
        ("/v2//models/add_sub/infer", b"/v2//models/add_sub/infer", "empty segment"),
        ("/v2/models/add_sub/infer", b"/v2/models/add_sub%2Finfer", "percent-encodes '/'"),
        ("/v2/models/add_sub/infer", b"/v2/models/add_sub%2finfer", "percent-encodes '/'"),
    ],
)
async def test_non_canonical_paths_are_400_on_every_app_and_route(dataplane, path, raw, fragment):
    method = "POST" if path.endswith("infer") else "GET"
    for app in (ServerHTTPApp(dataplane), ModelHTTPApp(dataplane, "add_sub")):
        reply, read = await call(app, method, path, add_sub_body(), raw_path=raw)
        assert_json_error(reply, 400, fragment)
        assert read == 0


async def test_needed_percent_encoding_is_not_refused(dataplane):
    reply, _ = await call(ServerHTTPApp(dataplane), "GET", "/v2/models/a b", raw_path=b"/v2/models/a%20b")
    assert_json_error(reply, 404, "unknown model")


async def test_url_and_header_size_limits(dataplane):
    app = small_app(dataplane, max_url_bytes=64, max_header_bytes=200)
    reply, _ = await call(app, "GET", "/v2/models/add_sub/" + "x" * 64)
    assert_json_error(reply, 400, "the request URL is")
    reply, _ = await call(app, "GET", "/v2/models/add_sub", headers={"x-big": "y" * 300})
    assert_json_error(reply, 400, "the request headers are")
    reply, _ = await call(app, "GET", "/v2/models/add_sub/ready")
    assert reply.status == 200


# --- concurrency ------------------------------------------------------------


class GatedDataPlane(FakeDataPlane):
    """Holds every inference until ``gate`` opens."""

    def __init__(self, models: Any) -> None:
        super().__init__(models)
        self.gate = asyncio.Event()
        self.waiting = 0

    async def infer(self, request: Any, raw: Any = None) -> Any:
        self.waiting += 1
        await self.gate.wait()
        return await super().infer(request)


async def test_concurrent_inferences_over_the_cap_are_429(tmp_path):
    plane = GatedDataPlane(all_models(tmp_path))
    app = ModelHTTPApp(plane, "add_sub", RequestLimits(max_concurrent_requests=2))
    held = [asyncio.ensure_future(call(app, "POST", "/infer", add_sub_body())) for _ in range(2)]

    async def both_inside() -> None:
        while plane.waiting < 2:
            await asyncio.sleep(0.001)

    await asyncio.wait_for(both_inside(), 10)
    reply, _ = await call(app, "POST", "/infer", add_sub_body())
    assert_json_error(reply, 429, "max_concurrent_requests")
    meta, _ = await call(app, "GET", "/v2/models/add_sub")  # only inferences count
    assert meta.status == 200
    plane.gate.set()
    assert [r.status for r, _ in await asyncio.gather(*held)] == [200, 200]
    reply, _ = await call(app, "POST", "/infer", add_sub_body())
    assert reply.status == 200


# --- settings ---------------------------------------------------------------


def test_limits_come_from_the_server_arguments():
    settings = ServerSettings.from_args({"model_repository": "/models", "max_input_size": "1024"})
    assert settings.limits.max_input_size == 1024
    assert settings.limits.max_decompressed_size == 64 << 20  # Triton's --http-max-input-size default
    assert ServerSettings.from_args(settings.to_args()) == settings
    with pytest.raises(SettingsError, match="max_shape_rank must be a positive integer"):
        ServerSettings.from_args({"model_repository": "/models", "max_shape_rank": 0})


def test_grpc_requests_are_held_to_the_same_shape_limits():
    from deployments.protocol import grpc_codec
    from deployments.protocol.proto import grpc_service_pb2 as pb

    message = pb.ModelInferRequest(model_name="m")
    tensor = message.inputs.add(name="X", datatype="FP32")
    tensor.shape.extend([1 << 20, 1 << 20])
    with pytest.raises(TooLarge) as info:
        grpc_codec.decode_infer_request(message)
    assert info.value.grpc_status == "RESOURCE_EXHAUSTED"
    del tensor.shape[:]
    tensor.shape.extend([1] * 5)
    with pytest.raises(InvalidArgument, match="5 dimensions"):
        grpc_codec.decode_infer_request(message, RequestLimits(max_shape_rank=4))
