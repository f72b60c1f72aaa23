"""The ensemble backend: the hosted group loaded in process, tensors handed on without copies.

Real Python-backend models (``python_models/probe``) report the buffer
addresses they receive and return, so a copy anywhere between hosted steps
shows as two different addresses.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import ensembles.backend as ensemble_backend
from deployments.backends.base import BackendContext
from deployments.inference import InferRequest, InferResponse
from deployments.runtime.model import ModelRuntime
from deployments.runtime.router import Router
from deployments.tensors import data_ptr, to_numpy
from ensembles.backend import EnsembleBackend, consumer_framework, hand_on
from repository_loader.errors import ConfigError, Unavailable
from repository_loader.model import (
    DynamicBatching,
    EnsembleStep,
    InstanceGroup,
    InstanceKind,
    ModelDescription,
)
from tests.ensembles.helpers import BackendExecutor, NumpyExecutor, ensemble, model, step

PROBE = Path(__file__).resolve().parent / "python_models" / "probe"
VEC = ("FP32", (16,))
ADDRESS = ("INT64", (1,))
CPU = (InstanceGroup("c", InstanceKind.CPU, 1),)
GPU = (InstanceGroup("g", InstanceKind.GPU, 1),)
# numpy producer -> torch in place -> numpy in place -> DLPack identity
CHAIN = (("make", "fresh"), ("scale", "torch_scale"), ("shift", "numpy_shift"), ("read", "identity"))


def probe(name: str, op: str, groups: tuple[InstanceGroup, ...] = CPU, **parameters: str) -> ModelDescription:
    return model(
        name,
        [("X", *VEC)],
        [("Y", *VEC), ("IN_ADDRESS", *ADDRESS), ("OUT_ADDRESS", *ADDRESS)],
        max_batch_size=8,
        path=PROBE,
        instance_groups=groups,
        dynamic_batching=DynamicBatching(),
        parameters={"op": op, **parameters},
    )


def probe_step(name: str, source: str, target: str) -> EnsembleStep:
    return step(name, {"X": source}, {"Y": target, "IN_ADDRESS": f"{name}_in", "OUT_ADDRESS": f"{name}_out"})


def chain(
    parameters: Mapping[str, str] | None = None, groups: Mapping[str, tuple[InstanceGroup, ...]] | None = None
) -> tuple[ModelDescription, dict[str, ModelDescription]]:
    """INPUT -> make -> scale -> shift -> read -> OUTPUT, every step's addresses as outputs too."""
    models = {name: probe(name, op, (groups or {}).get(name, CPU)) for name, op in CHAIN}
    steps, outputs, source = [], [("OUTPUT", *VEC)], "INPUT"
    for name, _ in CHAIN:
        target = "OUTPUT" if name == "read" else f"{name}_y"
        steps.append(probe_step(name, source, target))
        outputs += [(f"{name}_in", *ADDRESS), (f"{name}_out", *ADDRESS)]
        source = target
    return ensemble("chain", [("INPUT", *VEC)], outputs, steps, 8, parameters), models


