"""Tensors, errors, type tables and helpers of Triton's ``triton_python_backend_utils``.

A user's ``model.py`` imports ``triton_python_backend_utils as pb_utils``;
that module re-exports this one and :mod:`deployments.backends.python_requests`.
Tensors wrap numpy arrays or DLPack-capable arrays (torch, CuPy) without
copying; ``to_dlpack``/``from_dlpack`` share the buffer.
"""

from __future__ import annotations

import logging
import sys
import weakref
from collections.abc import Callable
from enum import IntEnum
from typing import Any

import numpy as np

from deployments import custom_metrics
from deployments import tensors as arrays
from repository_loader import datatypes
from repository_loader.errors import ErrorCode, ServerError, error_for_code

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_CPU_PINNED = 1
TRITONSERVER_MEMORY_GPU = 2

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

# TRITONSERVER_DataType codes, as pb_utils.Tensor.triton_dtype() reports them
_TYPE_CODES: dict[str, int] = {
    "BOOL": 1,
    "UINT8": 2,
    "UINT16": 3,
    "UINT32": 4,
    "UINT64": 5,
    "INT8": 6,
    "INT16": 7,
    "INT32": 8,
    "INT64": 9,
    "FP16": 10,
    "FP32": 11,
    "FP64": 12,
    "BYTES": 13,
    "BF16": 14,
}
_WIRE_OF_CODE = {code: wire for wire, code in _TYPE_CODES.items()}


class TritonError(Exception):
    """An error a model reports in a response (``InferenceResponse(error=...)``) or raises."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str = "", code: int = INTERNAL) -> None:
        super().__init__(message)
        self._message = message
        self._code = int(code)

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._message


_CODE_NAMES = [
    ErrorCode.UNKNOWN,
    ErrorCode.INTERNAL,
    ErrorCode.NOT_FOUND,
    ErrorCode.INVALID_ARG,
    ErrorCode.UNAVAILABLE,
    ErrorCode.UNSUPPORTED,
    ErrorCode.ALREADY_EXISTS,
    ErrorCode.CANCELLED,
]


def to_server_error(error: TritonError) -> ServerError:
    """The server's error for a model's :class:`TritonError` (same code, same message)."""
    code = error.code()
    name = _CODE_NAMES[code] if 0 <= code < len(_CODE_NAMES) else ErrorCode.UNKNOWN
    return error_for_code(name, error.message())


def from_server_error(error: ServerError) -> TritonError:
    return TritonError(error.message, _CODE_NAMES.index(error.code))


class TritonModelException(Exception):
    """Raised by pb_utils calls that fail (and by models to fail a whole batch)."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self._message = message

    def message(self) -> str:
        return self._message

    def __str__(self) -> str:
        return self._message


class PreferredMemory:
    """Where a BLS call wants its output tensors: ``TRITONSERVER_MEMORY_CPU`` or ``_GPU`` and a device."""

    def __init__(
        self, preferred_memory_type: int = TRITONSERVER_MEMORY_CPU, preferred_device_id: int = 0
    ) -> None:
        self.preferred_memory_type = int(preferred_memory_type)
        self.preferred_device_id = int(preferred_device_id)

    def place(self, data: Any) -> Any:
        """``data`` moved to the preferred memory (unchanged when it is there already)."""
        if self.preferred_memory_type == TRITONSERVER_MEMORY_GPU:
            if arrays.device_of(data) == ("cuda", self.preferred_device_id):
                return data
            if isinstance(data, np.ndarray) and data.dtype == np.object_:
                return data  # BYTES stay on the host, as in Triton
            return arrays.to_torch(data, f"cuda:{self.preferred_device_id}")
        return data if arrays.is_host(data) else arrays.to_numpy(data)


