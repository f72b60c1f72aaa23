"""Device tensors through the request path, with PyTorch and CuPy only (no ONNX Runtime CUDA, no Ray).

What a GPU instance produces must reach the wire unchanged (HTTP binary and
JSON, gRPC raw contents), requests gathered into one batch must stay on the
device, and the Python backend must hand CUDA tensors on through DLPack
without a host copy. Skipped cleanly where CUDA is absent.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from deployments import tensors  # noqa: E402
from deployments.backends.python_api.tensor import PreferredMemory  # noqa: E402
from deployments.backends.registry import create_backend  # noqa: E402
from deployments.inference import RequestedOutput  # noqa: E402
from deployments.protocol import codec, grpc_codec  # noqa: E402
from repository_loader.model import InstanceKind  # noqa: E402
from tests.backends.helpers import (  # noqa: E402
    DEVICE_INPUTS,
    FP32_IO,
    context,
    describe,
    infer_through_runtime,
    request,
    spec,
    version_dir,
)
from tests.backends.helpers import PYTHON_MODELS as MODELS  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

CUPY_MODEL = """
import cupy
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            array = cupy.from_dlpack(x.to_dlpack())
            self.input_pointer = int(array.data.ptr)
            squared = array * array
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("Y", squared)]))
        return responses
"""


class AddSub(torch.nn.Module):
    def forward(self, INPUT0: torch.Tensor, INPUT1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return INPUT0 + INPUT1, INPUT0 - INPUT1


def _torch_add_sub(root: Path, name: str = "add_sub_pt") -> object:
    folder = version_dir(root, name)
    torch.jit.script(AddSub()).save(str(folder / "model.pt"))
    backend = create_backend(
        context(describe(name, folder.parent, "pytorch", *FP32_IO, max_batch_size=8), kind=InstanceKind.GPU)
    )
    backend.load()
    return backend


async def test_device_outputs_reach_http_and_grpc_unchanged(tmp_path: Path) -> None:
    backend = _torch_add_sub(tmp_path)
    a = torch.arange(8, dtype=torch.float32, device="cuda").reshape(2, 4)
    b = torch.full((2, 4), 0.5, device="cuda")
    (response,) = await infer_through_runtime(backend, [request("add_sub_pt", INPUT0=a, INPUT1=b)])
    assert response.error is None, response.error
    assert tensors.device_of(response.outputs["OUTPUT0"]) == ("cuda", 0)
    expected0 = (a + b).cpu().numpy()
    expected1 = (a - b).cpu().numpy()

    body, header_length = codec.encode_infer_response(response, None, binary_output=True)
    assert header_length is not None
    header = json.loads(body[:header_length])
    assert [o["name"] for o in header["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    assert header["outputs"][0]["shape"] == [2, 4] and header["outputs"][0]["datatype"] == "FP32"
    blob = np.frombuffer(body[header_length:], dtype=np.float32)
    np.testing.assert_array_equal(blob[:8].reshape(2, 4), expected0)
    np.testing.assert_array_equal(blob[8:].reshape(2, 4), expected1)

    json_body, none = codec.encode_infer_response(response, [RequestedOutput("OUTPUT1")])
    assert none is None
    assert json.loads(json_body)["outputs"][0]["data"] == expected1.reshape(-1).tolist()

    message = grpc_codec.encode_infer_response(response, None)
    assert [o.name for o in message.outputs] == ["OUTPUT0", "OUTPUT1"]
    np.testing.assert_array_equal(
        np.frombuffer(message.raw_output_contents[0], np.float32).reshape(2, 4), expected0
    )


async def test_a_batch_of_device_requests_stays_on_the_device(tmp_path: Path) -> None:
    backend = _torch_add_sub(tmp_path, "batched_pt")
    pairs = [(torch.rand(n, 4, device="cuda"), torch.rand(n, 4, device="cuda")) for n in (1, 3, 2)]
    host = (np.ones((2, 4), np.float32), np.full((2, 4), 3, np.float32))
    responses = await backend.execute([request("batched_pt", INPUT0=a, INPUT1=b) for a, b in [*pairs, host]])
    for (a, b), response in zip(pairs, responses[:3], strict=True):
        out0 = response.outputs["OUTPUT0"]
        assert out0.is_cuda and tuple(out0.shape) == tuple(a.shape)
        torch.testing.assert_close(out0, a + b)
        torch.testing.assert_close(response.outputs["OUTPUT1"], a - b)
    np.testing.assert_array_equal(tensors.to_numpy(responses[3].outputs["OUTPUT0"]), np.full((2, 4), 4))
    joined = tensors.concat_rows([a for a, _ in pairs] + [host[0]])
    assert joined.is_cuda and tuple(joined.shape) == (8, 4)


def _dlpack_identity(parameters: dict[str, str]) -> object:
    io = ([spec("X", "FP32", [3])], [spec("Y", "FP32", [3])])
    model = describe(
        "dlpack_identity", MODELS / "dlpack_identity", "python", *io, max_batch_size=4, parameters=parameters
    )
    backend = create_backend(context(model, kind=InstanceKind.GPU))
    backend.load()
    return backend


async def test_python_backend_hands_cuda_tensors_on_without_a_copy() -> None:
    python_backend = _dlpack_identity(DEVICE_INPUTS)
    x = torch.arange(6, dtype=torch.float32, device="cuda").reshape(2, 3)
    (response,) = await python_backend.execute([request("dlpack_identity", X=x)])
    y = response.outputs["Y"]
    assert tensors.device_of(y) == ("cuda", 0)
    assert tensors.data_ptr(y) == x.data_ptr()
    assert not python_backend._instance.seen_is_cpu
    python_backend.unload()


async def test_python_backend_inputs_are_on_the_host_by_default() -> None:
    python_backend = _dlpack_identity({})
    x = torch.arange(6, dtype=torch.float32, device="cuda").reshape(2, 3)
    (response,) = await python_backend.execute([request("dlpack_identity", X=x)])
    assert python_backend._instance.seen_is_cpu
    y = response.outputs["Y"]
    assert tensors.device_of(y) == ("cpu", 0)
    np.testing.assert_array_equal(tensors.to_numpy(y), x.cpu().numpy())
    python_backend.unload()


async def test_python_backend_model_computes_with_cupy_on_the_device(tmp_path: Path) -> None:
    cupy = pytest.importorskip("cupy")
    folder = version_dir(tmp_path, "cupy_square")
    (folder / "model.py").write_text(CUPY_MODEL)
    io = ([spec("X", "FP32", [-1])], [spec("Y", "FP32", [-1])])
    backend = create_backend(
        context(
            describe("cupy_square", folder.parent, "python", *io, max_batch_size=4, parameters=DEVICE_INPUTS),
            kind=InstanceKind.GPU,
        )
    )
    backend.load()
    x = torch.tensor([[1.0, 2.0, 3.0]], device="cuda")
    (response,) = await infer_through_runtime(backend, [request("cupy_square", X=x)])
    assert response.error is None, response.error
    y = response.outputs["Y"]
    assert tensors.device_of(y) == ("cuda", 0)
    assert backend._instance.input_pointer == x.data_ptr()
    np.testing.assert_array_equal(tensors.to_numpy(y), np.array([[1.0, 4.0, 9.0]], np.float32))
    body, _ = codec.encode_infer_response(response, None)
    assert json.loads(body)["outputs"][0]["data"] == [1.0, 4.0, 9.0]
    assert isinstance(cupy.from_dlpack(y), cupy.ndarray)
    backend.unload()


async def test_gpu_python_model_with_torch_module(tmp_path: Path) -> None:
    backend = create_backend(
        context(
            describe("torch_add_sub", MODELS / "torch_add_sub", "python", *FP32_IO, max_batch_size=8),
            kind=InstanceKind.GPU,
        )
    )
    backend.load()
    host = np.arange(8, dtype=np.float32).reshape(2, 4)
    (response,) = await infer_through_runtime(backend, [request("torch_add_sub", INPUT0=host, INPUT1=host)])
    assert response.error is None, response.error
    assert tensors.device_of(response.outputs["OUTPUT0"])[0] == "cuda"
    np.testing.assert_array_equal(tensors.to_numpy(response.outputs["OUTPUT0"]), 2 * host)
    np.testing.assert_array_equal(tensors.to_numpy(response.outputs["OUTPUT1"]), 0 * host)
    backend.unload()


def test_preferred_gpu_memory_moves_host_outputs_once() -> None:
    gpu = PreferredMemory(preferred_memory_type=2, preferred_device_id=0)  # TRITONSERVER_MEMORY_GPU
    host = np.arange(4, dtype=np.float32)
    placed = gpu.place(host)
    assert tensors.device_of(placed) == ("cuda", 0)
    assert gpu.place(placed) is placed
    words = np.array([b"a", b"b"], dtype=np.object_)
    assert gpu.place(words) is words  # BYTES stay on the host
    back = PreferredMemory().place(placed)
    assert isinstance(back, np.ndarray)
    np.testing.assert_array_equal(back, host)


def test_bf16_device_tensor_reaches_the_wire() -> None:
    x = torch.tensor([[1.5, -2.0]], dtype=torch.bfloat16, device="cuda")
    array = tensors.to_numpy(x)
    assert tensors.wire_datatype(array) == "BF16"
    np.testing.assert_array_equal(array.astype(np.float32), np.array([[1.5, -2.0]], np.float32))
