"""Builders shared by the backend tests: model descriptions, ONNX and TorchScript files."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from deployments.backends.base import Backend, BackendContext
from deployments.inference import InferRequest, InferResponse, ModelExecutor, RequestedOutput
from repository_loader.model import InstanceKind, ModelDescription, TensorSpec

# The keys of the ``args`` Triton's Python backend passes to ``initialize`` (its README, "Usage").
TRITON_INITIALIZE_ARGS = frozenset(
    {
        "model_config",
        "model_instance_kind",
        "model_instance_name",
        "model_instance_device_id",
        "model_repository",
        "model_version",
        "model_name",
    }
)


def spec(name: str, datatype: str, dims: Sequence[int], **kwargs: Any) -> TensorSpec:
    return TensorSpec(name=name, datatype=datatype, dims=tuple(dims), **kwargs)


PYTHON_MODELS = Path(__file__).parent / "python_models"
# add_sub's tensors: two FP32 [4] inputs, their sum and difference
FP32_IO = (
    [spec("INPUT0", "FP32", [4]), spec("INPUT1", "FP32", [4])],
    [spec("OUTPUT0", "FP32", [4]), spec("OUTPUT1", "FP32", [4])],
)
# a Python model that takes device tensors as they come (Triton's default copies its inputs to the host)
DEVICE_INPUTS = {"FORCE_CPU_ONLY_INPUT_TENSORS": "no"}


def describe(
    name: str,
    path: Path,
    backend: str,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    max_batch_size: int = 0,
    **kwargs: Any,
) -> ModelDescription:
    return ModelDescription(
        name=name,
        path=path,
        platform="",
        backend=backend,
        max_batch_size=max_batch_size,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        versions=(1,),
        **kwargs,
    )


def context(
    model: ModelDescription,
    executor: ModelExecutor | None = None,
    kind: InstanceKind = InstanceKind.CPU,
) -> BackendContext:
    return BackendContext(
        model=model, version=1, instance_kind=kind, instance_name=f"{model.name}_0", executor=executor
    )


def request(model: str, outputs: Sequence[str] | None = None, **inputs: Any) -> InferRequest:
    requested = None if outputs is None else [RequestedOutput(n) for n in outputs]
    return InferRequest(model_name=model, inputs=dict(inputs), requested_outputs=requested)


async def infer_through_runtime(backend: Backend, requests: Sequence[InferRequest]) -> list[InferResponse]:
    """Run ``requests`` as the model runtime does: each checked at its boundary, then executed by ``backend``."""
    from deployments.runtime.metrics import TritonMetrics
    from deployments.runtime.model import VersionRuntime

    runtime = VersionRuntime(backend.model, backend.context.version, backend, TritonMetrics())
    return list(await asyncio.gather(*(runtime.infer(r) for r in requests)))


def version_dir(root: Path, name: str) -> Path:
    folder = root / name / "1"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def save_onnx(path: Path, nodes: list[Any], inputs: list[Any], outputs: list[Any], opset: int = 17) -> None:
    from onnx import helper

    graph = helper.make_graph(nodes, "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    path.write_bytes(model.SerializeToString())


def random_array(dtype: Any, shape: Sequence[int], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dt.kind in "iu":
        return rng.integers(0, 100, size=shape).astype(dt)
    return rng.standard_normal(size=shape).astype(dt)


def python_backend(
    name: str,
    folder: Path,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    executor=None,
    **kwargs: Any,
) -> Any:
    """A loaded ``PythonBackend`` of the ``model.py`` in ``folder/1`` (``kwargs``: more description fields)."""
    from deployments.backends.python import PythonBackend
    from deployments.backends.registry import create_backend

    backend = create_backend(context(describe(name, folder, "python", inputs, outputs, **kwargs), executor))
    assert isinstance(backend, PythonBackend)
    backend.load()
    return backend