class _Capsule:
    """Lets numpy import a raw DLPack capsule (assumed to describe host memory)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


class Tensor:
    """A named tensor of a request or response: a numpy array, or a DLPack array on a device."""

    def __init__(self, name: str, data: Any, triton_dtype: int | None = None) -> None:
        if isinstance(data, np.ndarray):
            if data.dtype.kind in ("U", "S"):
                data = np.vectorize(_as_bytes, otypes=[object])(data) if data.size else data.astype(object)
            elif data.dtype.kind == "V":
                raise TritonModelException(
                    f"tensor '{name}': numpy dtype {data.dtype} has no Triton data type"
                )
            if triton_dtype is not None:
                data = data.view(triton_to_numpy_type(triton_dtype))
        elif not hasattr(data, "__dlpack__"):
            data = np.asarray(data)
        self._name = name
        self._data = data

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        if not self.is_cpu():
            raise TritonModelException("Tensor is stored in GPU and cannot be converted to NumPy.")
        return arrays.to_numpy(self._data)

    def is_cpu(self) -> bool:
        return arrays.is_host(self._data)

    def shape(self) -> list[int]:
        return list(arrays.shape_of(self._data))

    def triton_dtype(self) -> int:
        return _TYPE_CODES[arrays.wire_datatype(self._data)]

    def data(self) -> Any:
        """The wrapped array itself (numpy, torch, ...)."""
        return self._data

    def to_dlpack(self) -> Any:
        """A DLPack capsule sharing this tensor's buffer."""
        data = self._data
        if isinstance(data, np.ndarray):
            if data.dtype == np.object_:
                raise TritonModelException(
                    f"tensor '{self._name}': BYTES tensors cannot be shared through DLPack"
                )
            try:
                return data.__dlpack__()
            except BufferError:  # read-only numpy views: share through torch
                return arrays.to_torch(data).__dlpack__()
        return data.__dlpack__()

    def __dlpack__(self, **kwargs: Any) -> Any:
        if isinstance(self._data, np.ndarray):
            return self.to_dlpack()
        return self._data.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        if isinstance(self._data, np.ndarray):
            return (1, 0)
        return self._data.__dlpack_device__()

    @staticmethod
    def from_dlpack(name: str, dlpack: Any) -> Tensor:
        """A tensor sharing the buffer of a DLPack capsule or of an object with ``__dlpack__``."""
        if isinstance(dlpack, np.ndarray) or arrays.is_torch(dlpack):
            return Tensor(name, dlpack)
        try:
            import torch.utils.dlpack as torch_dlpack

            return Tensor(name, torch_dlpack.from_dlpack(dlpack))
        except ImportError:
            source = dlpack if hasattr(dlpack, "__dlpack__") else _Capsule(dlpack)
            return Tensor(name, np.from_dlpack(source))

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={self.shape()}, cpu={self.is_cpu()})"


def _as_bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


# --- module-level helpers ----------------------------------------------------


