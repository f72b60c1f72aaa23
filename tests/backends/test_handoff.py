"""Zero-copy hand-off on the host: ONNX Runtime -> TorchScript -> Python model share one buffer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

from deployments import tensors  # noqa: E402
from deployments.backends.registry import create_backend  # noqa: E402
from tests.backends.helpers import context, describe, request, save_onnx, spec, version_dir  # noqa: E402

MODELS = Path(__file__).parent / "python_models"


class Passthrough(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _chain(root: Path):
    onnx_dir = version_dir(root, "scale")
    save_onnx(
        onnx_dir / "model.onnx",
        [helper.make_node("Add", ["X", "X"], ["Y"])],
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 3])],
    )
    torch_dir = version_dir(root, "passthrough")
    torch.jit.script(Passthrough()).save(str(torch_dir / "model.pt"))
    fp32 = ([spec("X", "FP32", [3])], [spec("Y", "FP32", [3])])
    backends = [
        create_backend(context(describe("scale", onnx_dir.parent, "onnxruntime", *fp32, max_batch_size=4))),
        create_backend(
            context(describe("passthrough", torch_dir.parent, "pytorch", *fp32, max_batch_size=4))
        ),
        create_backend(
            context(
                describe("dlpack_identity", MODELS / "dlpack_identity", "python", *fp32, max_batch_size=4)
            )
        ),
    ]
    for backend in backends:
        backend.load()
    return backends


async def test_onnxruntime_torch_python_share_one_buffer(tmp_path: Path) -> None:
    ort_backend, torch_backend, python_backend = _chain(tmp_path)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (first,) = await ort_backend.execute([request("scale", X=x)])
    produced = first.outputs["Y"]
    address = tensors.data_ptr(produced)
    (second,) = await torch_backend.execute([request("passthrough", X=produced)])
    assert tensors.data_ptr(second.outputs["Y"]) == address
    (third,) = await python_backend.execute([request("dlpack_identity", X=second.outputs["Y"])])
    final = third.outputs["Y"]
    assert tensors.data_ptr(final) == address
    assert python_backend._instance.seen_is_cpu
    np.testing.assert_array_equal(tensors.to_numpy(final), 2 * x)
    python_backend.unload()


async def test_read_only_request_buffers_still_share(tmp_path: Path) -> None:
    """Request bodies arrive as read-only numpy views; DLPack export must not copy them."""
    _, torch_backend, python_backend = _chain(tmp_path)
    body = np.arange(6, dtype=np.float32).tobytes()
    x = np.frombuffer(body, dtype=np.float32).reshape(2, 3)
    assert not x.flags.writeable
    (through_torch,) = await torch_backend.execute([request("passthrough", X=x)])
    (through_python,) = await python_backend.execute([request("dlpack_identity", X=x)])
    assert tensors.data_ptr(through_torch.outputs["Y"]) == x.ctypes.data
    assert tensors.data_ptr(through_python.outputs["Y"]) == x.ctypes.data
    python_backend.unload()
