"""``pb_utils.InferenceResponseSender``: how a model sends a request's responses itself.

A model may send from ``execute`` or from threads of its own; each response
crosses to the replica's event loop through the request's
:class:`ResponseChannel`, which the backend drains. The sender keeps Triton's
rules and wording: a decoupled model sends any number of responses and then
the FINAL flag; a non-decoupled one sends exactly one response, whose arrival
answers the request (a FINAL flag may follow it).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from deployments.backends.python_api.errors import TritonModelException
from deployments.backends.python_api.response import InferenceResponse
from repository_loader.errors import InternalError

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1

# Triton's messages for a misused response sender (clients and log readers look for them)
UNSUPPORTED_FLAG = "Unable to send response. Unsupported flag provided."
RESPONSE_REQUIRED = "Inference Response object must be provided when the response flags is set to zero."
MORE_THAN_ONE = "Unable to send response. Non-decoupled model cannot send more than one response."
FINAL_BEFORE_RESPONSE = (
    "Unable to send response. Non-decoupled model cannot send complete final before sending a response."
)
SENDER_CLOSED = "Unable to send response. Response sender has been closed."
RELEASED_OPEN = (
    "the model released the request's response sender without sending the final flag "
    "(TRITONSERVER_RESPONSE_COMPLETE_FINAL); no further response can come"
)


class InferenceResponseSender:
    """Sends the responses of one request; the FINAL flag closes it."""

    def __init__(self, channel: ResponseChannel) -> None:
        self._channel = channel

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException(UNSUPPORTED_FLAG)
        if flags == 0 and response is None:
            raise TritonModelException(RESPONSE_REQUIRED)
        self._channel.put(response, flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def is_cancelled(self) -> bool:
        return self._channel.cancelled

    def __del__(self) -> None:
        # the model let go of its request without the FINAL flag (a response thread that died, a request
        # dropped): nothing can answer it any more, so its client gets an error instead of waiting forever
        channel = self.__dict__.get("_channel")
        if channel is None or channel.closed:
            return
        with contextlib.suppress(
            Exception
        ):  # the replica's loop is gone (the process ends): no client either
            channel.fail(InternalError(RELEASED_OPEN))


class ResponseChannel:
    """The responses one request gets, handed from any thread to the replica's event loop.

    ``closed`` is the sender's state (the FINAL flag was sent, or the request
    failed); ``answered`` says whether the client has its last response: for a
    non-decoupled model that is the first response sent.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, decoupled: bool = True) -> None:
        self._loop = loop
        self._items: deque[tuple[InferenceResponse | None, bool, Any]] = deque()  # sent, not yet read
        self._reader: asyncio.Future[None] | None = None  # the reader waiting for an item, if any
        self._lock = threading.Lock()
        self.decoupled = decoupled
        self.sent = 0
        self.closed = False
        self.answered = False
        self._cancelled = False
        self.origin: Any = None  # the server's request (``InferRequest``): its client may cancel it

    @property
    def cancelled(self) -> bool:
        """The request was cancelled: its stream's reader stopped, or its client went away."""
        return self._cancelled or (self.origin is not None and self.origin.cancelled)

    @cancelled.setter
    def cancelled(self, value: bool) -> None:
        self._cancelled = value

    def put(self, response: InferenceResponse | None, final: bool) -> None:
        """Send ``response`` (None: only the flag), after Triton's checks of the sender's state."""
        with self._lock:
            self.check(response, final)
            self.closed = self.closed or final
            self.sent += 1
            if self.answered:
                return  # a non-decoupled request already has its response; a FINAL flag follows it
            if not self.decoupled:
                if response is None:
                    return
                final = True
            self.answered = final
        self._push((response, final, None))

    def check(self, response: InferenceResponse | None, final: bool) -> None:
        """Raise Triton's error if sending ``response`` (with ``final``) now is a mistake."""
        if not self.decoupled:
            if response is not None and self.sent > 0:
                raise TritonModelException(MORE_THAN_ONE)
            if response is None and final and self.sent == 0:
                raise TritonModelException(FINAL_BEFORE_RESPONSE)
        if self.closed:
            raise TritonModelException(SENDER_CLOSED)

    def fail(self, error: Any) -> None:
        """Answer the request with ``error`` (a ``ServerError``) unless it has its last response; close it."""
        with self._lock:
            self.closed = True
            if self.answered:
                return
            self.answered = True
        self._push((None, True, error))

    def _push(self, item: tuple[InferenceResponse | None, bool, Any]) -> None:
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:  # a thread without a loop (the worker, or one the model started)
            on_loop = False
        if on_loop:
            self._append(item)
        else:
            self._loop.call_soon_threadsafe(self._append, item)

    def _append(self, item: tuple[InferenceResponse | None, bool, Any]) -> None:
        """On the loop: keep ``item`` for the reader, and wake it if it waits."""
        self._items.append(item)
        reader = self._reader
        if reader is not None and not reader.done():
            reader.set_result(None)

    def take_all_now(self) -> list[tuple[InferenceResponse | None, bool, Any]] | None:
        """Every item sent so far when the final one is among them (the usual case: ``execute``
        returned its responses on the event loop), read without waiting; None otherwise, the items
        then kept for :meth:`items`."""
        items = self._items
        if items and items[-1][1]:
            taken = list(items)
            items.clear()
            return taken
        return None

    async def items(self) -> AsyncIterator[tuple[InferenceResponse | None, bool, Any]]:
        """``(response, final, error)`` until the final one."""
        items = self._items
        while True:
            while items:
                item = items.popleft()
                yield item
                if item[1]:
                    return
            self._reader = self._loop.create_future()
            try:
                await self._reader
            finally:
                self._reader = None
