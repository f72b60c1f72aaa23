"""Array hand-off between numpy, torch and any DLPack producer, without copies.

A tensor in the server is either a numpy array on the host (BYTES as ``object``
arrays of ``bytes``) or any object that speaks DLPack (a torch tensor, a CuPy
array, an ONNX Runtime ``OrtValue``). These helpers tell them apart, convert
between them by sharing the buffer, and join/split them along the batch
dimension.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from repository_loader import datatypes

_DLPACK_CPU = 1  # DLDeviceType kDLCPU
_DLPACK_CUDA = (2, 3, 13)  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged


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
    """Triton wire name of an array's element type."""
    if isinstance(array, np.ndarray):
        return datatypes.from_numpy_dtype(array.dtype)
    if is_torch(array):
        return datatypes.from_torch_dtype(array.dtype)
    dtype = getattr(array, "dtype", None)
    if dtype is not None:
        return datatypes.from_numpy_dtype(dtype)
    return wire_datatype(to_torch(array))


def shape_of(array: Any) -> tuple[int, ...]:
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
    """A host numpy array for ``array``; shares the buffer when it is on the host already."""
    if isinstance(array, np.ndarray):
        return array
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


def data_ptr(array: Any) -> int:
    """Address of the first element."""
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
