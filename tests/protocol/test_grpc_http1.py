"""gRPC's calls over HTTP/1.1 (``deployments.protocol.grpc_http1``), as an ASGI application: the
framing, the trailers, streams and the refusals, without a proxy. The real client through HAProxy runs every
RPC of ``test_grpc.py`` over this path too (its ``http1`` transport)."""

from __future__ import annotations

import asyncio
import gzip
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deployments.protocol.grpc import GRPCInferenceServicer, GrpcOptions
from deployments.protocol.grpc_http1 import (
    CANCEL_WATCH_AFTER_S,
    GrpcOverHttp1,
    percent_encoded,
)
from deployments.protocol.http1_server import STREAMED_RESPONSE, TRAILERS_EXTENSION
from deployments.protocol.proto import grpc_service_pb2 as pb
from deployments.settings import RestrictedApi
from tests.protocol.grpc_fakes import StreamingFakeDataPlane, grpc_models

PATH = "/inference.GRPCInferenceService/"


@pytest.fixture(scope="module")
def dataplane(tmp_path_factory: pytest.TempPathFactory) -> StreamingFakeDataPlane:
    return StreamingFakeDataPlane(grpc_models(Path(tmp_path_factory.mktemp("models"))))


def _frame(message: bytes, flag: int = 0) -> bytes:
    return bytes([flag]) + len(message).to_bytes(4, "big") + message


async def _call(
    lane: GrpcOverHttp1,
    method: str,
    body: bytes,
    headers: dict[str, str] | None = None,
    trailers: bool = True,
    chunk: int | None = None,
) -> tuple[dict[str, str], bytes, dict[str, str], list[dict[str, Any]]]:
    """The head, body and trailers ``lane`` answers (a trailers-only answer has its status in the head)."""
    fields = {"content-type": "application/grpc", **(headers or {})}
    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": PATH + method,
        "headers": [(k.encode(), v.encode()) for k, v in fields.items()],
        "extensions": {TRAILERS_EXTENSION: {}} if trailers else {},
    }
    pieces = [body[i : i + chunk] for i in range(0, len(body), chunk)] if chunk else [body]
    received = 0

    async def receive() -> dict[str, Any]:
        nonlocal received
        piece = pieces[received] if received < len(pieces) else b""
        received += 1
        return {"type": "http.request", "body": piece, "more_body": received < len(pieces)}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await lane(scope, receive, send)
    head = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
    data = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    tail = {k.decode(): v.decode() for m in sent if m["type"] == TRAILERS_EXTENSION for k, v in m["headers"]}
    assert head["content-type"] == "application/grpc" and sent[0]["status"] == 200
    return head, data, tail, sent


async def test_a_call_answers_its_message_then_the_status_in_trailers(dataplane: Any) -> None:
    lane = GrpcOverHttp1(GRPCInferenceServicer(dataplane))
    request = pb.ModelReadyRequest(name="echo_slow").SerializeToString()
    head, data, tail, sent = await _call(lane, "ModelReady", _frame(request), chunk=3)
    assert sent[0]["trailers"] is True and tail == {"grpc-status": "0"}
    assert data[0] == 0 and int.from_bytes(data[1:5], "big") == len(data) - 5
    assert pb.ModelReadyResponse.FromString(data[5:]).ready is True


async def test_errors_are_trailers_only_answers_with_the_status_and_message(dataplane: Any) -> None:
    lane = GrpcOverHttp1(GRPCInferenceServicer(dataplane))
    request = pb.ModelMetadataRequest(name="no_such_model").SerializeToString()
    head, data, tail, _ = await _call(lane, "ModelMetadata", _frame(request))
    assert head["grpc-status"] == "5" and "no_such_model" in head["grpc-message"]  # NOT_FOUND
    assert head["content-length"] == "0" and data == b"" and tail == {}


