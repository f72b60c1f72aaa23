"""``pb_utils.Tensor``: a named tensor of a request or response, and where BLS outputs should live.

Tensors wrap numpy arrays or DLPack-capable arrays (torch, CuPy) without
copying; ``to_dlpack``/``from_dlpack`` share the buffer.
:class:`PreferredMemory` says whether a BLS call wants its outputs on the host
or on a GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from deployments import tensors as arrays
from deployments.backends.python_api.dtypes import TYPE_CODES, triton_to_numpy_type
from deployments.backends.python_api.errors import TritonModelException

TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_CPU_PINNED = 1
TRITONSERVER_MEMORY_GPU = 2


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
        if not isinstance(name, str):
            raise TypeError(f"Tensor(): the name must be a str, not {type(name).__name__}")
        if data is None:
            raise TypeError(f"Tensor(): tensor '{name}' needs a numpy array (or a DLPack array), not None")
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
        return TYPE_CODES[arrays.wire_datatype(self._data)]

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
        if dlpack is None:
            raise TritonModelException(
                f"Tensor.from_dlpack(): tensor '{name}' needs a DLPack capsule or array, not None"
            )
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


def get_input_tensor_by_name(inference_request: Any, name: str) -> Tensor | None:
    return next((t for t in inference_request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(inference_response: Any, name: str) -> Tensor | None:
    return next((t for t in inference_response.output_tensors() if t.name() == name), None)


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
