"""The one home of tensor helpers: numpy, torch and any DLPack producer, without copies.

A tensor in the server is either a numpy array on the host (BYTES as ``object``
arrays of ``bytes``) or any object that speaks DLPack (a torch tensor, a CuPy
array, an ONNX Runtime ``OrtValue``). These helpers tell them apart (device,
wire data type, shape, buffer address), convert between them by sharing the
buffer (:func:`to_torch`, :func:`to_numpy`, :func:`as_framework`), and
join/split them along the batch dimension. The request check, the codec, the
backends and the ensemble hand-off all use them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from repository_loader import datatypes
from repository_loader.errors import InvalidArgument, Unsupported

Tensor = Any  # numpy.ndarray, or an object with __dlpack__ (torch.Tensor, cupy.ndarray)

_DLPACK_CUDA = (2, 3, 13)  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged


def _wire_names() -> dict[np.dtype, str]:
    names: dict[np.dtype, str] = {np.dtype(object): "BYTES"}
    for wire in datatypes.BY_WIRE:
        try:
            dtype = datatypes.to_numpy_dtype(wire)
        except InvalidArgument:  # BF16 without ml_dtypes
            continue
        names.setdefault(dtype, wire)
    return names


_WIRE_OF = _wire_names()  # numpy dtype -> wire name: one dict lookup on the request path


def is_numpy(array: Any) -> bool:
    return isinstance(array, np.ndarray)


def is_torch(array: Any) -> bool:
    """True for a ``torch.Tensor`` (checked without importing torch)."""
    return type(array).__module__.startswith("torch") and hasattr(array, "data_ptr")


def device_of(array: Any) -> tuple[str, int]:
    """``("cpu", 0)`` or ``("cuda", <device id>)`` for any supported array."""
    if isinstance(array, np.ndarray):
        return "cpu", 0
    if is_torch(array):
        dev = array.device
        return dev.type, int(dev.index or 0)
    if hasattr(array, "__dlpack_device__"):
        kind, index = array.__dlpack_device__()
        return ("cuda", int(index)) if int(kind) in _DLPACK_CUDA else ("cpu", 0)
    return "cpu", 0


def is_host(array: Any) -> bool:
    return device_of(array)[0] == "cpu"


def wire_datatype(array: Any) -> str:
    """Triton wire name of an array's element type (:class:`InvalidArgument` where it has none)."""
    if isinstance(array, np.ndarray):
        return _WIRE_OF.get(array.dtype) or datatypes.from_numpy_dtype(array.dtype)
    if is_torch(array):
        return datatypes.from_torch_dtype(array.dtype)
    dtype = getattr(array, "dtype", None)
    if dtype is not None:
        return datatypes.from_numpy_dtype(dtype)
    return wire_datatype(to_torch(array))


def shape_of(array: Any) -> tuple[int, ...]:
    """The shape as a tuple of ints (an ``OrtValue``'s ``shape()`` too)."""
    if isinstance(array, np.ndarray):
        return array.shape
    shape = array.shape() if callable(getattr(array, "shape", None)) else array.shape
    return tuple(int(d) for d in shape)


def to_torch(array: Any, device: Any = None) -> Any:
    """A torch tensor sharing ``array``'s buffer (moved to ``device`` if given and different)."""
    import torch

    if is_torch(array):
        tensor = array
    elif isinstance(array, np.ndarray):
        if array.dtype == np.object_:
            raise TypeError("BYTES tensors have no torch form")
        if datatypes.from_numpy_dtype(array.dtype) == "BF16":
            tensor = to_torch(array.view(np.int16)).view(torch.bfloat16)
        elif array.flags.writeable:
            tensor = torch.from_numpy(array)
        else:  # request bodies are read-only views: DLPack shares them without a warning
            tensor = torch.from_dlpack(array)
    else:
        tensor = torch.from_dlpack(array)
    if device is not None and tensor.device != torch.device(device):
        tensor = tensor.to(device)
    return tensor


def to_numpy(array: Any) -> np.ndarray:
    """A host numpy array for ``array``: a view for host tensors, a copy only for device tensors."""
    if isinstance(array, np.ndarray):
        return array
    if not hasattr(array, "__dlpack__") and not is_torch(array):
        return np.asarray(array)  # lists, scalars
    if is_torch(array):
        tensor = array.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        if str(tensor.dtype) == "torch.bfloat16":
            return tensor.view(_torch_int16()).numpy().view(datatypes.to_numpy_dtype("BF16"))
        return tensor.numpy()
    if is_host(array):
        try:
            return np.from_dlpack(array)
        except (BufferError, TypeError, RuntimeError):
            pass
    return to_numpy(to_torch(array))


def _torch_int16() -> Any:
    import torch

    return torch.int16


def as_framework(array: Any, framework: str | None) -> Any:
    """The same memory seen as a ``"numpy"`` or ``"torch"`` array (``None``: as it is).

    A zero-copy DLPack view; a device tensor cannot be seen as numpy and is
    refused rather than copied.
    """
    if framework is None:
        return array
    if framework == "numpy":
        if not is_host(array):
            raise Unsupported("a device tensor cannot be handed on as numpy without a copy to the host")
        return to_numpy(array)
    if framework == "torch":
        return to_torch(array)
    raise Unsupported(f"unknown tensor framework '{framework}' (expected 'numpy' or 'torch')")


def data_ptr(array: Any) -> int:
    """Address of the first element: equal addresses mean the same memory."""
    if isinstance(array, np.ndarray):
        return int(array.ctypes.data)
    if is_torch(array) or hasattr(array, "data_ptr"):
        return int(array.data_ptr())
    cai = getattr(array, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0])
    return int(np.from_dlpack(array).ctypes.data)


def concat_rows(arrays: list[Any]) -> Any:
    """Join arrays along the first dimension (numpy on the host, torch for device arrays)."""
    if len(arrays) == 1:
        return arrays[0]
    if all(isinstance(a, np.ndarray) for a in arrays):
        return np.concatenate(arrays, axis=0)
    import torch

    devices = {device_of(a) for a in arrays}
    device = next((f"cuda:{i}" for kind, i in devices if kind == "cuda"), "cpu")
    return torch.cat([to_torch(a, device) for a in arrays], dim=0)


def slice_rows(array: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` as a view."""
    if isinstance(array, np.ndarray) or is_torch(array):
        return array[start:stop]
    return to_torch(array)[start:stop]


def reshape(array: Any, shape: tuple[int, ...]) -> Any:
    """``array`` viewed with ``shape`` (one ``-1`` allowed)."""
    if isinstance(array, np.ndarray) or is_torch(array):
        return array.reshape(shape)
    return to_torch(array).reshape(shape)