class Refusing:
    """An executor for tests where every step must run in process."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def infer(self, request: InferRequest) -> InferResponse:
        self.calls.append(request.model_name)
        return InferResponse(error=Unavailable(f"'{request.model_name}' was sent out of the replica"))


@pytest.fixture
async def started() -> AsyncIterator[list[EnsembleBackend]]:
    """Backends a test starts; stopped and unloaded at its end."""
    backends: list[EnsembleBackend] = []
    yield backends
    for backend in backends:
        await backend.stop()
        backend.unload()


async def start(
    started: list[EnsembleBackend],
    ens: ModelDescription,
    models: Mapping[str, ModelDescription],
    executor: object,
    kind: InstanceKind = InstanceKind.CPU,
) -> EnsembleBackend:
    backend = EnsembleBackend(BackendContext(ens, 1, instance_kind=kind, executor=executor), models)  # type: ignore[arg-type]
    backend.load()
    started.append(backend)
    await backend.start()
    return backend


def address(response: InferResponse, name: str) -> int:
    return int(np.asarray(response.outputs[name])[0, 0])


def expected(x: np.ndarray) -> np.ndarray:
    return (x + 1) * 2 + 3


async def infer(backend: EnsembleBackend, x: np.ndarray) -> InferResponse:
    (response,) = await backend.execute([InferRequest("chain", {"INPUT": x})])
    assert response.error is None, response.error.message
    return response


async def test_hosted_steps_share_one_buffer(started) -> None:
    ens, models = chain()
    outer = Refusing()
    backend = await start(started, ens, models, outer)
    assert list(backend.hosted) == ["make", "scale", "shift", "read"] and outer.calls == []
    x = np.arange(32, dtype=np.float32).reshape(2, 16)
    response = await infer(backend, x)
    made = address(response, "make_out")
    assert made != data_ptr(x)  # make writes a fresh buffer: the one that must travel on
    for name in ("scale", "shift", "read"):
        assert address(response, f"{name}_in") == made, f"{name} received a copy"
        assert address(response, f"{name}_out") == made, f"{name} returned a copy"
    assert data_ptr(response.outputs["OUTPUT"]) == made
    np.testing.assert_array_equal(to_numpy(response.outputs["OUTPUT"]), expected(x))
    assert outer.calls == []


async def test_hosted_models_keep_their_own_statistics(started) -> None:
    ens, models = chain()
    backend = await start(started, ens, models, Refusing())
    for rows in (1, 3):
        await infer(backend, np.zeros((rows, 16), dtype=np.float32))
    stats = backend.hosted_statistics()
    assert [(s["name"], s["version"]) for s in stats] == [
        ("make", "1"),
        ("read", "1"),
        ("scale", "1"),
        ("shift", "1"),
    ]
    assert all(s["inference_count"] == 4 and s["inference_stats"]["success"]["count"] == 2 for s in stats)


async def test_separate_sends_every_step_to_the_executor(started) -> None:
    ens, models = chain({"placement": "separate"})
    outer = BackendExecutor(models)
    try:
        backend = await start(started, ens, models, outer)
        assert backend.hosted == {} and backend.hosted_statistics() == []
        x = np.ones((1, 16), dtype=np.float32)
        response = await infer(backend, x)
        np.testing.assert_array_equal(to_numpy(response.outputs["OUTPUT"]), expected(x))
        assert [name for name, _ in outer.calls] == ["make", "scale", "shift", "read"]
    finally:
        outer.close()


async def test_steps_outside_the_hosted_group_go_to_the_executor(started) -> None:
    """scale needs a GPU the replica lacks: it runs on its deployment; shift -> read stays in process."""
    ens, models = chain(groups={"scale": GPU})
    outer = BackendExecutor({"scale": models["scale"]})
    try:
        backend = await start(started, ens, models, outer)
        assert list(backend.hosted) == ["make", "shift", "read"]
        x = np.ones((2, 16), dtype=np.float32)
        response = await infer(backend, x)
        assert outer.calls == [("scale", 1)]
        assert address(response, "read_in") == address(response, "shift_out")
        np.testing.assert_array_equal(to_numpy(response.outputs["OUTPUT"]), expected(x))
    finally:
        outer.close()


async def test_bls_inside_a_hosted_model_reaches_the_executor(started) -> None:
    models = {"make": probe("make", "fresh"), "ask": probe("ask", "bls", target="times_ten")}
    ens = ensemble(
        "chain",
        [("INPUT", *VEC)],
        [("OUTPUT", *VEC)],
        [step("make", {"X": "INPUT"}, {"Y": "made"}), step("ask", {"X": "made"}, {"Y": "OUTPUT"})],
        8,
    )
    outer = NumpyExecutor({})
    outer.add("times_ten", lambda inputs: {"Y": to_numpy(inputs["X"]) * 10})
    backend = await start(started, ens, models, outer)
    assert list(backend.hosted) == ["make", "ask"]
    x = np.ones((1, 16), dtype=np.float32)
    response = await infer(backend, x)
    np.testing.assert_array_equal(to_numpy(response.outputs["OUTPUT"]), (x + 1) * 10)
    assert [c.model_name for c in outer.calls] == ["times_ten"]


async def test_nested_ensembles_run_inline_on_the_hosted_models(started) -> None:
    models = {name: probe(name, op) for name, op in CHAIN}
    inner = ensemble(
        "inner",
        [("I", *VEC)],
        [("O", *VEC), ("scale_in", *ADDRESS), ("shift_out", *ADDRESS)],
        [probe_step("scale", "I", "scaled"), probe_step("shift", "scaled", "O")],
        8,
    )
    outer_ensemble = ensemble(
        "chain",
        [("INPUT", *VEC)],
        [("OUTPUT", *VEC), ("make_out", *ADDRESS), ("scale_in", *ADDRESS), ("read_in", *ADDRESS)],
        [
            probe_step("make", "INPUT", "made"),
            step("inner", {"I": "made"}, {"O": "shifted", "scale_in": "scale_in", "shift_out": "shift_out"}),
            probe_step("read", "shifted", "OUTPUT"),
        ],
        8,
    )
    outer = Refusing()
    backend = await start(started, outer_ensemble, {**models, "inner": inner}, outer)
    assert list(backend.hosted) == ["make", "scale", "shift", "read"]
    x = np.zeros((1, 16), dtype=np.float32)
    response = await infer(backend, x)
    assert address(response, "scale_in") == address(response, "read_in") == address(response, "make_out")
    np.testing.assert_array_equal(to_numpy(response.outputs["OUTPUT"]), expected(x))
    assert outer.calls == []


async def test_stop_closes_the_hosted_models_and_their_threads(started) -> None:
    ens, models = chain()
    backend = await start(started, ens, models, Refusing())
    await infer(backend, np.zeros((1, 16), dtype=np.float32))
    runtimes = list(backend.hosted.values())
    backends = [v.backend for r in runtimes for v in r.versions.values()]
    threads = [t for b in backends for t in b._pool._threads]  # type: ignore[attr-defined]
    assert threads, "the probes ran in their worker threads"
    await backend.stop()
    assert backend.hosted == {} and all(r.versions == {} for r in runtimes)
    assert all(b._instance is None for b in backends)  # type: ignore[attr-defined]
    assert not any(t.is_alive() for t in threads)


async def test_unload_without_stop_still_releases_the_hosted_models(started) -> None:
    ens, models = chain()
    backend = await start(started, ens, models, Refusing())
    backends = [v.backend for r in backend.hosted.values() for v in r.versions.values()]
    backend.unload()
    assert backend.hosted == {} and all(b._instance is None for b in backends)  # type: ignore[attr-defined]


async def test_a_hosted_model_failing_to_load_closes_the_others(started, monkeypatch, tmp_path) -> None:
    ens, models = chain()
    models["read"] = replace(models["read"], path=tmp_path / "nowhere")
    made: list[ModelRuntime] = []

    class Recorded(ModelRuntime):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(ensemble_backend, "ModelRuntime", Recorded)
    with pytest.raises(Unavailable, match="model 'read': no Python model file"):
        await start(started, ens, models, Refusing())
    assert [r.model.name for r in made] == ["make", "scale", "shift", "read"]
    assert started[0].hosted == {} and all(r.versions == {} for r in made)


async def test_bad_placement_parameters_fail_the_load() -> None:
    ens, models = chain({"placement.ghost": "x"})
    backend = EnsembleBackend(BackendContext(ens, 1, executor=Refusing()), models)
    with pytest.raises(ConfigError, match="names model 'ghost', which is not a step"):
        backend.load()


async def test_the_model_runtime_starts_and_stops_the_hosted_group() -> None:
    """The serving path: ModelRuntime loads the ensemble, which loads its group; close unloads both."""
    ens, models = chain()
    runtime = ModelRuntime(ens, executor=Refusing(), composing=models)
    await runtime.load()
    try:
        x = np.ones((2, 16), dtype=np.float32)
        response = await runtime.infer(InferRequest("chain", {"INPUT": x}))
        assert response.error is None
        np.testing.assert_array_equal(to_numpy(response.outputs["OUTPUT"]), expected(x))
        backend = runtime.version(1).backend
        assert isinstance(backend, EnsembleBackend)
        hosted = list(backend.hosted.values())
        assert [s["inference_count"] for s in backend.hosted_statistics()] == [2, 2, 2, 2]
    finally:
        await runtime.close()
    assert backend.hosted == {} and all(r.versions == {} for r in hosted)


async def test_steps_not_hosted_go_to_the_replica_executor() -> None:
    outer = NumpyExecutor({})
    outer.add("away", lambda inputs: {"Y": inputs["X"]})
    executor = Router({}, remote=outer)
    response = await executor.infer(InferRequest("away", {"X": np.zeros(1, dtype=np.float32)}))
    assert response.error is None and [c.model_name for c in outer.calls] == ["away"]


def test_hand_on_gives_each_backend_its_framework_without_copies() -> None:
    array = np.arange(8, dtype=np.float32)
    torch_model = model("t", [], [], backend="pytorch", platform="pytorch_libtorch")
    onnx_model = model("o", [], [], backend="onnxruntime", platform="onnxruntime_onnx")
    python_model = model("p", [], [])
    as_torch = hand_on(torch_model, array)
    assert isinstance(as_torch, torch.Tensor) and data_ptr(as_torch) == data_ptr(array)
    back = hand_on(onnx_model, as_torch)
    assert isinstance(back, np.ndarray) and data_ptr(back) == data_ptr(array)
    assert hand_on(python_model, as_torch) is as_torch
    strings = np.array([b"a", b"b"], dtype=object)
    assert hand_on(torch_model, strings) is strings
    assert consumer_framework(python_model, array) is None
    assert consumer_framework(onnx_model, as_torch) == "numpy"


async def test_an_ensembles_failures_count_its_failed_steps_as_other() -> None:
    # Triton labels an ensemble's failures OTHER, and counts each failed request of its steps there
    # too (L0_model_queue's test_policy_reject: a step's queue timeout is 2 for the ensemble)
    from repository_loader.errors import Rejected

    vec = ("FP32", (4,))
    one = model("one", [("X", *vec)], [("Y", *vec)])
    ens = ensemble("pipe", [("IN", *vec)], [("OUT", *vec)], [step("one", {"X": "IN"}, {"Y": "OUT"})])
    outer = NumpyExecutor({})

    def refuse(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if float(inputs["X"][0]) < 0:
            raise Rejected("Request timeout expired")
        return {"Y": inputs["X"]}

    outer.add("one", refuse)
    runtime = ModelRuntime(ens, executor=outer, composing={"one": one})
    await runtime.load()
    try:
        for value in (1.0, -1.0, -1.0):
            response = await runtime.infer(InferRequest("pipe", {"IN": np.full(4, value, dtype=np.float32)}))
            assert (response.error is None) == (value > 0)
        assert runtime.request_metrics()["failures"] == {"1": {"OTHER": 4}}
    finally:
        await runtime.close()
