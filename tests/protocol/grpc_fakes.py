"""The HTTP tests' in-memory data plane, extended with decoupled models for the gRPC tests.

:class:`StreamingFakeDataPlane` adds ``infer_stream`` to
:class:`tests.protocol.fakes.FakeDataPlane`, and two models: ``repeat`` (decoupled:
answers a request with ``COUNT`` responses, then an empty final one) and
``echo_slow`` (not decoupled: waits a random moment, then echoes its input,
so that concurrent requests complete out of order; with the parameter ``hold``,
until the test sets ``released``). Like the model runtime,
it checks each request against its model's schema before running it (the
decoders only parse).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from deployments.inference import InferRequest, InferResponse
from deployments.runtime.checks import ModelSchema
from repository_loader.datatypes import from_numpy_dtype
from repository_loader.errors import InvalidArgument, Unavailable
from repository_loader.model import TensorSpec
from tests.protocol.fakes import FakeDataPlane, FakeModel, _description, all_models


class StreamingFakeDataPlane(FakeDataPlane):
    """A data plane that also streams the responses of decoupled models."""

    def __init__(self, models: list[FakeModel]) -> None:
        super().__init__(models)
        self.cancelled: list[str] = []
        self.released = threading.Event()  # ends the wait of echo_slow's requests with ``hold`` set

    async def infer(self, request: InferRequest, raw: Any = None) -> InferResponse:
        model = self._model(request.model_name)
        self._version(model, request.model_version)
        if model.ready:
            check(ModelSchema.from_description(model.description), request)
        if model.description.name == "echo_slow":
            # 2 to 10 ms, or the request's ``delay_s``: a test that needs its deadline to pass first asks
            # for a second (a loaded machine's client timer fired after a 10 ms answer, at random)
            await asyncio.sleep(float(request.parameters.get("delay_s", random.uniform(0.002, 0.01))))
            deadline = time.monotonic() + 60
            while request.parameters.get("hold") and not self.released.is_set():
                assert time.monotonic() < deadline, "echo_slow held for a minute: never released"
                await asyncio.sleep(0.01)
        return await super().infer(request)

    async def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        model = self._model(request.model_name)
        version = self._version(model, request.model_version)
        if not model.ready:
            raise Unavailable(f"model '{request.model_name}' is not ready")
        check(ModelSchema.from_description(model.description), request)
        count = int(np.asarray(request.inputs["COUNT"]).reshape(-1)[0])
        value = int(np.asarray(request.inputs["VALUE"]).reshape(-1)[0])
        if count < 0:
            raise InvalidArgument(f"COUNT must be non-negative, got {count}")
        try:
            for index in range(count):
                await asyncio.sleep(random.uniform(0, 0.002))
                outputs = {
                    "INDEX": np.array([index], dtype=np.int32),
                    "VALUE": np.array([value], dtype=np.int32),
                }
                yield InferResponse(
                    outputs=outputs, final=False, model_name=request.model_name, model_version=str(version)
                )
            yield InferResponse(final=True, model_name=request.model_name, model_version=str(version))
        except asyncio.CancelledError:
            self.cancelled.append(request.id)
            raise


def check(schema: ModelSchema, request: InferRequest) -> None:
    """Triton's request rules, as the model runtime applies them at its boundary."""
    batch_sizes: set[int] = set()
    for name, tensor in request.inputs.items():
        datatype = "BYTES" if tensor.dtype == object else from_numpy_dtype(tensor.dtype)
        schema.check_input(name, datatype, tensor.shape)
        if schema.max_batch_size > 0:
            batch_sizes.add(tensor.shape[0])
    schema.check_complete(list(request.inputs), batch_sizes)
    for output in request.requested_outputs or ():
        schema.check_output(output.name)


def repeat_model() -> FakeModel:
    """Decoupled: INT32 COUNT [1], INT32 VALUE [1] -> COUNT responses of (INDEX, VALUE)."""
    description = _description(
        "repeat",
        (TensorSpec("COUNT", "INT32", (1,)), TensorSpec("VALUE", "INT32", (1,))),
        (TensorSpec("INDEX", "INT32", (1,)), TensorSpec("VALUE", "INT32", (1,))),
    )
    description = _replace(description, decoupled=True)
    config = dict(description.config_json)
    config["model_transaction_policy"] = {"decoupled": True}
    return FakeModel(_replace(description, config_json=config), _not_unary)


def echo_slow_model() -> FakeModel:
    """INT64 [-1] -> the same tensor, after a random pause of up to 10 ms."""
    description = _description(
        "echo_slow", (TensorSpec("X", "INT64", (-1,)),), (TensorSpec("Y", "INT64", (-1,)),)
    )
    return FakeModel(description, lambda inputs, version: {"Y": np.array(inputs["X"])})


def grpc_models(folder: Path) -> list[FakeModel]:
    """The HTTP tests' models (add_sub, strings, classifier, broken) and the two above."""
    return [*all_models(folder), repeat_model(), echo_slow_model()]


def _not_unary(inputs: Mapping[str, Any], version: int) -> dict[str, np.ndarray]:
    raise AssertionError("a decoupled model is only run through infer_stream")


def _replace(description: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(description, **changes)
