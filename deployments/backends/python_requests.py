"""Requests, responses, response senders and BLS calls of ``triton_python_backend_utils``.

A Python model sees the server's requests as :class:`InferenceRequest`
objects and answers with :class:`InferenceResponse` objects, returned from
``execute`` or sent through a request's :class:`InferenceResponseSender`
(decoupled models). ``InferenceRequest(...).exec()`` and ``async_exec()``
run another model through the serving layer's :class:`ModelExecutor` (BLS).

Sync ``execute`` runs in a worker thread while the replica's event loop keeps
running; ``exec()`` hands the call to that loop with
``asyncio.run_coroutine_threadsafe`` and waits for it, so BLS works from sync
and async models alike.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import json
import queue
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from deployments.backends import python_utils
from deployments.backends.python_utils import (
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    PreferredMemory,
    Tensor,
    TritonError,
    TritonModelException,
    from_server_error,
    to_server_error,
)
from deployments.inference import InferRequest, InferResponse, ModelExecutor, RequestedOutput
from repository_loader.errors import ServerError, Unavailable

T = TypeVar("T")

# --- BLS ---------------------------------------------------------------------

_TIMEOUT_MESSAGE = "Request timeout expired"


@dataclass
class BlsBridge:
    """Where a Python model's BLS calls go: the executor and the loop it runs on."""

    executor: ModelExecutor | None
    loop: asyncio.AbstractEventLoop | None = None
    inline: bool = False  # execute() is running on the loop thread itself
    model_name: str = ""  # the model whose code runs in this context (for its log lines)

    def _executor(self) -> ModelExecutor:
        if self.executor is None:
            raise TritonModelException("BLS is unavailable: this server gave the model no executor")
        return self.executor

    def run_sync(self, work: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run the coroutine ``work()`` makes from synchronous model code and wait for its result.

        From a worker thread (or a thread the model starts) it runs on the replica's loop;
        with no loop at all (``initialize`` called outside one) on a loop of its own.
        """
        return self._submit(work).result() if self._loop_elsewhere() else asyncio.run(work())

    def _loop_elsewhere(self) -> bool:
        """Whether the replica's loop runs in another thread (and this thread may block on it)."""
        running = _running_loop()
        if running is not None and running is self.loop:
            if self.inline:
                raise NeedsWorkerThread()
            raise TritonModelException(
                "exec() cannot block the server's event loop: use 'await request.async_exec()' in an async execute"
            )
        if self.loop is not None and self.loop.is_running():
            return True
        if running is not None:
            raise TritonModelException("exec() cannot block a running event loop: use async_exec()")
        return False

    def _submit(self, work: Callable[[], Coroutine[Any, Any, T]]) -> concurrent.futures.Future[T]:
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(work(), self.loop)

    async def run_async(self, work: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run the coroutine ``work()`` makes from async model code, on the replica's loop."""
        if self.loop is None or not self.loop.is_running() or _running_loop() is self.loop:
            return await work()
        return await asyncio.wrap_future(self._submit(work))

    def infer_sync(self, request: InferRequest) -> InferResponse:
        """Run ``request`` from synchronous model code (a worker or the model's own thread)."""
        executor = self._executor()
        return self.run_sync(lambda: _infer(executor, request))

    async def infer_async(self, request: InferRequest) -> InferResponse:
        """Run ``request`` from async model code, on whichever loop the model awaits from."""
        executor = self._executor()
        return await self.run_async(lambda: _infer(executor, request))

    def stream_sync(self, request: InferRequest, memory: PreferredMemory | None = None) -> ResponseIterator:
        """Start ``request`` on a decoupled model; its responses arrive through the iterator."""
        executor = self._executor()
        iterator = ResponseIterator(memory)
        if self._loop_elsewhere():
            iterator.future = self._submit(lambda: iterator.pump(_stream(executor, request)))
        else:
            asyncio.run(iterator.pump(_stream(executor, request)))
        return iterator

    async def stream_async(self, request: InferRequest) -> list[InferResponse]:
        """Every response of ``request`` on a decoupled model, once the last has arrived."""
        executor = self._executor()

        async def collect() -> list[InferResponse]:
            return [response async for response in _stream(executor, request)]

        return await self.run_async(collect)

    def control(self, method: str, *args: Any) -> Any:
        """Call the executor's model control ``method`` (``load_model``, ``unload_model``, ``is_model_ready``)."""
        executor = self._executor()
        call = getattr(executor, method, None)
        if call is None:
            raise TritonModelException(
                f"{method} is not supported: this server gives models no model control"
            )

        async def run() -> Any:
            try:
                return await call(*args)
            except ServerError as error:
                raise TritonModelException(error.message) from None

        return self.run_sync(run)


async def _infer(executor: ModelExecutor, request: InferRequest) -> InferResponse:
    """One response for ``request``: the executor's errors and an expired timeout become error responses."""
    try:
        if request.timeout_us > 0:
            return await asyncio.wait_for(executor.infer(request), request.timeout_us / 1e6)
        return await executor.infer(request)
    except TimeoutError:
        return InferResponse(error=Unavailable(_TIMEOUT_MESSAGE), model_name=request.model_name)
    except ServerError as error:
        return InferResponse(error=error, model_name=request.model_name)


async def _stream(executor: ModelExecutor, request: InferRequest) -> AsyncGenerator[InferResponse, None]:
    """Every response of ``request`` in order, the last one final (an error ends the stream)."""
    stream = getattr(executor, "stream", None)
    if stream is None:  # an executor without streaming: the one response it gives
        response = await _infer(executor, request)
        response.final = True
        yield response
        return
    deadline = time.monotonic() + request.timeout_us / 1e6 if request.timeout_us > 0 else None
    responses = stream(request)
    try:
        while True:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:
                response = await asyncio.wait_for(anext(responses), remaining)
            except StopAsyncIteration:
                return
            yield response
            if response.final:
                return
    except TimeoutError:
        yield InferResponse(error=Unavailable(_TIMEOUT_MESSAGE), model_name=request.model_name)
    except ServerError as error:
        yield InferResponse(error=error, model_name=request.model_name)
    finally:
        await responses.aclose()


_END = object()


class ResponseIterator:
    """The responses of a BLS call to a decoupled model, as they arrive (``exec(decoupled=True)``).

    Iterating blocks until the next response; the last one carries the end of
    the stream (it may have no output tensors). ``cancel()`` stops the call.
    """

    def __init__(self, memory: PreferredMemory | None = None) -> None:
        self._memory = memory
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._cancelled = threading.Event()
        self._done = False
        self.future: concurrent.futures.Future[None] | None = None

    async def pump(self, responses: AsyncGenerator[InferResponse, None]) -> None:
        try:
            async for response in responses:
                if self._cancelled.is_set():
                    break
                self._queue.put(InferenceResponse.from_server(response, self._memory))
        except Exception as error:  # never leave the reader waiting
            self._queue.put(InferenceResponse(error=TritonError(f"{type(error).__name__}: {error}")))
        finally:
            await responses.aclose()
            self._queue.put(_END)

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        if self._done:
            raise StopIteration
        item = self._queue.get()
        if item is _END:
            self._done = True
            raise StopIteration
        return item

    def cancel(self) -> None:
        """Stop receiving: the called model sees the request cancelled."""
        self._cancelled.set()


class NeedsWorkerThread(BaseException):
    """A sync ``exec()`` from an ``execute`` run on the loop thread: the batch must run in the worker thread.

    A ``BaseException`` so that a model's own ``except Exception`` does not swallow it.
    """


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


_BRIDGE: contextvars.ContextVar[BlsBridge | None] = contextvars.ContextVar("pb_utils_bridge", default=None)
_default_bridge: BlsBridge | None = None


def set_bridge(bridge: BlsBridge, default: bool = True) -> contextvars.Token[BlsBridge | None]:
    """Make ``bridge`` the target of BLS calls in this context (and for threads the model starts)."""
    global _default_bridge
    if default:
        _default_bridge = bridge
    return _BRIDGE.set(bridge)


def reset_bridge(token: contextvars.Token[BlsBridge | None]) -> None:
    _BRIDGE.reset(token)


def current_model_name() -> str:
    """The name of the Python model whose code runs in this context ("" outside any)."""
    bridge = _BRIDGE.get() or _default_bridge
    return bridge.model_name if bridge is not None else ""


python_utils.current_model_name = current_model_name


def current_bridge() -> BlsBridge:
    bridge = _BRIDGE.get() or _default_bridge
    if bridge is None:
        raise TritonModelException("BLS is unavailable: no Python model is loaded in this process")
    return bridge


# --- responses -------------------------------------------------------------------


class InferenceResponse:
    """A response: output tensors, or an error."""

    def __init__(
        self,
        output_tensors: list[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        if output_tensors is None:
            output_tensors = []
        if not isinstance(output_tensors, list):
            raise TritonModelException('"output_tensors" must be a list.')
        if error is not None and not isinstance(error, TritonError):
            error = TritonError(str(error))
        self._output_tensors = output_tensors
        self._error = error
        self._parameters = _parameters_json(parameters)
        self._final = True  # BLS: whether this is the last response of a decoupled model's stream

    def output_tensors(self) -> list[Tensor]:
        return self._output_tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters

    def to_server(
        self, model_name: str, model_version: str, request_id: str, wanted: list[str]
    ) -> InferResponse:
        """The server's response; only the outputs the request asked for are kept, as in Triton."""
        error = to_server_error(self._error) if self._error is not None else None
        outputs = {} if error else {t.name(): t.data() for t in self._output_tensors if t.name() in wanted}
        return InferResponse(
            outputs=outputs,
            error=error,
            parameters=json.loads(self._parameters),
            model_name=model_name,
            model_version=model_version,
            id=request_id,
        )

    @staticmethod
    def from_server(response: InferResponse, memory: PreferredMemory | None = None) -> InferenceResponse:
        """A BLS call's response; ``memory`` moves its outputs where the caller prefers them."""
        if response.error is not None:
            converted = InferenceResponse([], error=from_server_error(response.error))
        else:
            place = memory.place if memory is not None else _same
            tensors = [Tensor(name, place(data)) for name, data in response.outputs.items()]
            converted = InferenceResponse(tensors, parameters=dict(response.parameters))
        converted._final = response.final
        return converted


def _same(data: Any) -> Any:
    return data


def _parameters_json(parameters: dict[str, Any] | str | None) -> str:
    """Parameters as a JSON object string: from a dict of bool, int or str values, or a JSON string."""
    if parameters is None:
        return "{}"
    if isinstance(parameters, (str, bytes)):
        try:
            decoded = json.loads(parameters)
        except ValueError as error:
            raise TritonModelException(f"parameters must be a JSON object: {error}") from None
        if not isinstance(decoded, dict):
            raise TritonModelException("parameters must be a JSON object")
        return parameters if isinstance(parameters, str) else parameters.decode()
    if not isinstance(parameters, dict):
        raise TritonModelException(
            f"parameters must be a dict or a JSON string, not {type(parameters).__name__}"
        )
    for key, value in parameters.items():
        if not isinstance(key, str) or not isinstance(value, (bool, int, str)):
            raise TritonModelException(
                f"parameter {key!r}: keys must be str and values bool, int or str, not {type(value).__name__}"
            )
    return json.dumps(parameters)


class InferenceResponseSender:
    """Sends the responses of one request (decoupled models), the last flagged FINAL."""

    def __init__(self, channel: ResponseChannel) -> None:
        self._channel = channel

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        final = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if response is None and not final:
            raise TritonModelException(
                "send() needs a response unless flags is TRITONSERVER_RESPONSE_COMPLETE_FINAL"
            )
        self._channel.put(response, final)

    def is_cancelled(self) -> bool:
        return self._channel.cancelled


class ResponseChannel:
    """The responses one request gets, handed from any thread to the replica's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[tuple[InferenceResponse | None, bool, Any]] = asyncio.Queue()
        self.closed = False
        self.cancelled = False

    def put(self, response: InferenceResponse | None, final: bool) -> None:
        if self.closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        self.closed = final
        self._push((response, final, None))

    def fail(self, error: Any) -> None:
        """End the request with ``error`` (a ``ServerError``) unless it already ended."""
        if not self.closed:
            self.closed = True
            self._push((None, True, error))

    def _push(self, item: tuple[InferenceResponse | None, bool, Any]) -> None:
        if _running_loop() is self._loop:
            self._queue.put_nowait(item)
        else:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    async def items(self) -> AsyncIterator[tuple[InferenceResponse | None, bool, Any]]:
        """``(response, final, error)`` until the final one."""
        while True:
            item = await self._queue.get()
            yield item
            if item[1]:
                return


# --- requests ----------------------------------------------------------------------


def _text(value: Any) -> str:
    """A model name or version given as ``str``, ``bytes`` (a BYTES tensor element) or a number."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8")
    return str(value)


class InferenceRequest:
    """A request a Python model receives, or builds to call another model (BLS).

    ``timeout`` is in microseconds, as in Triton; ``model_name`` may be ``str`` or
    ``bytes``; ``parameters`` a dict (bool, int or str values) or a JSON string.
    """

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str] | None = None,
        model_name: str | bytes = "",
        model_version: int | str = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: Any = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        if preferred_memory is not None and not isinstance(preferred_memory, PreferredMemory):
            raise TritonModelException("preferred_memory must be a pb_utils.PreferredMemory")
        self._request_id = _text(request_id)
        self._correlation_id = (
            correlation_id.decode() if isinstance(correlation_id, bytes) else correlation_id
        )
        self._inputs = list(inputs or [])
        self._requested_output_names = [_text(n) for n in requested_output_names or []]
        self._model_name = _text(model_name)
        self._model_version = _version(model_version)
        self._flags = int(flags)
        self._timeout = int(timeout)
        self._preferred_memory = preferred_memory
        self._trace = trace
        self._parameters = _parameters_json(parameters)
        self._sender: InferenceResponseSender | None = None
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def requested_output_names(self) -> list[str]:
        return self._requested_output_names

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        """The request's timeout in microseconds (0: none)."""
        return self._timeout

    def parameters(self) -> str:
        """The request's parameters as a JSON object string."""
        return self._parameters

    def trace(self) -> Any:
        return self._trace

    def set_release_flags(self, flags: int) -> None:
        """``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``: run this request again in a later ``execute``."""
        if flags not in (TRITONSERVER_REQUEST_RELEASE_ALL, TRITONSERVER_REQUEST_RELEASE_RESCHEDULE):
            raise TritonModelException(
                "release flags must be TRITONSERVER_REQUEST_RELEASE_ALL or TRITONSERVER_REQUEST_RELEASE_RESCHEDULE"
            )
        self._release_flags = flags

    def take_reschedule(self) -> bool:
        """Whether the model asked to run this request again (and reset that for the next run)."""
        rescheduled = self._release_flags == TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        return rescheduled and not (self._sender is not None and self._sender._channel.closed)

    def is_cancelled(self) -> bool:
        return self._sender.is_cancelled() if self._sender else False

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            raise TritonModelException("only requests the model receives have a response sender")
        return self._sender

    # --- BLS ---

    def to_server(self) -> InferRequest:
        """This BLS request as the server's request; tensors are passed on, not copied."""
        if not self._model_name:
            raise TritonModelException("a BLS request needs a model_name")
        outputs = [RequestedOutput(n) for n in self._requested_output_names] or None
        return InferRequest(
            model_name=self._model_name,
            model_version="" if self._model_version < 0 else str(self._model_version),
            inputs={t.name(): t.data() for t in self._inputs},
            id=self._request_id,
            requested_outputs=outputs,
            parameters=json.loads(self._parameters),
            correlation_id=self._correlation_id,
            sequence_start=bool(self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_START),
            sequence_end=bool(self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_END),
            timeout_us=self._timeout,
        )

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on its model and wait for the response.

        ``decoupled=True``: an iterator of the model's responses as they arrive,
        the last one ending the stream (it may carry no tensors).
        """
        bridge = current_bridge()
        if decoupled:
            return bridge.stream_sync(self.to_server(), self._preferred_memory)
        return InferenceResponse.from_server(bridge.infer_sync(self.to_server()), self._preferred_memory)

    async def async_exec(self, decoupled: bool = False) -> Any:
        """Awaitable form of :meth:`exec`; ``decoupled=True`` gives an iterable of every response."""
        bridge = current_bridge()
        if decoupled:
            responses = await bridge.stream_async(self.to_server())
            return iter([InferenceResponse.from_server(r, self._preferred_memory) for r in responses])
        response = await bridge.infer_async(self.to_server())
        return InferenceResponse.from_server(response, self._preferred_memory)

    @staticmethod
    def from_server(
        request: InferRequest, output_names: list[str], channel: ResponseChannel
    ) -> InferenceRequest:
        """The request a Python model receives for the server's ``request``."""
        flags = (TRITONSERVER_REQUEST_FLAG_SEQUENCE_START if request.sequence_start else 0) | (
            TRITONSERVER_REQUEST_FLAG_SEQUENCE_END if request.sequence_end else 0
        )
        received = InferenceRequest.__new__(InferenceRequest)
        received._request_id = request.id
        received._correlation_id = request.correlation_id
        received._inputs = [Tensor(name, data) for name, data in request.inputs.items()]
        received._requested_output_names = request.output_names(output_names)
        received._model_name = request.model_name
        received._model_version = _version(request.model_version)
        received._flags = flags
        received._timeout = request.timeout_us
        received._preferred_memory = None
        received._trace = None
        received._parameters = json.dumps(request.parameters)
        received._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        received._sender = InferenceResponseSender(channel)
        return received


def _version(value: Any) -> int:
    text = _text(value).strip() if value is not None else ""
    try:
        return int(text) if text else -1
    except ValueError:
        raise TritonModelException(f"model_version must be an integer, not {text!r}") from None


# --- model control (BLS) ----------------------------------------------------------------


def load_model(model_name: str | bytes, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) ``model_name`` from the repository; ``config`` a JSON override, ``files`` its files.

    The server decides whether loading is allowed (its model control mode).
    """
    current_bridge().control("load_model", _text(model_name), config, dict(files or {}))


def unload_model(model_name: str | bytes, unload_dependents: bool = False) -> None:
    """Unload ``model_name`` (and the models that depend on it when ``unload_dependents``)."""
    current_bridge().control("unload_model", _text(model_name), bool(unload_dependents))


def is_model_ready(model_name: str | bytes, model_version: str = "") -> bool:
    """Whether ``model_name`` (the given version, or the policy's choice) is ready for inference."""
    return bool(current_bridge().control("is_model_ready", _text(model_name), _text(model_version)))