def get_input_tensor_by_name(inference_request: Any, name: str) -> Tensor | None:
    return next((t for t in inference_request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(inference_response: Any, name: str) -> Tensor | None:
    return next((t for t in inference_response.output_tensors() if t.name() == name), None)


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((t for t in model_config.get("input", []) if t.get("name") == name), None)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((t for t in model_config.get("output", []) if t.get("name") == name), None)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool((model_config.get("model_transaction_policy") or {}).get("decoupled", False))


def triton_to_numpy_type(data_type: int) -> Any:
    wire = _WIRE_OF_CODE.get(int(data_type))
    if wire is None:
        return None
    return datatypes.to_numpy_dtype(wire).type if wire != "BYTES" else np.object_


def numpy_to_triton_type(data_type: Any) -> int | None:
    try:
        return _TYPE_CODES[datatypes.from_numpy_dtype(data_type)]
    except (ServerError, TypeError):
        return None


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def serialize_byte_tensor(input_tensor: np.ndarray) -> np.ndarray | None:
    """Length-prefixed BYTES form of ``input_tensor`` (C order), as a 0-d object array; None if empty."""
    if input_tensor.size == 0:
        return None
    if input_tensor.dtype != np.object_ and input_tensor.dtype.type != np.bytes_:
        return None
    return np.asarray(datatypes.serialize_bytes_tensor(input_tensor), dtype=np.object_)


def deserialize_bytes_tensor(encoded_tensor: Any) -> np.ndarray:
    """The flat object array of ``bytes`` encoded in Triton's length-prefixed form."""
    if isinstance(encoded_tensor, np.ndarray):
        encoded_tensor = (
            encoded_tensor.item() if encoded_tensor.dtype == np.object_ else encoded_tensor.tobytes()
        )
    return datatypes.deserialize_bytes_tensor(encoded_tensor)


# --- logging -------------------------------------------------------------------

_log = logging.getLogger("triton_python_backend")


class _LogLevel(IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}


def _no_model() -> str:
    return ""


# Set by the request layer (``python_requests``), which knows which model's code runs in a context.
current_model_name: Callable[[], str] = _no_model


def log_to_stderr() -> None:
    """Write the models' log lines to this process's standard error, as tritonserver writes its log
    (a served replica: Ray keeps the worker's stderr in its ``worker-*.err`` file; Serve replaces
    ``sys.stderr`` with a buffered logger of its own, so the original stream is used). Lines are
    Triton's form: level letter, date and time, process, the model file's line, the message. INFO and
    above, as tritonserver without ``--log-verbose``."""
    if any(getattr(h, "_triton_stderr", False) for h in _log.handlers):
        return
    handler = logging.StreamHandler(sys.__stderr__ or sys.stderr)
    handler.setFormatter(
        logging.Formatter(
            "%(levelname).1s%(asctime)s %(process)d %(filename)s:%(lineno)d] %(message)s", "%m%d %H:%M:%S"
        )
    )
    handler._triton_stderr = True  # type: ignore[attr-defined]
    _log.addHandler(handler)
    _log.setLevel(logging.INFO)
    _log.propagate = False  # not again through Serve's redirected stderr


def _emit(level: int, message: Any) -> None:
    """Log ``message`` under the current model's name, attributed to the model's own source line."""
    model = current_model_name()
    text = f"model '{model}': {message}" if model else str(message)
    _log.log(_LEVELS.get(int(level), logging.INFO), text, stacklevel=3)


class Logger:
    """``pb_utils.Logger``: messages go to the replica's Python log (logger ``triton_python_backend``).

    Each line names the model that logs it; VERBOSE is Python's DEBUG level.
    """

    LogLevel = _LogLevel
    INFO = _LogLevel.INFO
    WARNING = _LogLevel.WARNING
    ERROR = _LogLevel.ERROR
    VERBOSE = _LogLevel.VERBOSE

    @staticmethod
    def log(message: Any, level: int = _LogLevel.INFO) -> None:
        _emit(level, message)

    @staticmethod
    def log_info(message: Any) -> None:
        _emit(_LogLevel.INFO, message)

    @staticmethod
    def log_warn(message: Any) -> None:
        _emit(_LogLevel.WARNING, message)

    @staticmethod
    def log_error(message: Any) -> None:
        _emit(_LogLevel.ERROR, message)

    @staticmethod
    def log_verbose(message: Any) -> None:
        _emit(_LogLevel.VERBOSE, message)


# --- custom metrics ------------------------------------------------------------


class _MetricKind(IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


_KIND_NAMES = {
    _MetricKind.COUNTER: custom_metrics.COUNTER,
    _MetricKind.GAUGE: custom_metrics.GAUGE,
    _MetricKind.HISTOGRAM: custom_metrics.HISTOGRAM,
}


class MetricFamily:
    """``pb_utils.MetricFamily``: a named counter, gauge or histogram family of this process.

    ``buckets`` here is a default for the family's histograms; Triton's own
    form gives them per metric (``family.Metric(labels, buckets)``).
    """

    MetricKind = _MetricKind
    COUNTER = _MetricKind.COUNTER
    GAUGE = _MetricKind.GAUGE
    HISTOGRAM = _MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: int, buckets: list[float] | None = None) -> None:
        try:
            kind_name = _KIND_NAMES[_MetricKind(int(kind))]
            self._state = custom_metrics.REGISTRY.family(str(name), str(description), kind_name)
        except ValueError as error:
            raise TritonModelException(str(error)) from None
        self._buckets = buckets
        weakref.finalize(self, custom_metrics.REGISTRY.release_family, self._state)

    def Metric(  # noqa: N802 - Triton's method name
        self, labels: dict[str, str] | None = None, buckets: list[float] | None = None
    ) -> Metric:
        """The metric of this family with ``labels`` (histograms: with ``buckets``)."""
        return Metric(self, labels, buckets if buckets is not None else self._buckets)


_FAMILY_DELETED = (
    "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The 'MetricFamily' "
    "object should be deleted AFTER its corresponding 'Metric' objects have been deleted."
)


class Metric:
    """One metric (one label set) of a :class:`MetricFamily`."""

    def __init__(
        self, family: MetricFamily, labels: dict[str, str] | None = None, buckets: list[float] | None = None
    ) -> None:
        # No reference to the family, as in tritonserver 2.51 (checked against the peer): once the model
        # drops its MetricFamily object the family is deleted, stops printing, and its metrics refuse use.
        state = family._state
        try:
            self._cell = custom_metrics.REGISTRY.metric(state, labels, buckets)
        except ValueError as error:
            raise TritonModelException(str(error)) from None
        self._kind = state.kind
        self._state = state
        weakref.finalize(self, custom_metrics.REGISTRY.release_metric, state, self._cell)

    def _check_family(self, operation: str) -> None:
        if not custom_metrics.REGISTRY.holds(self._state):
            raise TritonModelException(f"Failed to {operation} metric value: {_FAMILY_DELETED}")

    def increment(self, value: float) -> None:
        """Add ``value`` (counters: never negative)."""
        self._check_family("increment")
        if self._kind == custom_metrics.HISTOGRAM:
            raise TritonModelException("increment() is not supported on a histogram: use observe()")
        if self._kind == custom_metrics.COUNTER and value < 0:
            raise TritonModelException("a counter cannot be incremented by a negative value")
        with custom_metrics.REGISTRY.lock:
            self._cell.value += float(value)

    def set(self, value: float) -> None:
        """Set a gauge to ``value``."""
        self._check_family("set")
        if self._kind != custom_metrics.GAUGE:
            raise TritonModelException(f"set() is only supported on a gauge, not on a {self._kind}")
        with custom_metrics.REGISTRY.lock:
            self._cell.value = float(value)

    def observe(self, value: float) -> None:
        """Record one observation in a histogram."""
        self._check_family("observe")
        if self._kind != custom_metrics.HISTOGRAM:
            raise TritonModelException(f"observe() is only supported on a histogram, not on a {self._kind}")
        with custom_metrics.REGISTRY.lock:
            self._cell.observe(float(value))

    def value(self) -> float:
        """The current value of a counter or gauge."""
        self._check_family("get")
        if self._kind == custom_metrics.HISTOGRAM:
            raise TritonModelException("value() is not supported on a histogram")
        return self._cell.value


def __getattr__(name: str) -> Any:
    # The auto-complete config object lives with the loader, which calls auto_complete_config.
    if name == "ModelConfig":
        from repository_loader.python_autocomplete import AutoCompleteModelConfig

        return AutoCompleteModelConfig
    raise AttributeError(name)
