"""The GPU memory a model host measures: used memory of each GPU this process sees, from the driver.

A model host on GPUs (``docs/hosts.md``) keeps a budget per GPU as it keeps one for host memory: a
model's footprint on a GPU is the GPU's used memory after its load less before it. Every framework
(PyTorch's caching allocator, CuPy's pool, ONNX Runtime's arena, TensorRT) allocates through the same
driver, so the driver's figure counts them all, where one framework's own counters see only itself.

* Devices are this process's CUDA ordinals (what ``cuda:<n>`` names, after ``CUDA_VISIBLE_DEVICES``),
  matched to NVML's devices by PCI bus id: NVML's own order ignores ``CUDA_VISIBLE_DEVICES``.
* NVML reports a GPU's used memory, not this process's. A host replica asks Ray for whole GPUs, which
  Ray gives no other replica, so what changes on them while the host loads a model is the model's.
* :meth:`GpuMemory.open` makes each GPU's primary context (the one every runtime API shares) before
  anything is measured, so the context's own few hundred MiB are the host's, not the first model's.

Only ``libcuda.so.1`` and ``libnvidia-ml.so.1`` (the driver's libraries) are used, through ctypes:
no framework has to be installed for the host to measure.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import sys
from collections.abc import Mapping

logger = logging.getLogger(__name__)


class _MemoryInfo(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class GpuMemory:
    """Used and total memory of each GPU this process sees, by CUDA ordinal (see the module's text)."""

    def __init__(self, nvml: ctypes.CDLL, handles: Mapping[int, ctypes.c_void_p]) -> None:
        self._nvml = nvml
        self._handles = dict(handles)

    @classmethod
    def open(cls, retain_contexts: bool = True) -> GpuMemory | None:
        """The GPUs of this process, their primary contexts made where ``retain_contexts``; None where
        there is no driver or no GPU."""
        try:
            cuda = ctypes.CDLL("libcuda.so.1")
            nvml = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            return None
        count = ctypes.c_int(0)
        if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
            return None
        if nvml.nvmlInit_v2() != 0:
            return None
        handles: dict[int, ctypes.c_void_p] = {}
        for ordinal in range(count.value):
            device = ctypes.c_int(0)
            bus = ctypes.create_string_buffer(32)
            if cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
                continue
            if cuda.cuDeviceGetPCIBusId(bus, len(bus), device) != 0:
                continue
            handle = ctypes.c_void_p()
            if nvml.nvmlDeviceGetHandleByPciBusId_v2(bus.value, ctypes.byref(handle)) != 0:
                logger.warning("GPU %d (%s) not found through NVML: not measured", ordinal, bus.value)
                continue
            if retain_contexts:
                context = ctypes.c_void_p()
                cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)
            handles[ordinal] = handle
        return cls(nvml, handles) if handles else None

    def devices(self) -> list[int]:
        return sorted(self._handles)

    def _info(self, ordinal: int) -> _MemoryInfo:
        info = _MemoryInfo()
        if self._nvml.nvmlDeviceGetMemoryInfo(self._handles[ordinal], ctypes.byref(info)) != 0:
            raise OSError(f"NVML could not read the memory of GPU {ordinal}")
        return info

    def used(self) -> dict[int, int]:
        """Used bytes of each GPU, by CUDA ordinal."""
        return {ordinal: int(self._info(ordinal).used) for ordinal in self._handles}

    def total(self) -> dict[int, int]:
        """Total bytes of each GPU, by CUDA ordinal."""
        return {ordinal: int(self._info(ordinal).total) for ordinal in self._handles}


def gpu_budgets(gpus: GpuMemory, per_gpu_bytes: int = 0) -> dict[int, int]:
    """The budget of a host's models on each GPU: ``per_gpu_bytes``, or (0) nine tenths of what is free
    on it now, its context made."""
    if per_gpu_bytes > 0:
        return {gpu: per_gpu_bytes for gpu in gpus.devices()}
    used, total = gpus.used(), gpus.total()
    return {gpu: int(0.9 * max(total[gpu] - used[gpu], 0)) for gpu in gpus.devices()}


def release_cached_gpu_memory() -> None:
    """Hand memory that frameworks already imported keep cached back to the driver (PyTorch's caching
    allocator, CuPy's pools), so that a measurement after an eviction sees it gone. Imports nothing."""
    torch = sys.modules.get("torch")
    if torch is not None:
        with contextlib.suppress(Exception):
            if torch.cuda.is_initialized():
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        with contextlib.suppress(Exception):
            cupy.get_default_memory_pool().free_all_blocks()
            cupy.get_default_pinned_memory_pool().free_all_blocks()


__all__ = ["GpuMemory", "gpu_budgets", "release_cached_gpu_memory"]
