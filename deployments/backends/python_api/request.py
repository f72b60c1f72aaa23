"""``pb_utils.InferenceRequest``: a request a Python model receives, or builds to call another model.

The backend builds the received form from the server's request
(:meth:`InferenceRequest.from_server`), with the response sender a decoupled
model answers through. A model builds one itself for BLS; ``exec()`` and
``async_exec()`` send it through the context's :mod:`bls` bridge.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from deployments import tensors as arrays
from deployments.backends.python_api.context import current_bridge
from deployments.backends.python_api.errors import TritonModelException
from deployments.backends.python_api.response import InferenceResponse, parameters_json
from deployments.backends.python_api.response_sender import InferenceResponseSender, ResponseChannel
from deployments.backends.python_api.tensor import PreferredMemory, Tensor
from deployments.inference import InferRequest, RequestedOutput
from deployments.tracing import TraceParent

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


def as_text(value: Any) -> str:
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
        _check_arguments(inputs, requested_output_names, model_name, correlation_id)
        _check_scalars(request_id=request_id, model_version=model_version, flags=flags, timeout=timeout)
        self._request_id = as_text(request_id)
        self._correlation_id = (
            correlation_id.decode() if isinstance(correlation_id, bytes) else correlation_id
        )
        self._inputs = list(inputs or [])
        self._requested_output_names = [as_text(n) for n in requested_output_names or []]
        self._model_name = as_text(model_name)
        self._model_version = _version(model_version)
        self._flags = int(flags)
        self._timeout = int(timeout)
        self._preferred_memory = preferred_memory
        self._trace = trace
        self._parameters = parameters_json(parameters)
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

    def release_flags(self) -> int:
        """The flags the model set with :meth:`set_release_flags` for the current ``execute``."""
        return self._release_flags

    def take_reschedule(self) -> bool:
        """Whether the model asked to run this request again (and reset that for the next run)."""
        rescheduled = self._release_flags == TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        return rescheduled and not (self._sender is not None and self._sender._channel.closed)

    def is_cancelled(self) -> bool:
        return self._sender.is_cancelled() if self._sender else False

    def mark_cancelled(self) -> None:
        """The server's side: the client went away, so :meth:`is_cancelled` answers True from now on."""
        if self._sender is not None:
            self._sender._channel.cancelled = True

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
            trace=self._trace.parent if isinstance(self._trace, InferenceTrace) else None,
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
        request: InferRequest, output_names: list[str], channel: ResponseChannel, host_inputs: bool = True
    ) -> InferenceRequest:
        """The request a Python model receives for the server's ``request``.

        ``host_inputs``: device tensors are copied to the host first (Triton's default; a model
        sets ``FORCE_CPU_ONLY_INPUT_TENSORS: "no"`` to receive them where they are).
        """
        flags = (TRITONSERVER_REQUEST_FLAG_SEQUENCE_START if request.sequence_start else 0) | (
            TRITONSERVER_REQUEST_FLAG_SEQUENCE_END if request.sequence_end else 0
        )
        received = InferenceRequest.__new__(InferenceRequest)
        received._request_id = request.id
        received._correlation_id = request.correlation_id
        received._inputs = [
            Tensor(name, data if _stays(data, host_inputs) else arrays.to_numpy(data))
            for name, data in request.inputs.items()
        ]
        received._requested_output_names = request.output_names(output_names)
        received._model_name = request.model_name
        received._model_version = _version(request.model_version)
        received._flags = flags
        received._timeout = request.timeout_us
        received._preferred_memory = None
        received._trace = InferenceTrace(request.trace)
        received._parameters = json.dumps(request.parameters)
        received._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        channel.origin = request
        received._sender = InferenceResponseSender(channel)
        return received


class InferenceTrace:
    """``request.trace()``: the trace a received request belongs to. Pass it as ``trace=`` to a BLS
    request, as in Triton, and the called model's spans hang under this model's span."""

    __slots__ = ("parent",)

    def __init__(self, parent: TraceParent | None) -> None:
        self.parent = parent

    def get_context(self) -> str | None:
        """The OpenTelemetry context as Triton gives it (``{"traceparent": ...}`` as JSON), or None
        where the request is not traced."""
        if self.parent is None:
            return None
        return json.dumps({"traceparent": self.parent.header()})


def _stays(data: Any, host_inputs: bool) -> bool:
    """Whether an input reaches ``execute`` as it is (host arrays always do)."""
    return type(data) is np.ndarray or not host_inputs or arrays.is_host(data)


def _version(value: Any) -> int:
    text = as_text(value).strip() if value is not None else ""
    try:
        return int(text) if text else -1
    except ValueError:
        raise TritonModelException(f"model_version must be an integer, not {text!r}") from None


def _check_arguments(inputs: Any, requested_output_names: Any, model_name: Any, correlation_id: Any) -> None:
    """Refuse what Triton's bindings refuse: ``TypeError`` for an argument of the wrong type (``None``
    included), ``TritonModelException`` for an input that is not a tensor."""
    if not isinstance(inputs, list | tuple):
        raise TypeError(
            f"InferenceRequest(): 'inputs' must be a list of pb_utils.Tensor, not {type(inputs).__name__}"
        )
    if any(not isinstance(t, Tensor) for t in inputs):
        raise TritonModelException("InferenceRequest(): every element of 'inputs' must be a pb_utils.Tensor")
    if not isinstance(requested_output_names, list | tuple) or any(
        not isinstance(n, str | bytes) for n in requested_output_names
    ):
        raise TypeError("InferenceRequest(): 'requested_output_names' must be a list of str")
    if not isinstance(model_name, str | bytes):
        raise TypeError(f"InferenceRequest(): 'model_name' must be a str, not {type(model_name).__name__}")
    if not isinstance(correlation_id, int | str | bytes) or isinstance(correlation_id, bool):
        raise TypeError(
            f"InferenceRequest(): 'correlation_id' must be an int or a str, not {type(correlation_id).__name__}"
        )


def _check_scalars(**arguments: Any) -> None:
    """``TypeError`` for a scalar argument given as ``None`` (Triton's bindings take none of them)."""
    for name, value in arguments.items():
        if value is None:
            raise TypeError(f"InferenceRequest(): '{name}' must not be None")
