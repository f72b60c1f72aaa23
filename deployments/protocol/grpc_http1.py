"""The unary RPCs of ``inference.GRPCInferenceService`` over HTTP/1.1, as an ASGI application.

A gRPC call is an HTTP POST to ``/inference.GRPCInferenceService/<Method>`` whose body is one
length-prefixed message (a 1-byte compressed flag, a 4-byte big-endian length, the message) and
whose answer is the response message framed the same way, followed by the trailers ``grpc-status``
and ``grpc-message``. HTTP/2 carries it between a client and a proxy; nothing in it needs HTTP/2
between a proxy and the server, provided the server can send trailers: HTTP/1.1's chunked
encoding has them. HAProxy converts between the two (HTTP/2 frontend, HTTP/1.1 server), trailers
included, so a model replica's HTTP server answers ``ModelInfer`` with the same per-call cost as
its HTTP routes, not that of a second, HTTP/2 server in Python (docs/grpc.md).

:class:`GrpcOverHttp1` answers every unary RPC of a :class:`GRPCInferenceServicer` this way, with
the servicer's own rules: the restricted API (request headers are the call's metadata), the
receive and send limits (a message over the receive limit is refused from its frame header,
before its bytes are read), compressed requests (``grpc-encoding`` gzip or deflate) and response
compression (``GrpcOptions.compression``, where the client's ``grpc-accept-encoding`` takes it).

A stream (``ModelStreamInfer``) is one POST whose body is the client's messages, one after another,
and whose answer is the server's, written as they come, then the trailers: HTTP/1.1 carries both
directions at once (the answer begins before the request's body ends), and so does HAProxy
between its HTTP/2 frontend and such a server. Each message is read as it arrives, against the same
limits; the client leaving (its connection closed, before or after it half-closed) cancels the
stream's work, as a gRPC server's cancellation does.

The server must implement ASGI's HTTP trailers extension (``http.response.trailers`` in the
scope's ``extensions``; ``deployments.serve.response_writes`` adds it to uvicorn's httptools
server). Without it every call is answered INTERNAL, naming the reason. An error is a
trailers-only answer (``grpc-status`` in the response head, no body), which needs no trailers.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, MutableMapping
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from deployments.protocol.compression import compress, decompress
from deployments.protocol.grpc import (
    SERVICE,
    GRPCInferenceServicer,
    RpcMethod,
    answer_stream,
    answer_unary,
    status_of,
)
from deployments.protocol.http1_server import STREAMED_RESPONSE, TRAILERS_EXTENSION
from deployments.protocol.raw_tail import RAW_INPUT_FIELD, TAIL_MIN_BYTES, Tailed, split
from repository_loader.errors import InternalError, ServerError, TooLarge, Unsupported

PATH_PREFIX = f"/{SERVICE}/"
_FRAME = 5  # compressed flag and length
CANCEL_WATCH_AFTER_S = 0.05  # how often running calls are swept: one running a whole interval is watched
_CONTENT_TYPE = (b"content-type", b"application/grpc")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Run = Callable[[Coroutine[Any, Any, Any]], Awaitable[Any]]


async def _await(call: Coroutine[Any, Any, Any]) -> Any:
    return await call


class _Refused(Exception):
    """A call answered with ``code`` before the servicer saw it; ``close`` drops the connection (the
    request's body was not read)."""

    def __init__(self, code: grpc.StatusCode, message: str, close: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.close = close


class _Running:
    """A unary call in progress: how to read its connection, and whether its client left."""

    __slots__ = ("receive", "seen", "watcher", "gone")

    def __init__(self, receive: Receive) -> None:
        self.receive = receive
        self.seen = False  # a sweep saw it running
        self.watcher: asyncio.Task[None] | None = None
        self.gone = False


async def _watch(task: asyncio.Task[Any], running: _Running) -> None:
    """Cancel ``task`` when the connection of its call closes."""
    while (await running.receive())["type"] != "http.disconnect":
        pass
    running.gone = True
    task.cancel()


class GrpcOverHttp1:
    """An ASGI application answering the unary RPCs of ``servicer`` (see the module's description).

    ``run`` runs the servicer's part of a call (parsing excluded): by default it is awaited where the
    request arrived; a server whose servicer lives on another event loop passes a function that moves
    it there.
    """

    def __init__(self, servicer: GRPCInferenceServicer, run: Run | None = None) -> None:
        self.servicer = servicer
        self.options = servicer.options
        self._methods = servicer.methods()
        self._run = run or _await
        self._running: dict[asyncio.Task[Any], _Running] = {}
        self._sweeper: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path") or ""
        method = self._methods.get(path[len(PATH_PREFIX) :]) if path.startswith(PATH_PREFIX) else None
        headers = _headers(scope)
        try:
            if method is None:
                raise _Refused(grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {path}")
            if scope.get("method") != "POST" or not headers.get("content-type", "").startswith(
                "application/grpc"
            ):
                raise _Refused(grpc.StatusCode.UNIMPLEMENTED, "a gRPC call is a POST of application/grpc")
            if TRAILERS_EXTENSION not in (scope.get("extensions") or {}):
                raise _Refused(
                    grpc.StatusCode.INTERNAL, "this HTTP server cannot send trailers, which gRPC needs"
                )
            if method.streaming:
                await self._stream_where_run(method, headers, receive, send)
                return
            request = _parse(method, await self._message(receive, headers))
        except _Refused as refused:
            await _answer_status(send, refused.code, refused.message, refused.close)
            return
        except DecodeError as e:
            await _answer_status(send, grpc.StatusCode.INTERNAL, f"failed to parse the request message: {e}")
            return
        try:
            response = await self._until_cancelled(
                receive,
                answer_unary(
                    method, request, lambda: headers, self.options.max_send_message_bytes, tailed=True
                ),
            )
            if response is None:
                return  # the client cancelled the call: nobody reads an answer
        except Exception as e:
            code, message = status_of(e, method.name)
            await _answer_status(send, code, message)
            return
        await self._answer(send, method, response, headers)

    async def _until_cancelled(self, receive: Receive, call: Coroutine[Any, Any, Any]) -> Any:
        """``call``'s result, or None when the client cancels the call first.

        A cancelled gRPC call (RST_STREAM) reaches this server as the proxy closing the connection.
        As Triton does, the request is then cancelled: a queued request is dropped and a running
        one's model sees ``request.is_cancelled()``. Watching a connection takes a task, so only
        calls still running at a sweep (every ``CANCEL_WATCH_AFTER_S``, while calls run) are
        watched; the others cost a dictionary entry.
        """
        task = asyncio.current_task()
        assert task is not None
        running = _Running(receive)
        self._running[task] = running
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        try:
            return await self._run(call)
        except asyncio.CancelledError:
            if not running.gone:
                raise
            task.uncancel()
            return None
        finally:
            del self._running[task]
            watcher = running.watcher
            if watcher is not None and not watcher.done():
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher

    async def _sweep(self) -> None:
        """Watch the connection of every call that has run for a whole sweep interval, while any runs."""
        loop = asyncio.get_running_loop()
        try:
            while self._running:
                await asyncio.sleep(CANCEL_WATCH_AFTER_S)
                for task, running in list(self._running.items()):
                    if running.seen and running.watcher is None:
                        running.watcher = loop.create_task(_watch(task, running))
                    running.seen = True
        finally:
            self._sweeper = None

    async def _message(self, receive: Receive, headers: Mapping[str, str]) -> bytes | memoryview:
        """The request message: read from the body, refused over the receive limit, inflated."""
        limit = self.options.max_receive_message_bytes
        chunks: list[bytes] = []
        size = 0
        expected: int | None = None
        compressed = False
        more = True
        while more:
            event = await receive()
            if event["type"] == "http.disconnect":
                raise _Refused(grpc.StatusCode.CANCELLED, "the client went away", close=True)
            chunk: bytes = event.get("body", b"")
            more = bool(event.get("more_body", False))
            if chunk:
                chunks.append(chunk)
                size += len(chunk)
            if expected is None and size >= _FRAME:
                head = chunks[0] if len(chunks[0]) >= _FRAME else b"".join(chunks)
                compressed = head[0] == 1
                expected = int.from_bytes(head[1:_FRAME], "big")
                if expected > limit:
                    raise _Refused(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"Received message larger than max ({expected} vs. {limit})",
                        close=more,
                    )
            if expected is not None and size > _FRAME + expected:
                raise _Refused(grpc.StatusCode.INTERNAL, "a unary call carries one message", close=more)
        if expected is None or size != _FRAME + expected:
            raise _Refused(grpc.StatusCode.INTERNAL, "the request message is incomplete")
        data = memoryview(chunks[0] if len(chunks) == 1 else b"".join(chunks))[_FRAME:]
        if not compressed:
            return data
        encoding = headers.get("grpc-encoding", "identity")
        if encoding not in ("gzip", "deflate"):
            raise _Refused(
                grpc.StatusCode.UNIMPLEMENTED, f"a compressed message with grpc-encoding '{encoding}'"
            )
        try:
            return decompress(data.tobytes(), encoding, limit)
        except TooLarge:
            raise _Refused(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Received message larger than max (inflated beyond {limit} bytes)",
            ) from None
        except (ServerError, zlib.error) as e:
            raise _Refused(
                grpc.StatusCode.INTERNAL, f"failed to decompress the request message: {e}"
            ) from None

    def _response_encoding(self, headers: Mapping[str, str]) -> str | None:
        """How responses are compressed: the server's choice, where the client takes it."""
        encoding = self.options.compression
        if encoding in ("gzip", "deflate") and encoding in _tokens(headers.get("grpc-accept-encoding", "")):
            return encoding
        return None

    async def _stream_where_run(
        self, method: RpcMethod, headers: Mapping[str, str], receive: Receive, send: Send
    ) -> None:
        """The stream on the servicer's loop (``run``), reading and writing its connection where it is."""
        if self._run is _await:
            await self._stream(method, headers, receive, send)
            return
        here = asyncio.get_running_loop()

        def on_this_loop(call: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
            async def moved(*args: Any) -> Any:
                if asyncio.get_running_loop() is here:
                    return await call(*args)

                async def there() -> Any:
                    return await call(*args)

                return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(there(), here))

            return moved

        await self._run(self._stream(method, headers, on_this_loop(receive), on_this_loop(send)))

    async def _stream(
        self, method: RpcMethod, headers: Mapping[str, str], receive: Receive, send: Send
    ) -> None:
        """A streaming call: each message handed to the servicer as it arrives, each response written
        as it comes, then the status in the trailers; nothing written where the client left."""
        task = asyncio.current_task()
        assert task is not None
        frames = _Frames(receive, headers, self.options.max_receive_message_bytes, task)
        encoding = self._response_encoding(headers)
        limit = self.options.max_send_message_bytes
        started = False
        code, message = grpc.StatusCode.OK, ""
        try:
            async for response in answer_stream(
                method, frames.messages(method.request_type.FromString), lambda: headers
            ):
                data = response.SerializeToString()
                if len(data) > limit:
                    raise TooLarge(f"Sent message larger than max ({len(data)} vs. {limit})")
                flag = b"\x00"
                if encoding is not None:
                    data, flag = compress(data, encoding), b"\x01"
                if not started:
                    head = [_CONTENT_TYPE]
                    if encoding is not None:
                        head.append((b"grpc-encoding", encoding.encode()))
                    await send(
                        {
                            "type": "http.response.start",
                            "status": 200,
                            "headers": head,
                            "trailers": True,
                            STREAMED_RESPONSE: True,
                        }
                    )
                    started = True
                await send(
                    {
                        "type": "http.response.body",
                        "body": flag + len(data).to_bytes(4, "big") + data,
                        "more_body": True,
                    }
                )
        except asyncio.CancelledError:
            if not frames.gone:
                raise
            task.uncancel()
            return  # the client went away: nobody reads an answer
        except _ClientGone:
            return
        except Exception as e:
            code, message = status_of(e, method.name)
        finally:
            frames.finish()
        if not started:  # a trailers-only answer; the connection closes where the body was not all read
            await _answer_status(send, code, message, close=not frames.ended)
            return
        tail = [(b"grpc-status", str(code.value[0]).encode())]
        if message:
            tail.append((b"grpc-message", percent_encoded(message)))
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        await send({"type": TRAILERS_EXTENSION, "headers": tail, "more_trailers": False})

    async def _answer(self, send: Send, method: RpcMethod, response: Any, headers: Mapping[str, str]) -> None:
        parts: list[Any] = (
            response.parts() if isinstance(response, Tailed) else [response.SerializeToString()]
        )
        head = [_CONTENT_TYPE]
        flag = b"\x00"
        encoding = self._response_encoding(headers)
        if encoding is not None:
            parts, flag = [compress(b"".join(parts), encoding)], b"\x01"
            head.append((b"grpc-encoding", encoding.encode()))
        size = sum(len(part) for part in parts)
        await send({"type": "http.response.start", "status": 200, "headers": head, "trailers": True})
        # the frame's prefix and each part are body messages of their own: nothing is joined to send them
        await send({"type": "http.response.body", "body": flag + size.to_bytes(4, "big"), "more_body": True})
        for index, part in enumerate(parts):
            await send({"type": "http.response.body", "body": part, "more_body": index < len(parts) - 1})
        await send({"type": TRAILERS_EXTENSION, "headers": [(b"grpc-status", b"0")], "more_trailers": False})


class _ClientGone(Exception):
    """The client of a stream went away (its connection closed) while the stream read its messages."""


class _Frames:
    """A stream's request messages, read from its body as they arrive.

    Each message is refused over ``limit`` from its frame's head, before its bytes are read, and
    inflated where its flag says so (``grpc-encoding``). Once the client half-closed (the body
    ended), the connection is watched: its closing cancels ``task``, the stream's, as a cancelled
    call does."""

    def __init__(
        self, receive: Receive, headers: Mapping[str, str], limit: int, task: asyncio.Task[Any]
    ) -> None:
        self.receive = receive
        self.encoding = headers.get("grpc-encoding", "identity")
        self.limit = limit
        self.task = task
        self.buffer = bytearray()
        self.ended = False  # the client half-closed
        self.gone = False  # the client's connection closed
        self.finished = False  # the stream is answered: a closing connection no longer cancels it
        self.watcher: asyncio.Task[None] | None = None

    async def messages(self, parse: Callable[[bytes], Any]) -> AsyncIterator[Any]:
        while True:
            while len(self.buffer) >= _FRAME:
                size = int.from_bytes(self.buffer[1:_FRAME], "big")
                if size > self.limit:
                    raise TooLarge(f"Received message larger than max ({size} vs. {self.limit})")
                if len(self.buffer) < _FRAME + size:
                    break
                compressed = self.buffer[0] == 1
                data = bytes(self.buffer[_FRAME : _FRAME + size])
                del self.buffer[: _FRAME + size]
                yield _parse_message(parse, self._inflated(data) if compressed else data)
            if self.ended:
                if self.buffer:
                    raise InternalError("the request message is incomplete")
                return
            event = await self.receive()
            if event["type"] == "http.disconnect":
                self.gone = True
                raise _ClientGone()
            self.buffer += event.get("body", b"")
            if not event.get("more_body", False):
                self.ended = True
                self.watcher = asyncio.get_running_loop().create_task(self._watch())

    def _inflated(self, data: bytes) -> bytes:
        if self.encoding not in ("gzip", "deflate"):
            raise Unsupported(f"a compressed message with grpc-encoding '{self.encoding}'")
        try:
            return bytes(decompress(data, self.encoding, self.limit))
        except TooLarge:
            raise TooLarge(f"Received message larger than max (inflated beyond {self.limit} bytes)") from None
        except zlib.error as e:
            raise InternalError(f"failed to decompress the request message: {e}") from None

    async def _watch(self) -> None:
        # after the body, a server's receive() waits until the connection closes (or the answer is
        # complete); one that hands out more request events cannot be watched this way
        if (await self.receive())["type"] == "http.disconnect" and not self.finished:
            self.gone = True
            self.task.cancel()

    def finish(self) -> None:
        """The stream is answered (or abandoned): stop watching its connection."""
        self.finished = True
        if self.watcher is not None and not self.watcher.done():
            self.watcher.cancel()


def _parse_message(parse: Callable[[bytes], Any], data: bytes) -> Any:
    try:
        return parse(data)
    except DecodeError as e:
        raise InternalError(f"failed to parse the request message: {e}") from None


def _parse(method: RpcMethod, data: bytes | memoryview) -> Any:
    """The request message; a large ``ModelInfer`` one with its tensors' bytes left in place."""
    if method.name == "ModelInfer" and len(data) >= TAIL_MIN_BYTES:
        return split(data, method.request_type, "raw_input_contents", RAW_INPUT_FIELD)
    return method.request_type.FromString(data)


def _headers(scope: Scope) -> dict[str, str]:
    """The request's headers (the call's metadata) by lower-case name; the last of a repeated one."""
    return {
        name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope.get("headers", ())
    }


def _tokens(value: str) -> set[str]:
    return {token.strip().lower() for token in value.split(",")}


async def _answer_status(send: Send, code: grpc.StatusCode, message: str, close: bool = False) -> None:
    """A trailers-only answer: the status in the response head, no message."""
    head = [
        _CONTENT_TYPE,
        (b"grpc-status", str(code.value[0]).encode()),
        (b"grpc-message", percent_encoded(message)),
        (b"content-length", b"0"),
    ]
    if close:
        head.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": 200, "headers": head})
    await send({"type": "http.response.body", "body": b""})


def percent_encoded(text: str) -> bytes:
    """``grpc-message``'s encoding: UTF-8, with '%' and bytes outside printable ASCII as ``%XX``."""
    return "".join(
        chr(b) if 0x20 <= b <= 0x7E and b != 0x25 else f"%{b:02X}" for b in text.encode("utf-8")
    ).encode("ascii")


__all__ = ["PATH_PREFIX", "STREAMED_RESPONSE", "TRAILERS_EXTENSION", "GrpcOverHttp1", "percent_encoded"]
