"""An ensemble of real ONNX Runtime and PyTorch models, run in process by their backends."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from deployments.inference import InferRequest, RequestedOutput
from ensembles.graph import build_graph
from ensembles.scheduler import EnsembleScheduler
from repository_loader.model import ModelDescription
from tests.ensembles.helpers import BackendExecutor, ensemble, model, step

DIMS = (4,)


def _onnx_file(path: Path, op: str, inputs: list[str], constant: float | None = None) -> None:
    values = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", *DIMS]) for n in inputs]
    initializers = []
    names = list(inputs)
    if constant is not None:
        initializers.append(helper.make_tensor("K", TensorProto.FLOAT, [], [constant]))
        names.append("K")
    graph = helper.make_graph(
        [helper.make_node(op, names, ["Y"])],
        op.lower(),
        values,
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["B", *DIMS])],
        initializers,
    )
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx_model.ir_version = 8
    path.parent.mkdir(parents=True)
    onnx.save(onnx_model, str(path))


class _Offset(torch.nn.Module):
    def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:  # noqa: N803 - Triton's tensor naming
        return INPUT__0 + 1.0


def _repository(root: Path) -> dict[str, ModelDescription]:
    """scale (v1: x2, v2: x3), offset (TorchScript: +1), join (A + B)."""
    _onnx_file(root / "scale" / "1" / "model.onnx", "Mul", ["X"], 2.0)
    _onnx_file(root / "scale" / "2" / "model.onnx", "Mul", ["X"], 3.0)
    _onnx_file(root / "join" / "1" / "model.onnx", "Add", ["A", "B"])
    (root / "offset" / "1").mkdir(parents=True)
    torch.jit.script(_Offset()).save(str(root / "offset" / "1" / "model.pt"))
    vec = ("FP32", DIMS)
    common = {"max_batch_size": 8, "platform": "onnxruntime_onnx", "backend": "onnxruntime"}
    models = {
        "scale": model("scale", [("X", *vec)], [("Y", *vec)], versions=(1, 2), **common),
        "join": model("join", [("A", *vec), ("B", *vec)], [("Y", *vec)], **common),
        "offset": model(
            "offset",
            [("INPUT__0", *vec)],
            [("OUTPUT__0", *vec)],
            max_batch_size=8,
            platform="pytorch_libtorch",
            backend="pytorch",
        ),
    }
    return {name: replace(m, path=root / name) for name, m in models.items()}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[EnsembleScheduler, BackendExecutor]:
    models = _repository(tmp_path_factory.mktemp("repository"))
    vec = ("FP32", DIMS)
    diamond = ensemble(
        "pipeline",
        [("INPUT", *vec)],
        [("OUTPUT", *vec), ("SCALED", *vec)],
        [
            step("scale", {"X": "INPUT"}, {"Y": "SCALED"}, version=1),
            step("offset", {"INPUT__0": "SCALED"}, {"OUTPUT__0": "shifted"}),
            step("scale", {"X": "SCALED"}, {"Y": "tripled"}),
            step("join", {"A": "shifted", "B": "tripled"}, {"Y": "OUTPUT"}),
        ],
        max_batch_size=8,
    )
    executor = BackendExecutor(models)
    return EnsembleScheduler(build_graph(diamond, models), executor), executor


async def test_results_equal_running_the_steps_by_hand(setup) -> None:
    scheduler, executor = setup
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    response = await scheduler.infer(InferRequest("pipeline", {"INPUT": x}))
    assert response.error is None
    scaled = x * 2  # scale v1 (pinned)
    expected = (scaled + 1) + scaled * 3  # offset (torch) + scale v2 (latest)
    np.testing.assert_allclose(np.asarray(response.outputs["OUTPUT"]), expected)
    np.testing.assert_allclose(np.asarray(response.outputs["SCALED"]), scaled)
    assert sorted(executor.calls[-4:]) == [("join", 1), ("offset", 1), ("scale", 1), ("scale", 2)]


async def test_partial_request_and_backend_error(setup) -> None:
    scheduler, executor = setup
    before = len(executor.calls)
    x = np.ones((2, 4), dtype=np.float32)
    response = await scheduler.infer(
        InferRequest("pipeline", {"INPUT": x}, requested_outputs=[RequestedOutput("SCALED")])
    )
    np.testing.assert_allclose(np.asarray(response.outputs["SCALED"]), x * 2)
    assert executor.calls[before:] == [("scale", 1)]
    wrong = await scheduler.infer(InferRequest("pipeline", {"INPUT": np.ones((2, 5), dtype=np.float32)}))
    assert wrong.error is not None
    assert wrong.error.message.startswith("in ensemble 'pipeline', step 'scale': ")
