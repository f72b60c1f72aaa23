"""Raw binary requests, chunked bodies and the words and statuses of the HTTP front end's refusals,
against the ASGI app under uvicorn, as tritonserver answers them."""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import socket
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import requests

from deployments.inference import InferRequest, InferResponse
from deployments.protocol.codec import decode_raw_request, parse_json
from deployments.protocol.http import ServerHTTPApp
from repository_loader.errors import InvalidArgument, Unavailable
from repository_loader.model import TensorSpec
from tests.protocol.fakes import FakeDataPlane, FakeModel, _description
from tests.protocol.haproxy import running_haproxy
from tests.protocol.test_end_to_end import BackgroundServer


def identity(name: str, datatype: str, dims: tuple[int, ...], max_batch_size: int = 8, inputs: int = 1):
    """A model that answers each input ``INPUTi`` as output ``OUTPUTi``."""
    description = _description(
        name,
        tuple(TensorSpec(f"INPUT{i}", datatype, dims) for i in range(inputs)),
        tuple(TensorSpec(f"OUTPUT{i}", datatype, dims) for i in range(inputs)),
        max_batch_size=max_batch_size,
    )

    def compute(tensors: Mapping[str, Any], version: int) -> dict[str, np.ndarray]:
        return {f"OUTPUT{i}": np.asarray(tensors[f"INPUT{i}"]) for i in range(inputs)}

    return FakeModel(description, compute)


MODELS = {
    "float32": identity("float32", "FP32", (-1,)),
    "one_string": identity("one_string", "BYTES", (1,)),
    "strings": identity("strings", "BYTES", (-1,)),
    "float16_2d": identity("float16_2d", "FP16", (-1, -1)),
    "three": identity("three", "FP32", (-1,), inputs=3),
    "fixed": identity("fixed", "INT32", (2, 2), max_batch_size=0),
    "queued": identity("queued", "FP32", (-1,)),
}


class QueueOfOne(FakeDataPlane):
    """The model ``queued`` holds one request until ``released`` and refuses another meanwhile, as a
    model with ``max_queue_size: 1`` does."""

    def __init__(self) -> None:
        super().__init__(list(MODELS.values()))
        self.holding = False
        self.released = False

    async def infer(self, request: InferRequest, raw: Any = None) -> InferResponse:
        if request.model_name != "queued":
            return await super().infer(request, raw)
        if self.holding:
            raise Unavailable("Exceeds maximum queue size")
        self.holding = True
        try:
            for _ in range(1000):
                if self.released:
                    break
                await asyncio.sleep(0.01)
        finally:
            self.holding = False
        return await super().infer(request, raw)


@pytest.fixture(scope="module")
def dataplane() -> QueueOfOne:
    return QueueOfOne()


@pytest.fixture(scope="module")
def server(dataplane) -> Iterator[BackgroundServer]:
    with BackgroundServer(ServerHTTPApp(dataplane)) as running:
        yield running


def url(server: BackgroundServer, path: str) -> str:
    return f"http://{server.url}{path}"


def post_raw(server: BackgroundServer, model: str, data: bytes, **headers: str) -> requests.Response:
    headers = {"Inference-Header-Content-Length": "0", **headers}
    return requests.post(url(server, f"/v2/models/{model}/infer"), data=data, headers=headers, timeout=20)


def binary_output(reply: requests.Response) -> tuple[dict, bytes]:
    length = int(reply.headers["Inference-Header-Content-Length"])
    return json.loads(reply.content[:length]), reply.content[length:]


@pytest.mark.parametrize("count", [8, 32])
def test_raw_body_is_the_one_input_as_a_batch_of_one(server, count):
    data = np.arange(count, dtype=np.float32).tobytes()
    reply = post_raw(server, "float32", data)
    assert reply.status_code == 200, reply.text
    assert reply.headers["Content-Type"] == "application/octet-stream"
    header, blob = binary_output(reply)
    assert header["outputs"] == [
        {
            "name": "OUTPUT0",
            "datatype": "FP32",
            "shape": [1, count],
            "parameters": {"binary_data_size": len(data)},
        }
    ]
    assert blob == data


