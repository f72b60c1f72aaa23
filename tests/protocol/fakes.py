"""An in-memory data plane over real computations (numpy functions, an onnxruntime session).

It stands in for the serving layer so that the protocol front end can be
tested end to end with real clients, without Ray.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from deployments.inference import InferRequest, InferResponse
from deployments.protocol.dataplane import (
    empty_model_statistics,
    model_metadata_document,
    server_metadata_document,
)
from deployments.protocol.log_settings import LogBoard
from deployments.protocol.shared_memory import local_shared_memory
from deployments.runtime.checks import ModelSchema
from deployments.settings import LogSettings
from deployments.tracing.control import LocalTraces
from deployments.tracing.spans import Tracer
from deployments.tracing.store import read_changes
from repository_loader.errors import InvalidArgument, NotFound, Unavailable
from repository_loader.model import ModelDescription, ModelState, TensorSpec

Compute = Callable[[Mapping[str, Any], int], dict[str, np.ndarray]]

LABELS = ["cat", "dog", "bird"]


@dataclass
class FakeModel:
    description: ModelDescription
    compute: Compute
    ready: bool = True
    stats: dict[int, dict[str, Any]] = field(default_factory=dict)


class FakeDataPlane:
    """A :class:`~deployments.protocol.dataplane.DataPlane` serving models in this process."""

    def __init__(self, models: list[FakeModel]) -> None:
        self.models = {m.description.name: m for m in models}
        self.loaded: list[tuple[str, dict]] = []
        self.unloaded: list[tuple[str, dict]] = []
        self.requests: list[InferRequest] = []
        self.logs = LogBoard(LogSettings())
        self.shared_memory = local_shared_memory()  # system shared memory, as the server application holds it
        self.traces = LocalTraces(tracer=Tracer())  # this fake's own: the process's tracer stays off

    def _model(self, name: str) -> FakeModel:
        model = self.models.get(name)
        if model is None:
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        return model

    def _version(self, model: FakeModel, version: str) -> int:
        if not version:
            return model.description.latest_version
        if not version.isdigit() or int(version) not in model.description.versions:
            raise NotFound(
                f"Request for unknown model: '{model.description.name}' version {version} is not found"
            )
        return int(version)

    async def server_metadata(self) -> dict[str, Any]:
        return server_metadata_document()

    async def live(self) -> bool:
        return True

    async def ready(self) -> bool:
        return all(m.ready for m in self.models.values())

    async def model_ready(self, name: str, version: str = "") -> bool:
        model = self._model(name)
        self._version(model, version)
        return model.ready

    async def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        model = self._model(name)
        self._version(model, version)
        return model_metadata_document(model.description)

    async def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        model = self._model(name)
        self._version(model, version)
        return dict(model.description.config_json)

    async def model_description(self, name: str, version: str = "") -> ModelDescription:
        model = self._model(name)
        self._version(model, version)
        return model.description

    async def infer(self, request: InferRequest, raw: Any = None) -> InferResponse:
        model = self._model(request.model_name)
        version = self._version(model, request.model_version)
        if not model.ready:
            raise Unavailable(f"model '{request.model_name}' is not ready")
        try:  # the model runtime checks every request first
            ModelSchema.from_description(model.description).check_request(request)
        except InvalidArgument as error:
            return InferResponse.failed(request, error)
        self.requests.append(request)
        start = time.perf_counter_ns()
        outputs = model.compute(request.inputs, version)
        elapsed = time.perf_counter_ns() - start
        stats = model.stats.setdefault(version, empty_model_statistics(request.model_name, str(version)))
        stats["inference_count"] += request.batch_rows() if model.description.max_batch_size else 1
        stats["execution_count"] += 1
        stats["inference_stats"]["success"]["count"] += 1
        stats["inference_stats"]["success"]["ns"] += elapsed
        return InferResponse(outputs=outputs, model_name=request.model_name, model_version=str(version))

    async def infer_stream(self, request: InferRequest) -> AsyncGenerator[InferResponse, None]:
        """A model that is not decoupled streams its one response."""
        yield await self.infer(request)

    async def model_statistics(self, name: str | None = None, version: str = "") -> dict[str, Any]:
        chosen = self.models.values() if name is None else [self._model(name)]
        entries = []
        for model in chosen:
            versions = model.description.versions if not version else (self._version(model, version),)
            for v in versions:
                default = empty_model_statistics(model.description.name, str(v))
                entries.append(model.stats.get(v, default))
        return {"model_stats": entries}

    async def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        index = []
        for model in self.models.values():
            state = ModelState.READY if model.ready else ModelState.UNAVAILABLE
            if ready_only and state != ModelState.READY:
                continue
            entry = {"name": model.description.name, "version": str(model.description.latest_version)}
            entry["state"] = state.value
            if state != ModelState.READY:
                entry["reason"] = "not ready"
            index.append(entry)
        return index

    async def load_model(self, name: str, parameters: Mapping[str, Any]) -> None:
        if name not in self.models and "config" not in parameters:
            raise InvalidArgument(f"failed to load '{name}', no version is available")
        self.loaded.append((name, dict(parameters)))

    async def unload_model(self, name: str, parameters: Mapping[str, Any]) -> None:
        self._model(name)
        self.unloaded.append((name, dict(parameters)))

    async def log_settings(self) -> LogSettings:
        return self.logs.current

    async def update_log_settings(self, changes: Mapping[str, Any]) -> LogSettings:
        return await self.logs.update(changes)

    async def trace_settings(self, name: str | None = None) -> dict[str, Any]:
        self._traced_model(name)
        return await self.traces.settings(name)

    async def update_trace_settings(self, name: str | None, settings: Mapping[str, Any]) -> dict[str, Any]:
        self._traced_model(name)
        return await self.traces.update(name, read_changes(settings))

    def _traced_model(self, name: str | None) -> None:
        if name and name not in self.models:
            raise InvalidArgument(f"Request for unknown model : {name}")


def _description(
    name: str,
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    max_batch_size: int = 0,
    versions: tuple[int, ...] = (1,),
    path: Path = Path("/nonexistent"),
    backend: str = "python",
    platform: str = "",
) -> ModelDescription:
    config = {
        "name": name,
        "backend": backend,
        "platform": platform,
        "max_batch_size": max_batch_size,
        "input": [{"name": t.name, "data_type": "TYPE_" + t.datatype, "dims": list(t.dims)} for t in inputs],
        "output": [
            {"name": t.name, "data_type": "TYPE_" + t.datatype, "dims": list(t.dims)} for t in outputs
        ],
    }
    return ModelDescription(
        name=name,
        path=path,
        platform=platform,
        backend=backend,
        max_batch_size=max_batch_size,
        inputs=inputs,
        outputs=outputs,
        versions=versions,
        config_json=config,
    )


def add_sub_model() -> FakeModel:
    """FP32 [16] x 2 -> sum and difference; batching up to 8; version 2 adds 1 to the sum."""
    spec = (16,)
    description = _description(
        "add_sub",
        (TensorSpec("INPUT0", "FP32", spec), TensorSpec("INPUT1", "FP32", spec)),
        (TensorSpec("OUTPUT0", "FP32", spec), TensorSpec("OUTPUT1", "FP32", spec)),
        max_batch_size=8,
        versions=(1, 2),
    )

    def compute(inputs: Mapping[str, Any], version: int) -> dict[str, np.ndarray]:
        a, b = inputs["INPUT0"], inputs["INPUT1"]
        return {"OUTPUT0": a + b + (version - 1), "OUTPUT1": a - b}

    return FakeModel(description, compute)


def bytes_model() -> FakeModel:
    """BYTES [-1] -> each element upper-cased, and the lengths as INT32; no batching."""
    description = _description(
        "strings",
        (TensorSpec("TEXT", "BYTES", (-1,)),),
        (TensorSpec("UPPER", "BYTES", (-1,)), TensorSpec("LENGTH", "INT32", (-1,))),
    )

    def compute(inputs: Mapping[str, Any], version: int) -> dict[str, np.ndarray]:
        text = inputs["TEXT"]
        upper = np.array([bytes(x).upper() for x in text.reshape(-1)], dtype=object).reshape(text.shape)
        lengths = np.array([len(x) for x in text.reshape(-1)], dtype=np.int32).reshape(text.shape)
        return {"UPPER": upper, "LENGTH": lengths}

    return FakeModel(description, compute)


def onnx_classifier(folder: Path) -> FakeModel:
    """A real onnxruntime session: FP32 [-1, 4] -> softmax over 3 classes, labelled by a label file."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    weights = np.array([[1, 0, 0], [0, 2, 0], [0, 0, 3], [1, 1, 1]], dtype=np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["INPUT", "W"], ["LOGITS"]),
            helper.make_node("Softmax", ["LOGITS"], ["PROB"], axis=1),
        ],
        "classifier",
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("PROB", TensorProto.FLOAT, ["batch", 3])],
        initializer=[numpy_helper.from_array(weights, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (folder / "labels.txt").write_text("\n".join(LABELS) + "\n")
    description = _description(
        "classifier",
        (TensorSpec("INPUT", "FP32", (4,)),),
        (TensorSpec("PROB", "FP32", (3,), label_filename="labels.txt"),),
        max_batch_size=4,
        path=folder,
        backend="onnxruntime",
        platform="onnxruntime_onnx",
    )

    def compute(inputs: Mapping[str, Any], version: int) -> dict[str, np.ndarray]:
        (prob,) = session.run(None, {"INPUT": inputs["INPUT"]})
        return {"PROB": prob}

    compute.weights = weights  # type: ignore[attr-defined]
    return FakeModel(description, compute)


def broken_model() -> FakeModel:
    """A model that is listed but not ready."""
    description = _description("broken", (TensorSpec("X", "INT64", (1,)),), (TensorSpec("Y", "INT64", (1,)),))
    return FakeModel(description, lambda inputs, version: {"Y": inputs["X"]}, ready=False)


def all_models(folder: Path) -> list[FakeModel]:
    return [add_sub_model(), bytes_model(), onnx_classifier(folder), broken_model()]


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)
