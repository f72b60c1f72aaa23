"""An ensemble of GPU instances run in process: tensors stay in one device buffer from step to step.

TorchScript on ``cuda:0`` -> a Python-backend step that returns its input
through DLPack -> TorchScript again. Between the first and the second step no
copy is made (same address); the last step's output is still on the device
and only the wire encoding copies it to the host. Needs CUDA; no Ray.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from deployments import tensors  # noqa: E402
from deployments.inference import InferRequest  # noqa: E402
from deployments.protocol import codec  # noqa: E402
from ensembles.graph import build_graph  # noqa: E402
from ensembles.scheduler import EnsembleScheduler  # noqa: E402
from repository_loader.model import InstanceKind  # noqa: E402
from tests.ensembles.helpers import BackendExecutor, ensemble, model, step  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
PYTHON_MODELS = Path(__file__).parents[1] / "backends" / "python_models"
VEC = ("FP32", (3,))


class _Offset(torch.nn.Module):
    def forward(self, X: torch.Tensor) -> torch.Tensor:  # noqa: N803 - Triton's tensor naming
        return X + 1.0


async def test_gpu_steps_hand_one_device_buffer_on(tmp_path: Path) -> None:
    (tmp_path / "offset" / "1").mkdir(parents=True)
    torch.jit.script(_Offset()).save(str(tmp_path / "offset" / "1" / "model.pt"))
    models = {
        "offset": replace(
            model("offset", [("X", *VEC)], [("Y", *VEC)], max_batch_size=4, backend="pytorch"),
            path=tmp_path / "offset",
        ),
        "dlpack_identity": replace(
            model(
                "dlpack_identity",
                [("X", *VEC)],
                [("Y", *VEC)],
                max_batch_size=4,
                parameters={"FORCE_CPU_ONLY_INPUT_TENSORS": "no"},  # Triton's default: inputs on the host
            ),
            path=PYTHON_MODELS / "dlpack_identity",
        ),
    }
    pipeline = ensemble(
        "gpu_pipeline",
        [("INPUT", *VEC)],
        [("OUTPUT", *VEC)],
        [
            step("offset", {"X": "INPUT"}, {"Y": "first"}),
            step("dlpack_identity", {"X": "first"}, {"Y": "passed"}),
            step("offset", {"X": "passed"}, {"Y": "OUTPUT"}),
        ],
        max_batch_size=4,
    )
    executor = BackendExecutor(models, kind=InstanceKind.GPU)
    try:
        scheduler = EnsembleScheduler(build_graph(pipeline, models), executor)
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        response = await scheduler.infer(InferRequest("gpu_pipeline", {"INPUT": x}))
        assert response.error is None, response.error
        first, passed, last = executor.outputs[-3:]
        assert tensors.device_of(first["Y"]) == ("cuda", 0)
        assert tensors.data_ptr(passed["Y"]) == tensors.data_ptr(first["Y"])  # no copy between steps
        output = response.outputs["OUTPUT"]
        assert tensors.device_of(output) == ("cuda", 0)
        np.testing.assert_array_equal(tensors.to_numpy(output), x + 2)
        body, _ = codec.encode_infer_response(response, None)
        assert json.loads(body)["outputs"][0]["data"] == (x + 2).reshape(-1).tolist()
    finally:
        executor.close()
