"""Data type tables and BYTES serialization of ``triton_python_backend_utils``.

Triton names a tensor's type three ways: a config string (``TYPE_FP32``), a
``TRITONSERVER_DataType`` code (what ``Tensor.triton_dtype()`` returns) and a
numpy type. BYTES tensors travel in Triton's length-prefixed form.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from repository_loader import datatypes
from repository_loader.errors import ServerError

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

# TRITONSERVER_DataType codes by wire data type, as pb_utils.Tensor.triton_dtype() reports them
TYPE_CODES: dict[str, int] = {
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
_WIRE_OF_CODE = {code: wire for wire, code in TYPE_CODES.items()}


def triton_to_numpy_type(data_type: int) -> Any:
    wire = _WIRE_OF_CODE.get(int(data_type))
    if wire is None:
        return None
    return datatypes.to_numpy_dtype(wire).type if wire != "BYTES" else np.object_


def numpy_to_triton_type(data_type: Any) -> int | None:
    try:
        return TYPE_CODES[datatypes.from_numpy_dtype(data_type)]
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
