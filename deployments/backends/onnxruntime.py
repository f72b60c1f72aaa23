"""ONNX Runtime backend (``platform: "onnxruntime_onnx"`` / ``backend: "onnxruntime"``).

Execution providers: CPU everywhere; CUDA for GPU instances; TensorRT and
OpenVINO where the config's ``optimization.execution_accelerators`` asks for
them and the installed ONNX Runtime has them. Session options follow Triton's
ONNX Runtime backend: ``parameters`` ``intra_op_thread_count``,
``inter_op_thread_count``, ``execution_mode``, ``enable_mem_arena``,
``enable_mem_pattern``, and ``optimization.graph.level`` (-1 basic,
1 extended, 2 disabled, otherwise all). Parameters named after ONNX Runtime's
own session configuration keys (``session.*``, e.g.
``session.intra_op.allow_spinning``) are passed to the session as they are.

Host numpy inputs on a CPU session take ``session.run`` (the fast path). Any
other input (torch tensors, device arrays, BF16) is bound in place through
IOBinding; outputs of a GPU session are bound on the device and handed on as
torch tensors sharing ONNX Runtime's buffer, so GPU tensors never visit the host.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnxruntime as ort

from deployments import tensors
from deployments.backends.tensor import TensorBackend
from deployments.inference import Tensor
from repository_loader import datatypes
from repository_loader.errors import InvalidArgument, ServerError, Unavailable
from repository_loader.model import InstanceKind

_GRAPH_LEVELS = {
    -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
}
_ONNX_BF16 = 16  # TensorProto.BFLOAT16
# Triton's TensorRT accelerator parameters -> TensorRT execution provider options
_TRT_OPTIONS = {
    "max_workspace_size_bytes": "trt_max_workspace_size",
    "trt_engine_cache_enable": "trt_engine_cache_enable",
    "trt_engine_cache_path": "trt_engine_cache_path",
    "int8_calibration_table_name": "trt_int8_calibration_table_name",
    "int8_use_native_calibration_table": "trt_int8_use_native_calibration_table",
}
DEFAULT_CPU_THREADS = 1
SESSION_CONFIG_PREFIX = "session."


def _int_param(params: Mapping[str, str], key: str, default: int) -> int:
    value = params.get(key)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except ValueError:
        raise InvalidArgument(f"parameter '{key}' must be an integer, got '{value}'") from None


def default_intra_op_threads(instances: int) -> int:
    """Threads of one session when the config names none: this machine's cores shared by the instances.

    Triton leaves the choice to ONNX Runtime (every core, in every instance), which
    oversubscribes the cores as soon as a model has several instances; one thread per
    session left a core of a 2-core machine idle with one instance (CRNN at concurrency 16:
    1,451 infer/s with one thread, 2,154 with two).
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, instances))


