"""Model descriptions and in-process executors (numpy functions, real backends) for ensemble tests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from deployments.backends.base import Backend, BackendContext
from deployments.backends.registry import create_backend
from deployments.inference import InferRequest, InferResponse
from repository_loader.errors import NotFound, ServerError
from repository_loader.model import EnsembleStep, InstanceKind, ModelDescription, TensorSpec

Spec = tuple[str, str, tuple[int, ...]]  # name, datatype, dims


def specs(items: list[Spec]) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(name, dtype, dims) for name, dtype, dims in items)


def model(
    name: str,
    inputs: list[Spec],
    outputs: list[Spec],
    max_batch_size: int = 0,
    versions: tuple[int, ...] = (1,),
    backend: str = "python",
    platform: str = "",
    path: Path | None = None,
    **extra: Any,
) -> ModelDescription:
    return ModelDescription(
        name=name,
        path=path or Path("/models") / name,
        platform=platform,
        backend=backend,
        max_batch_size=max_batch_size,
        inputs=specs(inputs),
        outputs=specs(outputs),
        versions=versions,
        **extra,
    )


def step(name: str, inputs: dict[str, str], outputs: dict[str, str], version: int = -1) -> EnsembleStep:
    return EnsembleStep(model_name=name, model_version=version, input_map=inputs, output_map=outputs)


def ensemble(
    name: str,
    inputs: list[Spec],
    outputs: list[Spec],
    steps: list[EnsembleStep],
    max_batch_size: int = 0,
    parameters: Mapping[str, str] | None = None,
) -> ModelDescription:
    return ModelDescription(
        name=name,
        path=Path("/models") / name,
        platform="ensemble",
        backend="",
        max_batch_size=max_batch_size,
        inputs=specs(inputs),
        outputs=specs(outputs),
        versions=(1,),
        ensemble_steps=tuple(steps),
        parameters=dict(parameters or {}),
    )


Function = Callable[[dict[str, Any]], Awaitable[dict[str, Any]] | dict[str, Any]]


@dataclass
class Call:
    model_name: str
    version: str
    inputs: dict[str, Any]
    requested: list[str]


@dataclass
class NumpyExecutor:
    """Runs each model as a Python function of its inputs; records every call."""

    functions: dict[tuple[str, int], Function]
    latest: dict[str, int] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)

    def add(self, name: str, function: Function, version: int = 1) -> None:
        self.functions[(name, version)] = function
        self.latest[name] = max(version, self.latest.get(name, 0))

    async def infer(self, request: InferRequest) -> InferResponse:
        version = (
            int(request.model_version) if request.model_version else self.latest.get(request.model_name, 0)
        )
        requested = [o.name for o in request.requested_outputs or []]
        self.calls.append(Call(request.model_name, str(version), dict(request.inputs), requested))
        function = self.functions.get((request.model_name, version))
        if function is None:
            return InferResponse(error=NotFound(f"model '{request.model_name}' version {version} not found"))
        try:
            result = function(dict(request.inputs))
            if asyncio.iscoroutine(result):
                result = await result
        except ServerError as error:
            return InferResponse(error=error)
        outputs = {k: v for k, v in result.items() if not requested or k in requested}
        return InferResponse(outputs=outputs, model_name=request.model_name, model_version=str(version))

    def called(self, name: str) -> list[Call]:
        return [c for c in self.calls if c.model_name == name]


def fp32(*values: float) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


class BackendExecutor:
    """Runs each model version with its real backend, loaded in this process."""

    def __init__(self, models: dict[str, ModelDescription], kind: InstanceKind = InstanceKind.CPU) -> None:
        self.models = models
        self.backends: dict[tuple[str, int], Backend] = {}
        for description in models.values():
            for version in description.versions:
                backend = create_backend(BackendContext(description, version, instance_kind=kind))
                backend.load()
                self.backends[(description.name, version)] = backend
        self.calls: list[tuple[str, int]] = []
        self.outputs: list[dict[str, Any]] = []  # every step's outputs, in the order they came

    async def infer(self, request: InferRequest) -> InferResponse:
        description = self.models[request.model_name]
        version = int(request.model_version) if request.model_version else description.latest_version
        backend = self.backends.get((request.model_name, version))
        if backend is None:
            return InferResponse(error=NotFound(f"model '{request.model_name}' version {version} not found"))
        self.calls.append((request.model_name, version))
        (response,) = await backend.execute([request])
        self.outputs.append(dict(response.outputs))
        return response

    def close(self) -> None:
        """Unload every backend (Python models: ``finalize`` and their worker threads)."""
        for backend in self.backends.values():
            backend.unload()
        self.backends.clear()
