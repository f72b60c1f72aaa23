"""BLS: how a Python model's ``InferenceRequest.exec()`` and ``async_exec()`` reach other models.

A :class:`BlsBridge` holds the serving layer's :class:`ModelExecutor` and the
replica's event loop. Sync ``execute`` runs in a worker thread while that loop
keeps running; ``exec()`` hands the call to the loop with
``asyncio.run_coroutine_threadsafe`` and waits for it, so BLS works from sync
and async models alike. Calls to decoupled models give their responses as
they arrive (:class:`ResponseIterator`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from collections.abc import AsyncGenerator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from deployments.backends.python_api.errors import TritonError, TritonModelException
from deployments.backends.python_api.response import InferenceResponse
from deployments.backends.python_api.tensor import PreferredMemory
from deployments.inference import InferRequest, InferResponse, ModelExecutor
from deployments.timeouts import within
from repository_loader.errors import ServerError, Unavailable

T = TypeVar("T")

_TIMEOUT_MESSAGE = "Request timeout expired"


@dataclass
class BlsBridge:
    """Where a Python model's BLS calls go: the executor and the loop it runs on."""

    executor: ModelExecutor | None
    loop: asyncio.AbstractEventLoop | None = None
    inline: bool = False  # execute() is running on the loop thread itself
    model_name: str = ""  # the model whose code runs in this context (for its log lines)
    model_dir: str = ""  # its version's folder (``pb_utils.get_model_dir()``)

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
            return await within(executor.infer(request), request.timeout_us / 1e6)
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
                response = await within(anext(responses), remaining)
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