def session_options(
    params: Mapping[str, str], optimization: Mapping[str, Any], instances: int = 1
) -> ort.SessionOptions:
    """ONNX Runtime session options from Triton's model ``parameters`` and ``optimization``.

    ``instances`` is how many instances of the model share this machine's cores.
    """
    options = ort.SessionOptions()
    options.intra_op_num_threads = _int_param(
        params, "intra_op_thread_count", default_intra_op_threads(instances)
    )
    options.inter_op_num_threads = _int_param(params, "inter_op_thread_count", DEFAULT_CPU_THREADS)
    if _int_param(params, "execution_mode", 0) == 1:
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    options.enable_cpu_mem_arena = _int_param(params, "enable_mem_arena", 1) != 0
    options.enable_mem_pattern = _int_param(params, "enable_mem_pattern", 1) != 0
    for key, value in params.items():
        if key.startswith(SESSION_CONFIG_PREFIX):
            try:
                options.add_session_config_entry(key, str(value))
            except Exception as error:
                raise InvalidArgument(f"parameter '{key}': ONNX Runtime refused it: {error}") from None
    level = int((optimization.get("graph") or {}).get("level", 0) or 0)
    options.graph_optimization_level = _GRAPH_LEVELS.get(level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    return options


def _accelerators(optimization: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    found = (optimization.get("execution_accelerators") or {}).get(key) or []
    return list(found)


def _tensorrt_options(accelerator: Mapping[str, Any], device_id: int) -> dict[str, str]:
    params = dict(accelerator.get("parameters") or {})
    options = {"device_id": str(device_id)}
    precision = str(params.pop("precision_mode", "FP32")).upper()
    if precision == "FP16":
        options["trt_fp16_enable"] = "True"
    elif precision == "INT8":
        options["trt_int8_enable"] = "True"
    for key, value in params.items():
        options[_TRT_OPTIONS.get(str(key), str(key))] = str(value)
    return options


def providers(
    kind: InstanceKind, device_id: int, optimization: Mapping[str, Any], model_name: str
) -> list[Any]:
    """Execution providers, most preferred first, for an instance of ``kind``."""
    available = set(ort.get_available_providers())
    chosen: list[Any] = []
    if kind == InstanceKind.GPU:
        if "CUDAExecutionProvider" not in available:
            raise Unavailable(
                f"model '{model_name}' asks for a GPU instance but this ONNX Runtime has no CUDA "
                f"execution provider (install the 'onnxruntime-gpu' package)"
            )
        for accelerator in _accelerators(optimization, "gpu_execution_accelerator"):
            name = str(accelerator.get("name", "")).lower()
            if name == "tensorrt" and "TensorrtExecutionProvider" in available:
                chosen.append(("TensorrtExecutionProvider", _tensorrt_options(accelerator, device_id)))
        cuda = {"device_id": str(device_id)}
        for accelerator in _accelerators(optimization, "gpu_execution_accelerator"):
            if str(accelerator.get("name", "")).lower() == "cuda":
                cuda.update({k: str(v) for k, v in (accelerator.get("parameters") or {}).items()})
        chosen.append(("CUDAExecutionProvider", cuda))
    for accelerator in _accelerators(optimization, "cpu_execution_accelerator"):
        if (
            str(accelerator.get("name", "")).lower() == "openvino"
            and "OpenVINOExecutionProvider" in available
        ):
            chosen.append("OpenVINOExecutionProvider")
    chosen.append("CPUExecutionProvider")
    return chosen


class OnnxRuntimeBackend(TensorBackend):
    """One ONNX Runtime inference session for one model instance."""

    session: ort.InferenceSession

    def load(self) -> None:
        path = self.model_path()
        if not path.exists():
            raise Unavailable(
                f"model '{self.model.name}' version {self.context.version}: no model file at {path}"
            )
        on_gpu = self.context.instance_kind == InstanceKind.GPU
        self._device = ("cuda", self.context.device_id) if on_gpu else ("cpu", 0)
        try:
            self.session = ort.InferenceSession(
                str(path),
                sess_options=session_options(
                    self.model.parameters, self.model.optimization, _cpu_instances(self.model)
                ),
                providers=providers(
                    self.context.instance_kind,
                    self.context.device_id,
                    self.model.optimization,
                    self.model.name,
                ),
            )
        except ServerError:
            raise
        except Exception as error:
            raise Unavailable(
                f"model '{self.model.name}': ONNX Runtime failed to load {path}: {error}"
            ) from None
        self._string_inputs = {i.name for i in self.session.get_inputs() if i.type == "tensor(string)"}

    def unload(self) -> None:
        self.__dict__.pop("session", None)

    def run(self, inputs: dict[str, Tensor], output_names: list[str]) -> dict[str, Tensor]:
        if self._device[0] == "cpu" and all(_plain_numpy(a) for a in inputs.values()):
            feed = {name: self._host_input(name, a) for name, a in inputs.items()}
            results = self.session.run(output_names, feed)
            return {name: _from_ort_host(r) for name, r in zip(output_names, results, strict=True)}
        return self._run_bound(inputs, output_names)

    def _host_input(self, name: str, array: np.ndarray) -> np.ndarray:
        if name in self._string_inputs and array.dtype == np.object_:
            return _bytes_to_str(array, name, self.model.name)
        return array

    def _run_bound(self, inputs: dict[str, Tensor], output_names: list[str]) -> dict[str, Tensor]:
        binding = self.session.io_binding()
        if any(tensors.device_of(a)[0] == "cuda" for a in inputs.values()):
            _wait_for_producers()
        for name, array in inputs.items():
            self._bind_input(binding, name, array)
        device, device_id = self._device
        for name in output_names:
            binding.bind_output(name, device, device_id)
        self.session.run_with_iobinding(binding)
        values = binding.get_outputs()
        return {name: _from_ortvalue(v) for name, v in zip(output_names, values, strict=True)}

    def _bind_input(self, binding: Any, name: str, array: Any) -> None:
        if isinstance(array, np.ndarray):
            if array.dtype == np.object_:
                binding.bind_cpu_input(name, _bytes_to_str(array, name, self.model.name))
            elif datatypes.from_numpy_dtype(array.dtype) == "BF16":
                value = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                    np.ascontiguousarray(array).view(np.uint16), _ONNX_BF16
                )
                binding.bind_ortvalue_input(name, value)
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(array))
            return
        tensor = tensors.to_torch(array).contiguous()
        device, device_id = tensors.device_of(tensor)
        if str(tensor.dtype) == "torch.bfloat16":
            binding.bind_ortvalue_input(name, ort.OrtValue.from_dlpack(tensor))
            return
        binding.bind_input(
            name,
            device,
            device_id,
            datatypes.to_numpy_dtype(tensors.wire_datatype(tensor)),
            list(tensor.shape),
            tensor.data_ptr(),
        )