@pytest.mark.parametrize(
    ("method", "body", "status", "words"),
    [
        ("NoSuchMethod", _frame(b""), "12", "Method not found"),
        ("ServerLive", b"\x00\x00\x00", "13", "incomplete"),
        ("ServerLive", _frame(b"ab")[:-1], "13", "incomplete"),
        ("ServerLive", _frame(b"") + _frame(b""), "13", "one message"),
        ("ModelReady", _frame(b"\x0a\x05ab"), "13", "failed to parse"),
        ("ServerLive", _frame(b"xyz", flag=1), "12", "grpc-encoding 'identity'"),
    ],
)
async def test_malformed_calls_are_refused_with_a_status(
    dataplane: Any, method: str, body: bytes, status: str, words: str
) -> None:
    head, _, _, _ = await _call(GrpcOverHttp1(GRPCInferenceServicer(dataplane)), method, body)
    assert head["grpc-status"] == status and words in head["grpc-message"]


async def test_a_server_without_trailers_refuses_every_call(dataplane: Any) -> None:
    lane = GrpcOverHttp1(GRPCInferenceServicer(dataplane))
    head, _, _, _ = await _call(lane, "ServerLive", _frame(b""), trailers=False)
    assert head["grpc-status"] == "13" and "trailers" in head["grpc-message"]


async def test_a_message_over_the_limit_is_refused_from_its_frame_head(dataplane: Any) -> None:
    lane = GrpcOverHttp1(GRPCInferenceServicer(dataplane, GrpcOptions(max_receive_message_bytes=100)))
    body = _frame(b"\x0a\x03abc" + b"\x12\xff\x01" + b"x" * 255)
    head, _, _, _ = await _call(lane, "ModelReady", body, chunk=16)
    assert head["grpc-status"] == "8"  # RESOURCE_EXHAUSTED
    assert head["grpc-message"] == f"Received message larger than max ({len(body) - 5} vs. 100)"
    assert head["connection"] == "close"  # the rest of the body was never read


async def test_compressed_requests_and_responses(dataplane: Any) -> None:
    lane = GrpcOverHttp1(GRPCInferenceServicer(dataplane, GrpcOptions(compression="gzip")))
    request = gzip.compress(pb.ModelReadyRequest(name="echo_slow").SerializeToString())
    headers = {"grpc-encoding": "gzip", "grpc-accept-encoding": "identity, deflate, gzip"}
    head, data, tail, _ = await _call(lane, "ModelReady", _frame(request, flag=1), headers)
    assert head["grpc-encoding"] == "gzip" and data[0] == 1 and tail == {"grpc-status": "0"}
    assert pb.ModelReadyResponse.FromString(gzip.decompress(data[5:])).ready is True
    head, data, _, _ = await _call(lane, "ModelReady", _frame(request, flag=1), {"grpc-encoding": "gzip"})
    assert "grpc-encoding" not in head and data[0] == 0  # the client did not offer gzip


async def test_a_bomb_inflating_past_the_limit_is_refused(dataplane: Any) -> None:
    lane = GrpcOverHttp1(GRPCInferenceServicer(dataplane, GrpcOptions(max_receive_message_bytes=1000)))
    bomb = gzip.compress(b"\x00" * 1_000_000)
    head, _, _, _ = await _call(lane, "ServerLive", _frame(bomb, flag=1), {"grpc-encoding": "gzip"})
    assert head["grpc-status"] == "8" and "larger than max" in head["grpc-message"]


async def test_the_restricted_api_reads_the_request_headers(dataplane: Any) -> None:
    rule = RestrictedApi(frozenset({"health"}), "admin-key", "secret")
    lane = GrpcOverHttp1(GRPCInferenceServicer(dataplane, GrpcOptions(restricted=(rule,))))
    head, _, _, _ = await _call(lane, "ServerLive", _frame(b""))
    assert (
        head["grpc-status"] == "14" and "triton-grpc-protocol-admin-key" in head["grpc-message"]
    )  # UNAVAILABLE, as Triton
    head, _, _, _ = await _call(lane, "ServerLive", _frame(b""), {"admin-key": "secret"})
    assert head["grpc-status"] == "14"  # gRPC reads the key with Triton's prefix, not the bare HTTP header
    headers = {"triton-grpc-protocol-admin-key": "secret"}
    _, data, tail, _ = await _call(lane, "ServerLive", _frame(b""), headers)
    assert tail == {"grpc-status": "0"} and pb.ServerLiveResponse.FromString(data[5:]).live is True


