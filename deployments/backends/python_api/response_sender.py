"""``pb_utils.InferenceResponseSender``: how a decoupled model sends a request's responses.

A model may send from ``execute`` or from threads of its own; each response
crosses to the replica's event loop through the request's
:class:`ResponseChannel`, which the backend drains.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from deployments.backends.python_api.errors import TritonModelException
from deployments.backends.python_api.response import InferenceResponse

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1


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
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:  # a thread without a loop (the worker, or one the model started)
            on_loop = False
        if on_loop:
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