def _cpu_instances(model: Any) -> int:
    """Instances of ``model`` that run on CPU (each a replica with its own session)."""
    groups = [g for g in model.instance_groups if g.kind != InstanceKind.GPU]
    return sum(g.count for g in groups) or 1


def _wait_for_producers() -> None:
    """Device inputs may still be written on torch's streams; ONNX Runtime runs on its own."""
    import torch

    torch.cuda.synchronize()


def _plain_numpy(array: Any) -> bool:
    return isinstance(array, np.ndarray) and (
        array.dtype == np.object_ or datatypes.from_numpy_dtype(array.dtype) != "BF16"
    )


def _bytes_to_str(array: np.ndarray, name: str, model: str) -> np.ndarray:
    """BYTES elements as the ``str`` objects ONNX Runtime's string tensors take."""
    out = np.empty(array.shape, dtype=object)
    try:
        out.reshape(-1)[:] = [
            b.decode("utf-8") if isinstance(b, bytes) else str(b) for b in array.reshape(-1)
        ]
    except UnicodeDecodeError:
        raise InvalidArgument(
            f"input '{name}' of model '{model}': ONNX Runtime string tensors need UTF-8 text"
        ) from None
    return out


def _from_ort_host(array: np.ndarray) -> np.ndarray:
    """A host output of ``session.run``; string tensors become BYTES (``bytes`` elements)."""
    if array.dtype == np.object_:
        out = np.empty(array.shape, dtype=object)
        out.reshape(-1)[:] = [s.encode("utf-8") if isinstance(s, str) else s for s in array.reshape(-1)]
        return out
    return array


def _from_ortvalue(value: Any) -> Tensor:
    """An ``OrtValue`` output as numpy (host) or torch (device), sharing its buffer."""
    if value.data_type() == "tensor(string)":
        return _from_ort_host(value.numpy())
    if value.device_name().lower() != "cpu":
        import torch

        return torch.from_dlpack(value)
    if value.data_type() == "tensor(bfloat16)":
        return tensors.to_numpy(tensors.to_torch(value))
    return np.from_dlpack(value)
