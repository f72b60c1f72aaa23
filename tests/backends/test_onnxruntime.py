"""ONNX Runtime backend: outputs equal a direct onnxruntime call, batches split by rows, config rules."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

from deployments.backends.onnxruntime import OnnxRuntimeBackend, providers, session_options  # noqa: E402
from deployments.backends.registry import create_backend  # noqa: E402
from repository_loader import datatypes  # noqa: E402
from repository_loader.errors import ErrorCode, InvalidArgument, Unavailable  # noqa: E402
from repository_loader.model import InstanceKind  # noqa: E402
from tests.backends.helpers import (  # noqa: E402
    context,
    describe,
    infer_through_runtime,
    random_array,
    request,
    save_onnx,
    spec,
    version_dir,
)

ONNX_TYPES = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BF16": TensorProto.BFLOAT16,
    "BYTES": TensorProto.STRING,
}


def _identity_model(root: Path, datatype: str) -> Path:
    folder = version_dir(root, f"identity_{datatype.lower()}")
    t = ONNX_TYPES[datatype]
    save_onnx(
        folder / "model.onnx",
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        [helper.make_tensor_value_info("INPUT0", t, [None, 4])],
        [helper.make_tensor_value_info("OUTPUT0", t, [None, 4])],
    )
    return folder.parent


def _add_sub_model(root: Path, t: int = TensorProto.FLOAT) -> Path:
    folder = version_dir(root, "add_sub")
    save_onnx(
        folder / "model.onnx",
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        [helper.make_tensor_value_info(n, t, [None, 4]) for n in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(n, t, [None, 4]) for n in ("OUTPUT0", "OUTPUT1")],
    )
    return folder.parent


def _add_sub_backend(root: Path, datatype: str = "FP32", **kwargs) -> OnnxRuntimeBackend:
    path = _add_sub_model(root, ONNX_TYPES[datatype])
    model = describe(
        "add_sub",
        path,
        "onnxruntime",
        [spec("INPUT0", datatype, [4]), spec("INPUT1", datatype, [4])],
        [spec("OUTPUT0", datatype, [4]), spec("OUTPUT1", datatype, [4])],
        max_batch_size=8,
        **kwargs,
    )
    backend = create_backend(context(model))
    backend.load()
    return backend


def _sample(datatype: str, rows: int, seed: int = 0) -> np.ndarray:
    if datatype == "BYTES":
        values = [f"s{seed}-{i}-é".encode() for i in range(rows * 4)]
        return np.array(values, dtype=object).reshape(rows, 4)
    return random_array(datatypes.to_numpy_dtype(datatype), (rows, 4), seed)


def _direct(path: Path, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, feed)


@pytest.mark.parametrize("datatype", sorted(ONNX_TYPES))
async def test_every_data_type_matches_direct_onnxruntime(tmp_path: Path, datatype: str) -> None:
    path = _identity_model(tmp_path, datatype)
    model = describe(
        "identity",
        path,
        "onnxruntime",
        [spec("INPUT0", datatype, [4])],
        [spec("OUTPUT0", datatype, [4])],
        max_batch_size=8,
    )
    backend = create_backend(context(model))
    backend.load()
    first, second = _sample(datatype, 2, seed=1), _sample(datatype, 3, seed=2)
    responses = await backend.execute([request("identity", INPUT0=first), request("identity", INPUT0=second)])
    for sent, response in zip((first, second), responses, strict=True):
        assert response.error is None
        got = response.outputs["OUTPUT0"]
        assert got.dtype == sent.dtype and got.shape == sent.shape
        if datatype == "BYTES":
            direct = _direct(path, {"INPUT0": np.vectorize(lambda b: b.decode(), otypes=[object])(sent)})[0]
            assert [s.encode() for s in direct.reshape(-1)] == list(got.reshape(-1))
        elif datatype == "BF16":
            assert np.array_equal(got.view(np.uint16), sent.view(np.uint16))
        else:
            np.testing.assert_array_equal(got, _direct(path, {"INPUT0": sent})[0])


@pytest.mark.parametrize("datatype", ["FP32", "FP64", "INT32", "INT64"])
async def test_batch_is_joined_and_split_by_rows(tmp_path: Path, datatype: str) -> None:
    backend = _add_sub_backend(tmp_path, datatype)
    sizes = (1, 3, 2)
    sent = [(_sample(datatype, n, 10 + i), _sample(datatype, n, 20 + i)) for i, n in enumerate(sizes)]
    responses = await backend.execute([request("add_sub", INPUT0=a, INPUT1=b) for a, b in sent])
    for (a, b), response in zip(sent, responses, strict=True):
        expected = _direct(backend.model.path, {"INPUT0": a, "INPUT1": b})
        np.testing.assert_array_equal(response.outputs["OUTPUT0"], expected[0])
        np.testing.assert_array_equal(response.outputs["OUTPUT1"], expected[1])
        assert response.outputs["OUTPUT0"].shape[0] == a.shape[0]


async def test_requested_outputs_are_filtered(tmp_path: Path) -> None:
    backend = _add_sub_backend(tmp_path)
    a, b = _sample("FP32", 2, 1), _sample("FP32", 2, 2)
    only_sub, both = await backend.execute(
        [request("add_sub", ["OUTPUT1"], INPUT0=a, INPUT1=b), request("add_sub", None, INPUT0=a, INPUT1=b)]
    )
    assert list(only_sub.outputs) == ["OUTPUT1"]
    np.testing.assert_allclose(only_sub.outputs["OUTPUT1"], a - b)
    assert set(both.outputs) == {"OUTPUT0", "OUTPUT1"}


async def test_bad_requests_get_errors_and_others_still_run(tmp_path: Path) -> None:
    backend = _add_sub_backend(tmp_path)
    a = _sample("FP32", 2, 1)
    bad = [
        request("add_sub", INPUT0=a),  # missing INPUT1
        request("add_sub", INPUT0=a, INPUT1=a.astype(np.float64)),  # wrong type
        request("add_sub", INPUT0=a, INPUT1=_sample("FP32", 3, 1)),  # batch sizes differ
        request("add_sub", INPUT0=np.zeros((2, 5), np.float32), INPUT1=np.zeros((2, 5), np.float32)),  # dims
        request("add_sub", INPUT0=_sample("FP32", 9), INPUT1=_sample("FP32", 9)),  # > max_batch_size
        request("add_sub", ["NOPE"], INPUT0=a, INPUT1=a),  # unknown output
        request("add_sub", INPUT0=a, INPUT1=a, EXTRA=a),  # unknown input
    ]
    good = request("add_sub", INPUT0=a, INPUT1=a)
    responses = await infer_through_runtime(backend, [*bad, good])
    for response in responses[:-1]:
        assert isinstance(response.error, InvalidArgument), response
        assert "add_sub" in response.error.message
    assert responses[-1].error is None
    np.testing.assert_allclose(responses[-1].outputs["OUTPUT0"], 2 * a)


async def test_reshape_maps_wire_shape_to_model_shape(tmp_path: Path) -> None:
    folder = version_dir(tmp_path, "flat")
    save_onnx(
        folder / "model.onnx",
        [helper.make_node("Identity", ["X"], ["Y"])],
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2, 2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 2, 2])],
    )
    model = describe(
        "flat",
        folder.parent,
        "onnxruntime",
        [spec("X", "FP32", [4], reshape=(2, 2))],
        [spec("Y", "FP32", [4], reshape=(2, 2))],
        max_batch_size=4,
    )
    backend = create_backend(context(model))
    backend.load()
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    (response,) = await backend.execute([request("flat", X=x)])
    np.testing.assert_array_equal(response.outputs["Y"], x)


async def test_runtime_failure_becomes_an_internal_error(tmp_path: Path) -> None:
    folder = version_dir(tmp_path, "reshape_fail")
    shape = helper.make_tensor("shape", TensorProto.INT64, [1], [7])
    save_onnx(
        folder / "model.onnx",
        [
            helper.make_node("Constant", [], ["S"], value=shape),
            helper.make_node("Reshape", ["X", "S"], ["Y"]),
        ],
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None])],
    )
    model = describe(
        "reshape_fail", folder.parent, "onnxruntime", [spec("X", "FP32", [-1])], [spec("Y", "FP32", [-1])]
    )
    backend = create_backend(context(model))
    backend.load()
    (response,) = await backend.execute([request("reshape_fail", X=np.ones(3, np.float32))])
    assert response.error is not None and response.error.code == ErrorCode.INTERNAL
    assert "reshape_fail" in response.error.message
    (ok,) = await backend.execute([request("reshape_fail", X=np.ones(7, np.float32))])
    assert ok.error is None


async def test_torch_inputs_bind_in_place(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    backend = _add_sub_backend(tmp_path)
    a, b = torch.arange(8, dtype=torch.float32).reshape(2, 4), torch.ones(2, 4)
    (response,) = await backend.execute([request("add_sub", INPUT0=a, INPUT1=b)])
    np.testing.assert_allclose(np.asarray(response.outputs["OUTPUT0"]), (a + b).numpy())


def test_session_options_follow_triton_parameters() -> None:
    options = session_options(
        {"intra_op_thread_count": "2", "inter_op_thread_count": "1", "execution_mode": "1"},
        {"graph": {"level": 2}},
    )
    assert options.intra_op_num_threads == 2 and options.inter_op_num_threads == 1
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    default = session_options({}, {})
    assert default.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    with pytest.raises(InvalidArgument, match="intra_op_thread_count"):
        session_options({"intra_op_thread_count": "many"}, {})


def test_default_threads_share_the_cores_between_instances() -> None:
    cores = len(os.sched_getaffinity(0))
    assert session_options({}, {}).intra_op_num_threads == cores
    assert session_options({}, {}, instances=cores).intra_op_num_threads == 1
    assert session_options({}, {}, instances=4 * cores).intra_op_num_threads == 1
    assert session_options({"intra_op_thread_count": "3"}, {}, instances=8).intra_op_num_threads == 3


def test_session_config_parameters_reach_onnxruntime() -> None:
    options = session_options({"session.intra_op.allow_spinning": "0"}, {})
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_providers_from_instance_kind_and_accelerators() -> None:
    assert providers(InstanceKind.CPU, 0, {}, "m") == ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        accel = {
            "execution_accelerators": {
                "gpu_execution_accelerator": [{"name": "cuda", "parameters": {"a": "1"}}]
            }
        }
        chosen = providers(InstanceKind.GPU, 1, accel, "m")
        assert chosen[0] == ("CUDAExecutionProvider", {"device_id": "1", "a": "1"})
    else:
        with pytest.raises(Unavailable, match="onnxruntime-gpu"):
            providers(InstanceKind.GPU, 0, {}, "m")


def test_missing_model_file_is_unavailable(tmp_path: Path) -> None:
    model = describe(
        "absent", tmp_path / "absent", "onnxruntime", [spec("X", "FP32", [1])], [spec("Y", "FP32", [1])]
    )
    with pytest.raises(Unavailable, match="absent"):
        create_backend(context(model)).load()
