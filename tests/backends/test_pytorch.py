"""PyTorch (TorchScript) backend: outputs equal a direct torch call; Triton's tensor naming."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from deployments.backends.pytorch import argument_order  # noqa: E402
from deployments.backends.registry import create_backend  # noqa: E402
from repository_loader import datatypes  # noqa: E402
from repository_loader.errors import ErrorCode  # noqa: E402
from tests.backends.helpers import context, describe, random_array, request, spec, version_dir  # noqa: E402

TORCH_TYPES = [
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BF16",
]


class Flip(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flip(x, [1])


class AddSub(torch.nn.Module):
    def forward(self, INPUT0: torch.Tensor, INPUT1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return INPUT0 + INPUT1, INPUT0 - INPUT1


class Positional(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a - b, a * 2


class Named(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"DOUBLE": x * 2, "NEG": -x}


class Upper(torch.nn.Module):
    def forward(self, text: list[str]) -> list[str]:
        return [s.upper() for s in text]


def _save(root: Path, name: str, module: torch.nn.Module) -> Path:
    folder = version_dir(root, name)
    torch.jit.script(module).save(str(folder / "model.pt"))
    return folder.parent


def _load(model):
    backend = create_backend(context(model))
    backend.load()
    return backend


def _sample(datatype: str, rows: int, seed: int) -> np.ndarray:
    return random_array(datatypes.to_numpy_dtype(datatype), (rows, 3), seed)


@pytest.mark.parametrize("datatype", TORCH_TYPES)
async def test_every_data_type_matches_direct_torch(tmp_path: Path, datatype: str) -> None:
    path = _save(tmp_path, "flip", Flip())
    model = describe(
        "flip", path, "pytorch", [spec("x", datatype, [3])], [spec("y", datatype, [3])], max_batch_size=8
    )
    backend = _load(model)
    direct = torch.jit.load(str(path / "1" / "model.pt"))
    sent = [_sample(datatype, 2, 1), _sample(datatype, 1, 2)]
    try:
        expected = [
            direct(
                torch.from_numpy(s.view(np.int16)).view(torch.bfloat16)
                if datatype == "BF16"
                else torch.from_numpy(s)
            )
            for s in sent
        ]
    except RuntimeError as error:
        pytest.skip(f"torch cannot flip {datatype} on this build: {error}")
    responses = await backend.execute([request("flip", x=s) for s in sent])
    for want, response in zip(expected, responses, strict=True):
        assert response.error is None, response.error
        got = response.outputs["y"]
        got_t = got if isinstance(got, torch.Tensor) else torch.from_numpy(got)
        assert got_t.dtype == want.dtype
        assert torch.equal(got_t, want)


async def test_forward_argument_names_and_batching(tmp_path: Path) -> None:
    path = _save(tmp_path, "add_sub", AddSub())
    model = describe(
        "add_sub",
        path,
        "pytorch",
        [spec("INPUT1", "FP32", [4]), spec("INPUT0", "FP32", [4])],  # config order differs from forward's
        [spec("OUTPUT0", "FP32", [4]), spec("OUTPUT1", "FP32", [4])],
        max_batch_size=8,
    )
    backend = _load(model)
    pairs = [(random_array(np.float32, (n, 4), n), random_array(np.float32, (n, 4), n + 9)) for n in (1, 3)]
    responses = await backend.execute([request("add_sub", INPUT0=a, INPUT1=b) for a, b in pairs])
    for (a, b), response in zip(pairs, responses, strict=True):
        np.testing.assert_allclose(response.outputs["OUTPUT0"], a + b)
        np.testing.assert_allclose(response.outputs["OUTPUT1"], a - b)


async def test_indexed_names_give_positions(tmp_path: Path) -> None:
    path = _save(tmp_path, "positional", Positional())
    model = describe(
        "positional",
        path,
        "pytorch",
        [spec("INPUT__1", "FP32", [2]), spec("INPUT__0", "FP32", [2])],
        [spec("OUTPUT__1", "FP32", [2]), spec("OUTPUT__0", "FP32", [2])],
    )
    backend = _load(model)
    a, b = np.array([5.0, 7.0], np.float32), np.array([1.0, 2.0], np.float32)
    (response,) = await backend.execute([request("positional", INPUT__0=a, INPUT__1=b)])
    np.testing.assert_allclose(response.outputs["OUTPUT__0"], a - b)
    np.testing.assert_allclose(response.outputs["OUTPUT__1"], a * 2)


async def test_dict_outputs_map_by_key_and_filter(tmp_path: Path) -> None:
    path = _save(tmp_path, "named", Named())
    model = describe(
        "named",
        path,
        "pytorch",
        [spec("x", "INT64", [2])],
        [spec("NEG", "INT64", [2]), spec("DOUBLE", "INT64", [2])],
        max_batch_size=4,
    )
    backend = _load(model)
    x = np.array([[1, 2], [3, 4]], np.int64)
    (response,) = await backend.execute([request("named", ["DOUBLE"], x=x)])
    assert list(response.outputs) == ["DOUBLE"]
    np.testing.assert_array_equal(response.outputs["DOUBLE"], x * 2)


async def test_bytes_as_list_of_str(tmp_path: Path) -> None:
    path = _save(tmp_path, "upper", Upper())
    model = describe(
        "upper", path, "pytorch", [spec("text", "BYTES", [1])], [spec("out", "BYTES", [1])], max_batch_size=4
    )
    backend = _load(model)
    text = np.array([[b"abc"], ["déf".encode()]], dtype=object)
    (response,) = await backend.execute([request("upper", text=text)])
    direct = torch.jit.load(str(path / "1" / "model.pt"))(["abc", "déf"])
    assert response.outputs["out"].shape == (2, 1)
    assert list(response.outputs["out"].reshape(-1)) == [s.encode() for s in direct]


async def test_torch_error_becomes_internal_error(tmp_path: Path) -> None:
    path = _save(tmp_path, "add_sub", AddSub())
    model = describe(
        "add_sub",
        path,
        "pytorch",
        [spec("INPUT0", "FP32", [-1]), spec("INPUT1", "FP32", [-1])],
        [spec("OUTPUT0", "FP32", [-1]), spec("OUTPUT1", "FP32", [-1])],
    )
    backend = _load(model)
    (response,) = await backend.execute(
        [request("add_sub", INPUT0=np.ones(3, np.float32), INPUT1=np.ones(4, np.float32))]
    )
    assert response.error is not None and response.error.code == ErrorCode.INTERNAL
    assert "add_sub" in response.error.message


def test_argument_order_rules() -> None:
    assert argument_order(["b", "a"], ["a", "b"]) == ["a", "b"]
    assert argument_order(["IN__1", "IN__0"], ["x", "y"]) == ["IN__0", "IN__1"]
    assert argument_order(["p", "q"], ["x", "y"]) is None
