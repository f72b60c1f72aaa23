"""GPU backends: ONNX Runtime CUDA with IOBinding, a TensorRT plan built here, TorchScript on CUDA,
and the device-memory DLPack hand-off. Skipped cleanly where CUDA is absent; no Ray needed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from onnx import TensorProto, helper  # noqa: E402

from deployments import tensors  # noqa: E402
from deployments.backends.registry import create_backend  # noqa: E402
from repository_loader.model import InstanceKind  # noqa: E402
from tests.backends.helpers import (  # noqa: E402
    DEVICE_INPUTS,
    FP32_IO,
    context,
    describe,
    request,
    save_onnx,
    spec,
    version_dir,
)
from tests.backends.helpers import PYTHON_MODELS as MODELS  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _ort_cuda():
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime has no CUDA execution provider (onnxruntime-gpu not installed)")
    return ort


def _add_sub_onnx(root: Path, name: str = "add_sub") -> Path:
    folder = version_dir(root, name)
    save_onnx(
        folder / "model.onnx",
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, 4]) for n in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, 4]) for n in ("OUTPUT0", "OUTPUT1")],
    )
    return folder.parent


def _gpu(model):
    backend = create_backend(context(model, kind=InstanceKind.GPU))
    backend.load()
    return backend


async def test_onnxruntime_cuda_iobinding_keeps_tensors_on_device(tmp_path: Path) -> None:
    _ort_cuda()
    backend = _gpu(describe("add_sub", _add_sub_onnx(tmp_path), "onnxruntime", *FP32_IO, max_batch_size=8))
    a = torch.rand(3, 4, device="cuda")
    b = torch.rand(3, 4, device="cuda")
    host = np.ones((2, 4), np.float32)
    on_device, from_host = await backend.execute(
        [request("add_sub", INPUT0=a, INPUT1=b), request("add_sub", INPUT0=host, INPUT1=host)]
    )
    out0 = on_device.outputs["OUTPUT0"]
    assert isinstance(out0, torch.Tensor) and out0.is_cuda
    torch.testing.assert_close(out0, a + b)
    torch.testing.assert_close(on_device.outputs["OUTPUT1"], a - b)
    np.testing.assert_allclose(tensors.to_numpy(from_host.outputs["OUTPUT0"]), 2 * host)
    print("ORT CUDA IOBinding output", out0.device, tuple(out0.shape))


def _build_plan(onnx_path: Path, plan_path: Path) -> None:
    trt = pytest.importorskip("tensorrt")
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(onnx_path.read_bytes()), [parser.get_error(i) for i in range(parser.num_errors)]
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for name in ("INPUT0", "INPUT1"):
        profile.set_shape(name, (1, 4), (4, 4), (8, 4))
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    assert plan is not None
    plan_path.write_bytes(bytes(plan))


async def test_tensorrt_plan_built_from_onnx_runs_on_device_buffers(tmp_path: Path) -> None:
    root = _add_sub_onnx(tmp_path, "add_sub_trt")
    _build_plan(root / "1" / "model.onnx", root / "1" / "model.plan")
    backend = _gpu(describe("add_sub_trt", root, "tensorrt", *FP32_IO, max_batch_size=8))
    pairs = [(torch.rand(n, 4, device="cuda"), torch.rand(n, 4, device="cuda")) for n in (1, 3, 2)]
    responses = await backend.execute([request("add_sub_trt", INPUT0=a, INPUT1=b) for a, b in pairs])
    for (a, b), response in zip(pairs, responses, strict=True):
        assert response.error is None, response.error
        out0 = response.outputs["OUTPUT0"]
        assert out0.is_cuda and out0.shape == a.shape
        torch.testing.assert_close(out0, a + b)
        torch.testing.assert_close(response.outputs["OUTPUT1"], a - b)
    (too_big,) = await backend.execute(
        [request("add_sub_trt", INPUT0=torch.rand(9, 4), INPUT1=torch.rand(9, 4))]
    )
    assert too_big.error is not None
    print("TensorRT plan outputs", [tuple(r.outputs["OUTPUT0"].shape) for r in responses])


class AddSub(torch.nn.Module):
    def forward(self, INPUT0: torch.Tensor, INPUT1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return INPUT0 + INPUT1, INPUT0 - INPUT1


class Passthrough(torch.nn.Module):
    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return X


async def test_torchscript_on_cuda(tmp_path: Path) -> None:
    folder = version_dir(tmp_path, "add_sub_pt")
    torch.jit.script(AddSub()).save(str(folder / "model.pt"))
    backend = _gpu(describe("add_sub_pt", folder.parent, "pytorch", *FP32_IO, max_batch_size=8))
    a, b = torch.rand(2, 4, device="cuda"), torch.rand(2, 4, device="cuda")
    host = np.ones((1, 4), np.float32)
    on_device, from_host = await backend.execute(
        [request("add_sub_pt", INPUT0=a, INPUT1=b), request("add_sub_pt", INPUT0=host, INPUT1=host)]
    )
    assert on_device.outputs["OUTPUT0"].is_cuda
    torch.testing.assert_close(on_device.outputs["OUTPUT0"], a + b)
    np.testing.assert_allclose(tensors.to_numpy(from_host.outputs["OUTPUT1"]), np.zeros((1, 4)))


class Scaled(torch.nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return X * self.factor


async def test_cc_model_filenames_loads_the_file_for_this_gpu(tmp_path: Path) -> None:
    """``cc_model_filenames``: the GPU instance loads the file named for its compute capability; a
    capability the map does not name falls back to the default file."""
    folder = version_dir(tmp_path, "scaled")
    torch.jit.script(Scaled(2.0)).save(str(folder / "model.pt"))
    torch.jit.script(Scaled(3.0)).save(str(folder / "model_this_gpu.pt"))
    major, minor = torch.cuda.get_device_capability(0)
    io = ([spec("X", "FP32", [2])], [spec("Y", "FP32", [2])])
    for names, factor in (
        ({f"{major}.{minor}": "model_this_gpu.pt"}, 3.0),
        ({"1.0": "model_this_gpu.pt"}, 2.0),
    ):
        model = describe("scaled", folder.parent, "pytorch", *io, max_batch_size=4, cc_model_filenames=names)
        (answer,) = await _gpu(model).execute([request("scaled", X=np.ones((1, 2), np.float32))])
        np.testing.assert_allclose(tensors.to_numpy(answer.outputs["Y"]), np.full((1, 2), factor))


async def test_gpu_dlpack_handoff_keeps_one_device_buffer(tmp_path: Path) -> None:
    _ort_cuda()
    onnx_dir = version_dir(tmp_path, "double")
    save_onnx(
        onnx_dir / "model.onnx",
        [helper.make_node("Add", ["X", "X"], ["Y"])],
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 3])],
    )
    torch_dir = version_dir(tmp_path, "passthrough")
    torch.jit.script(Passthrough()).save(str(torch_dir / "model.pt"))
    io = ([spec("X", "FP32", [3])], [spec("Y", "FP32", [3])])
    ort_backend = _gpu(describe("double", onnx_dir.parent, "onnxruntime", *io, max_batch_size=4))
    torch_backend = _gpu(describe("passthrough", torch_dir.parent, "pytorch", *io, max_batch_size=4))
    python_backend = _gpu(
        describe(
            "dlpack_identity",
            MODELS / "dlpack_identity",
            "python",
            *io,
            max_batch_size=4,
            parameters=DEVICE_INPUTS,
        )
    )
    x = torch.arange(6, dtype=torch.float32, device="cuda").reshape(2, 3)
    (first,) = await ort_backend.execute([request("double", X=x)])
    address = tensors.data_ptr(first.outputs["Y"])
    (second,) = await torch_backend.execute([request("passthrough", X=first.outputs["Y"])])
    (third,) = await python_backend.execute([request("dlpack_identity", X=second.outputs["Y"])])
    assert tensors.device_of(third.outputs["Y"])[0] == "cuda"
    assert tensors.data_ptr(second.outputs["Y"]) == address
    assert tensors.data_ptr(third.outputs["Y"]) == address
    assert not python_backend._instance.seen_is_cpu
    torch.testing.assert_close(tensors.to_torch(third.outputs["Y"]), 2 * x)
    python_backend.unload()
    print("GPU hand-off kept buffer", hex(address))
