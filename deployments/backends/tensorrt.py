"""TensorRT backend (``platform: "tensorrt_plan"`` / ``backend: "tensorrt"``), TensorRT 10 API.

A serialized engine (``model.plan``) runs on ``cuda:<device_id>`` through the
tensor-name API: ``set_input_shape``, ``set_tensor_address`` and
``execute_async_v3`` on a stream of its own. Inputs are torch CUDA tensors
(host arrays are copied to the device once, on that stream); outputs are
allocated as torch CUDA tensors and handed on as they are, never staged
through host memory. Dynamic shapes pick the first optimization profile whose
min/max range holds the batch. One execution context per instance, used by
one call at a time.
"""

from __future__ import annotations

import threading
from typing import Any

import tensorrt as trt
import torch

from deployments import tensors
from deployments.backends.tensor import TensorBackend
from deployments.inference import Tensor
from repository_loader.errors import InternalError, InvalidArgument, Unavailable, Unsupported

_TORCH_OF_TRT = {
    getattr(trt.DataType, trt_name): torch_type
    for trt_name, torch_type in (
        ("FLOAT", torch.float32),
        ("HALF", torch.float16),
        ("BF16", torch.bfloat16),
        ("INT8", torch.int8),
        ("UINT8", torch.uint8),
        ("INT32", torch.int32),
        ("INT64", torch.int64),
        ("BOOL", torch.bool),
    )
    if hasattr(trt.DataType, trt_name)
}


class TensorRTBackend(TensorBackend):
    """One TensorRT engine and execution context on one GPU."""

    inline_threshold_s = 0.0  # every run goes to a worker thread: it waits on the GPU

    def load(self) -> None:
        path = self.model_path()
        if not path.exists():
            raise Unavailable(
                f"model '{self.model.name}' version {self.context.version}: no model file at {path}"
            )
        if not torch.cuda.is_available():
            raise Unavailable(
                f"model '{self.model.name}': TensorRT plans need a CUDA device and torch sees none"
            )
        self.device = torch.device(f"cuda:{self.context.device_id}")
        self._logger = trt.Logger(trt.Logger.WARNING)
        with torch.cuda.device(self.device):
            self._runtime = trt.Runtime(self._logger)
            self.engine = self._runtime.deserialize_cuda_engine(path.read_bytes())
            if self.engine is None:
                raise Unavailable(f"model '{self.model.name}': TensorRT cannot deserialize {path}")
            self.execution = self.engine.create_execution_context()
            self._stream = torch.cuda.Stream(self.device)
        self._lock = threading.Lock()
        self._read_tensors()
        self._profile = 0

    def _read_tensors(self) -> None:
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self._inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self._outputs = [n for n in names if n not in self._inputs]
        for name in names:
            if self.engine.is_shape_inference_io(name):
                raise Unsupported(f"model '{self.model.name}': shape tensor '{name}' is not supported")
            if self.engine.get_tensor_dtype(name) not in _TORCH_OF_TRT:
                raise Unsupported(
                    f"model '{self.model.name}': tensor '{name}' has TensorRT type "
                    f"{self.engine.get_tensor_dtype(name)}, which has no torch equivalent"
                )
        for spec in (*self.model.inputs, *self.model.outputs):
            if spec.name not in names:
                raise Unavailable(
                    f"model '{self.model.name}': the plan has no tensor '{spec.name}' (it has {names})"
                )
        self._ranges = [
            {n: self.engine.get_tensor_profile_shape(n, p) for n in self._inputs}
            for p in range(self.engine.num_optimization_profiles)
        ]

    def unload(self) -> None:
        for attribute in ("execution", "engine", "_runtime"):
            self.__dict__.pop(attribute, None)

    def _choose_profile(self, shapes: dict[str, tuple[int, ...]]) -> int:
        for index, ranges in enumerate(self._ranges):
            if all(_within(shape, ranges[name]) for name, shape in shapes.items()):
                return index
        raise InvalidArgument(
            f"model '{self.model.name}': input shapes {shapes} fall outside every optimization profile of the plan"
        )

    def run(self, inputs: dict[str, Tensor], output_names: list[str]) -> dict[str, Tensor]:
        with self._lock, torch.cuda.device(self.device):
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._stream):
                bound = {name: self._device_input(name, array) for name, array in inputs.items()}
                outputs = self._launch(bound)
            self._stream.synchronize()
        return {name: outputs[name] for name in output_names}

    def _device_input(self, name: str, array: Any) -> Any:
        if name not in self._inputs:
            raise InvalidArgument(f"model '{self.model.name}': the plan has no input '{name}'")
        tensor = tensors.to_torch(array, self.device).contiguous()
        expected = _TORCH_OF_TRT[self.engine.get_tensor_dtype(name)]
        if tensor.dtype != expected:
            raise InvalidArgument(
                f"model '{self.model.name}': input '{name}' is {tensor.dtype}, the plan expects {expected}"
            )
        return tensor

    def _launch(self, bound: dict[str, Any]) -> dict[str, Any]:
        if self._ranges:
            profile = self._choose_profile({n: tuple(t.shape) for n, t in bound.items()})
            if profile != self._profile:
                self.execution.set_optimization_profile_async(profile, self._stream.cuda_stream)
                self._profile = profile
        for name, tensor in bound.items():
            self.execution.set_input_shape(name, tuple(tensor.shape))
            self.execution.set_tensor_address(name, tensor.data_ptr())
        outputs: dict[str, Any] = {}
        for name in self._outputs:
            shape = tuple(self.execution.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise Unsupported(
                    f"model '{self.model.name}': output '{name}' has a data-dependent shape {shape}"
                )
            out = torch.empty(
                shape, dtype=_TORCH_OF_TRT[self.engine.get_tensor_dtype(name)], device=self.device
            )
            self.execution.set_tensor_address(name, out.data_ptr())
            outputs[name] = out
        if not self.execution.execute_async_v3(self._stream.cuda_stream):
            raise InternalError(f"model '{self.model.name}': TensorRT execution failed")
        return outputs


def _within(shape: tuple[int, ...], limits: Any) -> bool:
    low, _, high = (tuple(s) for s in limits)
    return len(shape) == len(low) and all(lo <= d <= hi for d, lo, hi in zip(shape, low, high, strict=True))