def test_raw_body_of_a_one_element_bytes_input(server):
    reply = post_raw(server, "one_string", b"427")
    assert reply.status_code == 200, reply.text
    header, blob = binary_output(reply)
    assert header["outputs"][0]["shape"] == [1, 1]
    assert blob == (3).to_bytes(4, "little") + b"427"  # a BYTES tensor: each element after its length


def test_raw_body_without_the_header_is_json(server):
    reply = requests.post(url(server, "/v2/models/float32/infer"), data=b"\x00\x00\x80?", timeout=20)
    assert reply.status_code == 400
    assert reply.json()["error"].startswith("failed to parse the request JSON buffer: ")


@pytest.mark.parametrize(
    ("model", "data", "message"),
    [
        ("strings", b"427", "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]"),
        (
            "float16_2d",
            np.ones(4, np.float16).tobytes(),
            "The shape of the raw input 'INPUT0' can not be deduced because there are more than one "
            "variable-sized dimension",
        ),
        (
            "three",
            np.arange(24, dtype=np.float32).tobytes(),
            "Raw request must only have 1 input (found 1) to be deduced but got 3 inputs in 'three' "
            "model configuration",
        ),
        ("float32", b"12345", "has a byte size of 5 which is not a multiple of the data type size of 4"),
        (
            "fixed",
            b"\x00" * 12,
            "input byte size mismatch for input 'INPUT0' for model 'fixed'. Expected 16, got 12",
        ),
    ],
)
def test_raw_bodies_a_model_cannot_take(server, model, data, message):
    reply = post_raw(server, model, data)
    assert reply.status_code == 400
    assert reply.headers["Content-Type"] == "application/json"
    assert message in reply.json()["error"]


def test_raw_body_of_a_fixed_shape_model_without_batching(server):
    data = np.arange(4, dtype=np.int32).tobytes()
    header, blob = binary_output(post_raw(server, "fixed", data))
    assert header["outputs"][0]["shape"] == [2, 2] and blob == data


def test_raw_body_compressed(server):
    data = np.arange(8, dtype=np.float32).tobytes()
    reply = post_raw(server, "float32", gzip.compress(data), **{"Content-Encoding": "gzip"})
    assert binary_output(reply)[1] == data


def test_raw_body_sent_chunked(server):
    data = np.arange(8, dtype=np.float32).tobytes()
    framed = f"{len(data):X}\r\n".encode() + data + b"\r\n0\r\n\r\n"
    host, port = server.url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=20)
    try:  # the body goes as framed here, with no Content-Length
        connection.request(
            "POST",
            "/v2/models/float32/infer",
            body=framed,
            headers={"Inference-Header-Content-Length": "0", "Transfer-Encoding": "chunked"},
        )
        reply = connection.getresponse()
        body = reply.read()
    finally:
        connection.close()
    assert reply.status == 200, body
    length = int(reply.getheader("Inference-Header-Content-Length"))
    assert body[length:] == data


def test_a_full_queue_answers_503(server, dataplane):
    data = np.arange(8, dtype=np.float32).tobytes()
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(post_raw, server, "queued", data)
        deadline = time.monotonic() + 10
        while not dataplane.holding and time.monotonic() < deadline:
            time.sleep(0.01)
        second = post_raw(server, "queued", data)
        dataplane.released = True
        assert (first.result().status_code, second.status_code) == (200, 503)
    assert "Exceeds maximum queue size" in second.json()["error"]


