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
import contextvars
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from deployments.backends.python_utils import (
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    Tensor,
    TritonError,
    TritonModelException,
    from_server_error,
    to_server_error,
)
from deployments.inference import InferRequest, InferResponse, ModelExecutor, RequestedOutput

# --- BLS ---------------------------------------------------------------------


@dataclass
class BlsBridge:
    """Where a Python model's BLS calls go: the executor and the loop it runs on."""

    executor: ModelExecutor | None
    loop: asyncio.AbstractEventLoop | None = None
    inline: bool = False  # execute() is running on the loop thread itself

    def _executor(self) -> ModelExecutor:
        if self.executor is None:
            raise TritonModelException("BLS is unavailable: this server gave the model no executor")
        return self.executor

    def infer_sync(self, request: InferRequest) -> InferResponse:
        """Run ``request`` from synchronous model code (a worker or the model's own thread)."""
        executor = self._executor()
        running = _running_loop()
        if running is not None and running is self.loop:
            if self.inline:
                raise NeedsWorkerThread()
            raise TritonModelException(
                "exec() cannot block the server's event loop: use 'await request.async_exec()' in an async execute"
            )
        if self.loop is not None and self.loop.is_running():
            return asyncio.run_coroutine_threadsafe(executor.infer(request), self.loop).result()
        if running is not None:
            raise TritonModelException("exec() cannot block a running event loop: use async_exec()")
        return asyncio.run(executor.infer(request))

    async def infer_async(self, request: InferRequest) -> InferResponse:
        """Run ``request`` from async model code, on whichever loop the model awaits from."""
        executor = self._executor()
        if self.loop is None or not self.loop.is_running() or _running_loop() is self.loop:
            return await executor.infer(request)
        future = asyncio.run_coroutine_threadsafe(executor.infer(request), self.loop)
        return await asyncio.wrap_future(future)


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
        self._output_tensors = output_tensors
        self._error = error
        self._parameters = _parameters_json(parameters)

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
    def from_server(response: InferResponse) -> InferenceResponse:
        if response.error is not None:
            return InferenceResponse([], error=from_server_error(response.error))
        tensors = [Tensor(name, data) for name, data in response.outputs.items()]
        return InferenceResponse(tensors, parameters=dict(response.parameters))


def _parameters_json(parameters: dict[str, Any] | str | None) -> str:
    if parameters is None:
        return "{}"
    if isinstance(parameters, str):
        json.loads(parameters)  # must be valid JSON
        return parameters
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


class InferenceRequest:
    """A request a Python model receives, or builds to call another model (BLS)."""

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str] | None = None,
        model_name: str = "",
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: Any = None,
        trace: Any = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._inputs = list(inputs or [])
        self._requested_output_names = list(requested_output_names or [])
        self._model_name = model_name
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._parameters = _parameters_json(parameters)
        self._sender: InferenceResponseSender | None = None
        self._release_flags = 0

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
        return self._timeout

    def parameters(self) -> str:
        return self._parameters

    def set_release_flags(self, flags: int) -> None:
        self._release_flags = flags

    def is_cancelled(self) -> bool:
        return self._sender.is_cancelled() if self._sender else False

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            raise TritonModelException("only requests the model receives have a response sender")
        return self._sender

    # --- BLS ---

    def to_server(self) -> InferRequest:
        """This BLS request as the server's request; tensors are passed on, not copied."""
        outputs = [RequestedOutput(n) for n in self._requested_output_names] or None
        return InferRequest(
            model_name=self._model_name,
            model_version="" if self._model_version in (-1, None) else str(self._model_version),
            inputs={t.name(): t.data() for t in self._inputs},
            id=self._request_id,
            requested_outputs=outputs,
            parameters=json.loads(self._parameters),
            correlation_id=self._correlation_id,
            sequence_start=bool(self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_START),
            sequence_end=bool(self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_END),
            timeout_us=int(self._timeout) // 1000,
        )

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on its model and wait (an iterator of responses when ``decoupled``)."""
        bridge = current_bridge()
        response = InferenceResponse.from_server(bridge.infer_sync(self.to_server()))
        return iter([response]) if decoupled else response

    async def async_exec(self, decoupled: bool = False) -> Any:
        """Awaitable form of :meth:`exec`."""
        bridge = current_bridge()
        response = InferenceResponse.from_server(await bridge.infer_async(self.to_server()))
        return _single(response) if decoupled else response

    @staticmethod
    def from_server(
        request: InferRequest, output_names: list[str], channel: ResponseChannel
    ) -> InferenceRequest:
        """The request a Python model receives for the server's ``request``."""
        flags = (TRITONSERVER_REQUEST_FLAG_SEQUENCE_START if request.sequence_start else 0) | (
            TRITONSERVER_REQUEST_FLAG_SEQUENCE_END if request.sequence_end else 0
        )
        received = InferenceRequest(
            request_id=request.id,
            correlation_id=request.correlation_id,
            inputs=[Tensor(name, data) for name, data in request.inputs.items()],
            requested_output_names=request.output_names(output_names),
            model_name=request.model_name,
            model_version=int(request.model_version) if str(request.model_version).isdigit() else -1,
            flags=flags,
            timeout=request.timeout_us * 1000,
            parameters=dict(request.parameters),
        )
        received._sender = InferenceResponseSender(channel)
        return received


async def _single(response: InferenceResponse) -> AsyncIterator[InferenceResponse]:
    yield response