async def test_the_servicer_runs_where_run_puts_it(dataplane: Any) -> None:
    ran: list[str] = []

    async def run(call: Any) -> Any:
        ran.append(call.__qualname__)
        return await call

    lane = GrpcOverHttp1(GRPCInferenceServicer(dataplane), run=run)
    _, _, tail, _ = await _call(lane, "ServerLive", _frame(b""))
    assert tail == {"grpc-status": "0"} and ran == ["answer_unary"]


def test_grpc_message_is_percent_encoded() -> None:
    assert percent_encoded("model 'ä' 100%\n") == b"model '%C3%A4' 100%25%0A"


def _unary_scope(method: str) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": PATH + method,
        "headers": [(b"content-type", b"application/grpc")],
        "extensions": {TRAILERS_EXTENSION: {}},
    }


def _sender(sent: list[dict[str, Any]]) -> Any:
    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    return send


async def test_a_client_that_leaves_cancels_its_call() -> None:
    """The proxy closes the connection when the client cancels (RST_STREAM): the running call is
    cancelled and nothing is answered; the lane itself returns normally."""
    started = asyncio.Event()
    cancelled = asyncio.Event()
    left = asyncio.Event()

    async def run(call: Any) -> Any:
        call.close()  # the servicer's part is not needed: this call runs until it is cancelled
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    lane = GrpcOverHttp1(GRPCInferenceServicer(StreamingFakeDataPlane([])), run=run)
    messages = [{"type": "http.request", "body": _frame(b""), "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await left.wait()
        return {"type": "http.disconnect"}

    sent: list[dict[str, Any]] = []
    served = asyncio.ensure_future(lane(_unary_scope("ModelInfer"), receive, _sender(sent)))
    await asyncio.wait_for(started.wait(), 5)
    await asyncio.sleep(CANCEL_WATCH_AFTER_S * 2)
    assert not cancelled.is_set()
    left.set()
    await asyncio.wait_for(served, 5)
    assert cancelled.is_set() and sent == []


async def test_a_call_that_answers_at_once_does_not_watch_its_connection(dataplane: Any) -> None:
    lane = GrpcOverHttp1(GRPCInferenceServicer(dataplane))
    reads = 0

    async def receive() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        return {"type": "http.request", "body": _frame(b""), "more_body": False}

    sent: list[dict[str, Any]] = []
    await lane(_unary_scope("ServerLive"), receive, _sender(sent))
    assert sent[-1]["headers"] == [(b"grpc-status", b"0")]
    await asyncio.sleep(CANCEL_WATCH_AFTER_S * 3)
    # the message was read once; the connection was never read again, and the sweep has ended
    assert reads == 1
    assert {t for t in asyncio.all_tasks() if not t.done()} == {asyncio.current_task()}


def _echo_request(value: int, request_id: str) -> bytes:
    message = pb.ModelInferRequest(model_name="echo_slow", id=request_id)
    tensor = message.inputs.add(name="X", datatype="INT64", shape=[1])
    tensor.contents.int64_contents.append(value)
    return _frame(message.SerializeToString())


class _Connection:
    """A stream's connection, driven by the test: body pieces and a disconnect are put on ``events``;
    ``sent`` fills as the lane writes, ``wrote`` is set at each write."""

    def __init__(self) -> None:
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.sent: list[dict[str, Any]] = []
        self.wrote = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        return await self.events.get()

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        self.wrote.set()

    def body(self, data: bytes, more: bool = True) -> None:
        self.events.put_nowait({"type": "http.request", "body": data, "more_body": more})

    def responses(self) -> list[Any]:
        data = b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")
        out = []
        while data:
            size = int.from_bytes(data[1:5], "big")
            out.append(pb.ModelStreamInferResponse.FromString(data[5 : 5 + size]))
            data = data[5 + size :]
        return out

    async def written(self, count: int) -> None:
        while len(self.responses()) < count:
            self.wrote.clear()
            await asyncio.wait_for(self.wrote.wait(), 5)


def _stream_scope() -> dict[str, Any]:
    return _unary_scope("ModelStreamInfer")


async def test_a_stream_answers_each_message_while_its_body_is_still_open(dataplane: Any) -> None:
    """Each request is answered before the next one is sent, then the status ends the answer."""
    connection = _Connection()
    lane = GrpcOverHttp1(GRPCInferenceServicer(dataplane))
    served = asyncio.ensure_future(lane(_stream_scope(), connection.receive, connection.send))
    first = _echo_request(7, "a")
    connection.body(first[:3])  # a message in pieces
    connection.body(first[3:])
    await connection.written(1)
    assert connection.sent[0]["type"] == "http.response.start" and connection.sent[0]["trailers"] is True
    assert connection.sent[0][STREAMED_RESPONSE] is True  # written as it comes, not held for the trailers
    connection.body(_echo_request(8, "b") + _echo_request(9, "c"))
    await connection.written(3)
    connection.body(b"", more=False)  # the client half-closes
    await asyncio.wait_for(served, 5)
    # "a" was answered before "b" and "c" were sent; those two run side by side and are answered in the
    # order they complete (docs/grpc.md, Streaming), so either may come first
    first_answer, *others = connection.responses()
    answers = [first_answer, *sorted(others, key=lambda r: r.infer_response.id)]
    assert [(r.infer_response.id, r.error_message) for r in answers] == [("a", ""), ("b", ""), ("c", "")]
    assert [list(np.frombuffer(r.infer_response.raw_output_contents[0], np.int64)) for r in answers] == [
        [7],
        [8],
        [9],
    ]
    assert connection.sent[-1] == {
        "type": TRAILERS_EXTENSION,
        "headers": [(b"grpc-status", b"0")],
        "more_trailers": False,
    }


async def test_a_message_of_a_stream_over_the_limit_ends_it_from_its_frame_head(dataplane: Any) -> None:
    connection = _Connection()
    lane = GrpcOverHttp1(GRPCInferenceServicer(dataplane, GrpcOptions(max_receive_message_bytes=100)))
    served = asyncio.ensure_future(lane(_stream_scope(), connection.receive, connection.send))
    connection.body(_echo_request(1, "a"))
    await connection.written(1)
    connection.body(b"\x00" + (10**6).to_bytes(4, "big"))  # only the head of a large message
    await asyncio.wait_for(served, 5)
    tail = dict(connection.sent[-1]["headers"])
    assert tail[b"grpc-status"] == b"8" and b"larger than max (1000000 vs. 100)" in tail[b"grpc-message"]
    assert [r.infer_response.id for r in connection.responses()] == ["a"]


async def test_a_stream_refused_before_any_answer_is_a_trailers_only_answer(dataplane: Any) -> None:
    connection = _Connection()
    lane = GrpcOverHttp1(GRPCInferenceServicer(dataplane, GrpcOptions(max_receive_message_bytes=100)))
    served = asyncio.ensure_future(lane(_stream_scope(), connection.receive, connection.send))
    connection.body(b"\x00" + (10**6).to_bytes(4, "big"))
    await asyncio.wait_for(served, 5)
    head = dict(connection.sent[0]["headers"])
    assert head[b"grpc-status"] == b"8" and head[b"connection"] == b"close"  # the body was not read


async def test_a_client_leaving_a_half_closed_stream_cancels_its_work(dataplane: Any) -> None:
    """The client half-closed, its request still runs: its connection closing cancels the request
    (the model's work) and nothing more is written."""
    dataplane.released.clear()
    connection = _Connection()
    lane = GrpcOverHttp1(GRPCInferenceServicer(dataplane))
    served = asyncio.ensure_future(lane(_stream_scope(), connection.receive, connection.send))
    message = pb.ModelInferRequest(model_name="echo_slow", id="held")
    tensor = message.inputs.add(name="X", datatype="INT64", shape=[1])
    tensor.contents.int64_contents.append(1)
    message.parameters["hold"].bool_param = True
    connection.body(_frame(message.SerializeToString()), more=False)
    await asyncio.sleep(0.1)
    assert not served.done()
    connection.events.put_nowait({"type": "http.disconnect"})
    await asyncio.wait_for(served, 5)
    assert connection.sent == []
    dataplane.released.set()
