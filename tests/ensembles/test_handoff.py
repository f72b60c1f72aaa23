"""Tensor hand-off: zero copy in process, CUDA IPC across processes, host arrays elsewhere."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from bench.cuda_ipc import (
    CudaIpcPayload,
    HandoffPolicy,
    HostPayload,
    InProcessPayload,
    IpcRegistry,
    Location,
    export_tensor,
    open_payload,
)
from deployments.inference import InferRequest
from deployments.tensors import as_framework, data_ptr, device_of, to_numpy
from ensembles.graph import StepNode, build_graph
from ensembles.handoff import Route
from ensembles.scheduler import EnsembleScheduler
from repository_loader.errors import InternalError, Unsupported
from tests.ensembles.helpers import NumpyExecutor, ensemble, model, step

M = ("FP32", (64, 64))


async def test_zero_copy_across_three_steps() -> None:
    """numpy producer -> torch step (in place) -> numpy step: one buffer throughout."""
    table = {
        "make": model("make", [("X", *M)], [("Y", *M)]),
        "scale": model("scale", [("X", *M)], [("Y", *M)]),
        "shift": model("shift", [("X", *M)], [("Y", *M)]),
        "read": model("read", [("X", *M)], [("Y", *M)]),
    }
    graph = build_graph(
        ensemble(
            "chain",
            [("INPUT", *M)],
            [("OUTPUT", *M)],
            [
                step("make", {"X": "INPUT"}, {"Y": "a"}),
                step("scale", {"X": "a"}, {"Y": "b"}),
                step("shift", {"X": "b"}, {"Y": "c"}),
                step("read", {"X": "c"}, {"Y": "OUTPUT"}),
            ],
        ),
        table,
    )
    frameworks = {"make": "numpy", "scale": "torch", "shift": "numpy", "read": "torch"}
    seen: dict[str, int] = {}

    def receive(name: str, inputs: dict) -> object:
        x = inputs["X"]
        expected = torch.Tensor if frameworks[name] == "torch" else np.ndarray
        assert isinstance(x, expected)
        seen[name] = data_ptr(x)
        return x

    def make(inputs: dict) -> dict:
        out = inputs["X"] + 1.0  # a fresh buffer: the one that must travel on
        seen["made"] = data_ptr(out)
        return {"Y": out}

    def scale(inputs: dict) -> dict:
        return {"Y": receive("scale", inputs).mul_(2.0)}

    def shift(inputs: dict) -> dict:
        x = receive("shift", inputs)
        np.add(x, 3.0, out=x)
        return {"Y": x}

    ex = NumpyExecutor({})
    ex.add("make", make)
    ex.add("scale", scale)
    ex.add("shift", shift)
    ex.add("read", lambda i: {"Y": receive("read", i)})

    def handoff(node: StepNode, name: str, tensor: object) -> object:
        return as_framework(tensor, frameworks[node.model_name])

    scheduler = EnsembleScheduler(graph, ex, handoff=handoff)
    data = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    response = await scheduler.infer(InferRequest("chain", {"INPUT": data}))
    assert response.error is None
    assert seen["scale"] == seen["shift"] == seen["read"] == seen["made"]
    assert data_ptr(response.outputs["OUTPUT"]) == seen["made"]
    np.testing.assert_array_equal(np.from_dlpack(response.outputs["OUTPUT"]), (data + 1) * 2 + 3)


def test_policy_routes() -> None:
    policy = HandoffPolicy()
    a = Location("node1", "replica1", "cuda:0")
    assert policy.route(a, Location("node1", "replica1", "cuda:0")) is Route.IN_PROCESS
    assert policy.route(a, Location("node1", "replica2", "cuda:0")) is Route.CUDA_IPC
    assert policy.route(a, Location("node2", "replica3", "cuda:0")) is Route.HOST
    cpu = Location("node1", "replica1")
    assert policy.route(cpu, Location("node1", "replica2")) is Route.HOST
    assert policy.route(cpu, Location("node1", "replica1")) is Route.IN_PROCESS


def test_in_process_payload_is_the_same_object() -> None:
    t = torch.ones(4)
    payload = export_tensor(t, Route.IN_PROCESS)
    assert isinstance(payload, InProcessPayload)
    assert open_payload(payload) is t
    view = open_payload(payload, "numpy")
    assert isinstance(view, np.ndarray) and data_ptr(view) == t.data_ptr()


def test_host_payload_carries_the_bytes_for_the_object_store() -> None:
    t = torch.arange(6, dtype=torch.float32)
    payload = export_tensor(t, Route.HOST)
    assert isinstance(payload, HostPayload)
    assert data_ptr(payload.array) == t.data_ptr()  # a host tensor is not copied to pack it
    copy = pickle.loads(pickle.dumps(payload))
    np.testing.assert_array_equal(open_payload(copy), np.arange(6, dtype=np.float32))
    assert isinstance(open_payload(copy, "torch"), torch.Tensor)


def test_framework_and_device_checks() -> None:
    a = np.zeros(3, dtype=np.float32)
    assert device_of(a) == ("cpu", 0) and device_of(torch.zeros(1)) == ("cpu", 0)
    assert to_numpy(a) is a
    assert data_ptr(as_framework(a, "torch")) == data_ptr(a)
    with pytest.raises(Unsupported, match="unknown tensor framework 'jax'"):
        as_framework(a, "jax")
    with pytest.raises(Unsupported, match="device tensors only"):
        IpcRegistry().export(torch.zeros(2))
    with pytest.raises(InternalError, match="needs the producer's IpcRegistry"):
        export_tensor(torch.zeros(2), Route.CUDA_IPC)
    with pytest.raises(InternalError, match="handle 9 is not held"):
        IpcRegistry().release(9)


def _ipc_consumer(inbox, outbox) -> None:  # runs in the spawned process
    payload = inbox.get()
    tensor = open_payload(payload)
    result = (str(tensor.device), float(tensor.sum().item()))
    tensor.add_(1.0)  # written into the producer's memory: visible there only if shared
    torch.cuda.synchronize()
    del tensor
    outbox.put((result, payload.key))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_ipc_round_trip() -> None:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    consumer = ctx.Process(target=_ipc_consumer, args=(inbox, outbox))
    consumer.start()
    registry = IpcRegistry(owner="producer")
    tensor = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    expected = float(tensor.sum().item())
    payload = export_tensor(tensor, Route.CUDA_IPC, registry)
    assert isinstance(payload, CudaIpcPayload)
    assert len(pickle.dumps(payload)) < payload.nbytes // 100  # a handle, not the tensor bytes
    assert len(registry) == 1
    inbox.put(payload)
    (device, total), key = outbox.get(timeout=120)
    consumer.join(timeout=60)
    assert device.startswith("cuda")
    assert total == pytest.approx(expected, rel=1e-6)
    # the consumer's in-place add reached this process's buffer: the memory was shared, not copied
    assert float(tensor[0].item()) == 1.0 and float(tensor[-1].item()) == float(1 << 20)
    registry.release(key)
    assert len(registry) == 0
