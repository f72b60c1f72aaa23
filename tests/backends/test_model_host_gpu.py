"""A model host's GPU memory budget (``deployments.runtime.host``, ``deployments.runtime.gpu_memory``).

The same models twice: once with a meter the models move themselves (the budget's logic, on any
machine), once allocating real device memory with PyTorch and measured through the driver (marked
``gpu``: a GPU machine runs it with ``pytest -m gpu``)."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import numpy as np
import pytest

from deployments.runtime.gpu_memory import GpuMemory, gpu_budgets
from deployments.runtime.host import ModelHost
from deployments.runtime.model import ModelRuntime
from repository_loader.errors import Unavailable
from repository_loader.model import InstanceKind, ModelDescription
from tests.backends.helpers import request
from tests.backends.test_model_host import sized_models

MIB = 2**20
METER = "triton_serve_test_gpu_meter"

# takes MIB mebibytes of GPU 0 while loaded: real device memory where METER is "cuda", else the meter's
# count; answers Y = X * 2, computed on the device when it is real
GPU_MODEL_PY = f"""
import json
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.mib = int(json.loads(args["model_config"])["parameters"]["MIB"]["string_value"])
        self.meter = sys.modules["{METER}"]
        if self.meter.kind == "cuda":
            import torch

            device = "cuda:" + args["model_instance_device_id"]
            self.block = torch.ones(self.mib * 262144, dtype=torch.float32, device=device)
        else:
            self.meter.used[0] = self.meter.used.get(0, 0) + self.mib * 1048576

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if self.meter.kind == "cuda":
                y = (self.block[: x.size].reshape(x.shape) * x.item() * 2).cpu().numpy()
            else:
                y = x * 2
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y.astype(np.float32))]))
        return responses

    def finalize(self):
        if self.meter.kind == "cuda":
            self.block = None
        else:
            self.meter.used[0] -= self.mib * 1048576
"""


@pytest.fixture
def meter() -> Iterator[types.ModuleType]:
    module = types.ModuleType(METER)
    module.kind = "fake"  # type: ignore[attr-defined]
    module.used = {}  # type: ignore[attr-defined]
    sys.modules[METER] = module
    try:
        yield module
    finally:
        del sys.modules[METER]


def _models(tmp_path: Path, sizes: dict[str, int]) -> dict[str, ModelDescription]:
    return sized_models(tmp_path, sizes, GPU_MODEL_PY)


def _host(
    models: dict[str, ModelDescription], gpu_budget_mib: int, measure_gpus: Callable[[], Mapping[int, int]]
) -> ModelHost:
    async def describe_pooled(name: str) -> ModelDescription | None:
        return models.get(name)

    return ModelHost(
        describe_pooled,
        lambda model: ModelRuntime(model, InstanceKind.GPU, 0),
        100_000 * MIB,  # host memory is not what these tests fill
        measure_gpus=measure_gpus,
        gpu_budget_bytes={0: gpu_budget_mib * MIB},
    )


async def _ask(host: ModelHost, name: str) -> float:
    answer = await host.infer(request(name, X=np.array([3.0], dtype=np.float32)))
    assert answer.error is None, answer.error
    return float(np.asarray(answer.outputs["Y"]).reshape(-1)[0])


async def _fill_and_overflow(host: ModelHost, used: Callable[[], int], unit: int) -> None:
    """Models of 1, 1, 1 and 3 units under a budget of 2.5: the third evicts the least recently used,
    the last can never fit and fails naming the GPU budget; each measured within a tenth of a unit."""
    start = used()
    assert await _ask(host, "a") == 6.0
    assert await _ask(host, "b") == 6.0
    assert set(host.resident) == {"a", "b"}
    for name in ("a", "b"):
        assert unit <= host.resident[name].gpu_footprint[0] <= unit * 1.1
    await _ask(host, "a")  # b is now the least recently used
    assert await _ask(host, "c") == 6.0
    assert set(host.resident) == {"a", "c"} and host.counters["b"].evictions == 1
    assert host.accounted_gpu_bytes()[0] <= host.gpu_budget_bytes[0]
    assert used() - start <= 2.2 * unit  # b's memory went back to the driver
    answer = await host.infer(request("big", X=np.array([3.0], dtype=np.float32)))
    assert isinstance(answer.error, Unavailable)
    assert "of GPU 0's memory once loaded, more than the GPU memory budget of" in answer.error.message
    assert "big" not in host.resident and host.counters["big"].load_failures == 1
    assert used() - start <= 2.2 * unit  # the refused load let its memory go
    assert await _ask(host, "b") == 6.0  # an evicted model loads again
    await host.close()
    assert used() - start <= 0.2 * unit


async def test_gpu_footprints_are_measured_and_evicted_by_the_gpu_budget(
    tmp_path: Path, meter: types.ModuleType
) -> None:
    models = _models(tmp_path, {"a": 100, "b": 100, "c": 100, "big": 300})
    host = _host(models, 250, lambda: dict(meter.used))  # type: ignore[attr-defined]
    await _fill_and_overflow(host, lambda: int(meter.used.get(0, 0)), 100 * MIB)  # type: ignore[attr-defined]


def test_no_driver_means_no_gpu_meter(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes

    def missing(name: str, *args: object, **kwargs: object) -> ctypes.CDLL:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    assert GpuMemory.open() is None


def test_the_default_gpu_budget_is_nine_tenths_of_what_is_free() -> None:
    class Measured(GpuMemory):
        def used(self) -> dict[int, int]:
            return {0: 1000, 1: 0}

        def total(self) -> dict[int, int]:
            return {0: 11000, 1: 5000}

    gpus = Measured(None, {0: None, 1: None})  # type: ignore[arg-type, dict-item]
    assert gpu_budgets(gpus) == {0: 9000, 1: 4500}
    assert gpu_budgets(gpus, 123) == {0: 123, 1: 123}


torch = pytest.importorskip("torch")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
async def test_real_device_memory_is_measured_through_the_driver_and_evicted(
    tmp_path: Path, meter: types.ModuleType
) -> None:
    meter.kind = "cuda"  # type: ignore[attr-defined]
    gpus = GpuMemory.open()
    assert gpus is not None and 0 in gpus.devices()
    assert gpus.total()[0] > 1024 * MIB
    assert 0 < gpu_budgets(gpus)[0] < gpus.total()[0] - gpus.used()[0]
    unit = 1024 * MIB
    models = _models(tmp_path, {"a": 1024, "b": 1024, "c": 1024, "big": 3072})
    host = _host(models, 2560, gpus.used)
    await _fill_and_overflow(host, lambda: gpus.used()[0], unit)
