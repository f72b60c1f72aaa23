"""Triton's data types: config names (``TYPE_FP32``), wire names (``FP32``), numpy and torch.

BYTES tensors are numpy ``object`` arrays of ``bytes``; on the wire each element
is a 4-byte little-endian length followed by its bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from repository_loader.errors import InvalidArgument


@dataclass(frozen=True)
class DataType:
    wire: str  # KServe v2 / Triton wire name, e.g. "FP32"
    config: str  # model config name, e.g. "TYPE_FP32"
    numpy: Any  # numpy dtype (np.object_ for BYTES, None where numpy has none)
    size: int  # bytes per element; 0 for BYTES
    torch: str | None  # attribute of the torch module, e.g. "float32"


_TYPES = (
    DataType("BOOL", "TYPE_BOOL", np.dtype(np.bool_), 1, "bool"),
    DataType("UINT8", "TYPE_UINT8", np.dtype(np.uint8), 1, "uint8"),
    DataType("UINT16", "TYPE_UINT16", np.dtype(np.uint16), 2, "uint16"),
    DataType("UINT32", "TYPE_UINT32", np.dtype(np.uint32), 4, "uint32"),
    DataType("UINT64", "TYPE_UINT64", np.dtype(np.uint64), 8, "uint64"),
    DataType("INT8", "TYPE_INT8", np.dtype(np.int8), 1, "int8"),
    DataType("INT16", "TYPE_INT16", np.dtype(np.int16), 2, "int16"),
    DataType("INT32", "TYPE_INT32", np.dtype(np.int32), 4, "int32"),
    DataType("INT64", "TYPE_INT64", np.dtype(np.int64), 8, "int64"),
    DataType("FP16", "TYPE_FP16", np.dtype(np.float16), 2, "float16"),
    DataType("FP32", "TYPE_FP32", np.dtype(np.float32), 4, "float32"),
    DataType("FP64", "TYPE_FP64", np.dtype(np.float64), 8, "float64"),
    # numpy has no bfloat16; ml_dtypes provides one where installed.
    DataType("BF16", "TYPE_BF16", None, 2, "bfloat16"),
    DataType("BYTES", "TYPE_STRING", np.dtype(np.object_), 0, None),
)

BY_WIRE: dict[str, DataType] = {t.wire: t for t in _TYPES}
BY_CONFIG: dict[str, DataType] = {t.config: t for t in _TYPES}
CONFIG_NAMES: frozenset[str] = frozenset(BY_CONFIG)
WIRE_NAMES: frozenset[str] = frozenset(BY_WIRE)


def _bf16_numpy() -> Any:
    try:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    except ImportError:  # pragma: no cover - ml_dtypes ships with onnx/ray
        return None


_BF16 = _bf16_numpy()


def from_wire(name: str) -> DataType:
    try:
        return BY_WIRE[name]
    except KeyError:
        raise InvalidArgument(f"unknown data type '{name}'") from None


def from_config(name: str) -> DataType:
    try:
        return BY_CONFIG[name]
    except KeyError:
        raise InvalidArgument(f"unknown data type '{name}'") from None


def config_to_wire(name: str) -> str:
    """``TYPE_FP32`` -> ``FP32`` (``TYPE_STRING`` -> ``BYTES``)."""
    return from_config(name).wire


def wire_to_config(name: str) -> str:
    return from_wire(name).config


def to_numpy_dtype(wire: str) -> np.dtype:
    t = from_wire(wire)
    if t.wire == "BF16":
        if _BF16 is None:
            raise InvalidArgument("BF16 needs the ml_dtypes package")
        return _BF16
    return t.numpy


def from_numpy_dtype(dtype: Any) -> str:
    """numpy dtype -> wire name. Strings and bytes map to BYTES."""
    dt = np.dtype(dtype)
    if dt.kind in ("O", "S", "U"):
        return "BYTES"
    if _BF16 is not None and dt == _BF16:
        return "BF16"
    for t in _TYPES:
        if t.numpy is not None and t.numpy == dt:
            return t.wire
    raise InvalidArgument(f"numpy dtype {dt} has no Triton data type")


def to_torch_dtype(wire: str) -> Any:
    import torch

    name = from_wire(wire).torch
    if name is None:
        raise InvalidArgument(f"data type {wire} has no torch equivalent")
    return getattr(torch, name)


def from_torch_dtype(dtype: Any) -> str:
    name = str(dtype).removeprefix("torch.")
    for t in _TYPES:
        if t.torch == name:
            return t.wire
    raise InvalidArgument(f"torch dtype {dtype} has no Triton data type")


def element_size(wire: str) -> int:
    """Bytes per element (0 for BYTES, whose elements vary)."""
    return from_wire(wire).size


# --- BYTES wire form -------------------------------------------------------

_LEN = struct.Struct("<I")


def serialize_bytes_tensor(array: np.ndarray) -> bytes:
    """Flatten ``array`` (C order) into Triton's length-prefixed BYTES form."""
    parts: list[bytes] = []
    for item in np.asarray(array, dtype=object).reshape(-1):
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, (bytes, bytearray, memoryview)):
            item = str(item).encode("utf-8")
        b = bytes(item)
        parts.append(_LEN.pack(len(b)))
        parts.append(b)
    return b"".join(parts)


def deserialize_bytes_tensor(buffer: bytes | memoryview, count: int | None = None) -> np.ndarray:
    """Parse length-prefixed BYTES into a flat numpy object array.

    Raises :class:`InvalidArgument` when the buffer is truncated or (with
    ``count``) holds a different number of elements.
    """
    view = memoryview(buffer)
    items: list[bytes] = []
    offset = 0
    end = len(view)
    while offset < end:
        if offset + 4 > end:
            raise InvalidArgument("BYTES tensor data is truncated (incomplete length prefix)")
        (length,) = _LEN.unpack_from(view, offset)
        offset += 4
        if offset + length > end:
            raise InvalidArgument("BYTES tensor data is truncated (element runs past the end)")
        items.append(bytes(view[offset : offset + length]))
        offset += length
    if count is not None and len(items) != count:
        raise InvalidArgument(f"BYTES tensor holds {len(items)} elements, expected {count}")
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out