def chunked(server: BackgroundServer, head: str, chunks: int) -> tuple[int, str]:
    """Send a body of ``chunks`` one-byte chunks; return the status and the body of the answer."""
    host, port = server.url.split(":")
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(
            (
                f"{head}Host: {server.url}\r\nContent-Type: application/octet-stream\r\n"
                "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            ).encode()
        )
        s.sendall(b"1\r\nA\r\n" * chunks + b"0\r\n\r\n")
        answer = b""
        while data := s.recv(65536):
            answer += data
    head_part, _, body = answer.partition(b"\r\n\r\n")
    return int(head_part.split()[1]), body.decode()


PARSE_ERROR = "failed to parse the request JSON buffer: Invalid value. at 0"


@pytest.mark.parametrize(
    ("head", "message"),
    [
        (
            "POST /v2/models/three/infer HTTP/1.1\r\nInference-Header-Content-Length: 0\r\n",
            "Raw request must only have 1 input (found 1) to be deduced but got 3 inputs",
        ),
        ("POST /v2/repository/index HTTP/1.1\r\n", PARSE_ERROR),
        ("POST /v2/repository/models/float32/load HTTP/1.1\r\n", PARSE_ERROR),
        ("POST /v2/models/float32/generate HTTP/1.1\r\n", PARSE_ERROR),
    ],
)
def test_a_body_of_many_chunks_is_read_whole(server, head, message):
    status, body = chunked(server, head, 100_000)
    assert status == 400
    assert message in json.loads(body)["error"]


def test_refusals_word_their_reasons_as_triton_does(server):
    assert requests.get(url(server, "/v2/no/such/route"), timeout=20).json() == {"error": "Not Found"}
    reply = requests.get(url(server, "/v2/models/float32/infer"), timeout=20)
    assert (reply.status_code, reply.json()) == (405, {"error": "Method Not Allowed"})
    for path in ("/v2/models/nope/ready", "/v2/models/float32/versions/9/ready"):
        reply = requests.get(url(server, path), timeout=20)
        assert (reply.status_code, reply.json()) == (400, {"error": "Model version not ready"})
    reply = post_raw(server, "float32", b"\x00" * 4, **{"Content-Encoding": "br"})
    assert reply.status_code == 501 and reply.json()["error"].startswith("Unsupported compression type")


def test_raw_decoding_takes_no_copy():
    body = np.arange(6, dtype=np.float32).tobytes()
    request = decode_raw_request(body, MODELS["float32"].description, "1")
    tensor = request.inputs["INPUT0"]
    assert tensor.shape == (1, 6) and np.shares_memory(tensor, np.frombuffer(body, np.uint8))
    empty = decode_raw_request(b"", MODELS["float32"].description)
    assert empty.inputs["INPUT0"].shape == (1, 0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b"", "The document is empty. at 0"),
        (b"AAAA", "Invalid value. at 0"),
        (b'{"a": 1} 2', "The document root must not be followed by other values. at 9"),
        (b'{"a" 1}', "Missing a colon after a name of object member. at 5"),
        (b"{1: 2}", "Missing a name for object member. at 1"),
        (b'{"a": 1 "b": 2}', "Missing a comma or '}' after an object member. at 8"),
        (b'{"a": [1 2]}', "Missing a comma or ']' after an array element. at 9"),
        (b'{"\xc3\xa9": [1 2]}', "Missing a comma or ']' after an array element. at 10"),
        (b'"abc', "Missing a closing quotation mark in string. at 0"),
        (b'"\\q"', "Invalid escape character in string. at 1"),
    ],
)
def test_json_parse_errors_in_triton_words(text, message):
    with pytest.raises(InvalidArgument) as caught:
        parse_json(text)
    assert caught.value.message == "failed to parse the request JSON buffer: " + message


_PROXY = """
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend http
    bind 127.0.0.1:{front}
    default_backend replica
backend replica
    server app {app}
"""


def test_chunked_body_with_a_content_length_through_haproxy(server, tmp_path):
    """A body framed chunked that also names a Content-Length (as ``requests`` sends a pre-framed body)
    is read as chunked by HAProxy, which stands in front of every replica; uvicorn alone refuses it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        front = s.getsockname()[1]
    with running_haproxy(_PROXY.format(front=front, app=server.url), tmp_path, front) as address:
        data = np.arange(8, dtype=np.float32).tobytes()
        framed = f"{len(data):X}\r\n".encode() + data + b"\r\n0\r\n\r\n"
        reply = requests.post(
            f"http://{address}/v2/models/float32/infer",
            data=framed,
            headers={"Inference-Header-Content-Length": "0", "Transfer-Encoding": "chunked"},
            timeout=20,
        )
        assert reply.status_code == 200, reply.text
        assert binary_output(reply)[1] == data
