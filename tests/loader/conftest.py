"""Helpers for the loader tests: tiny repositories, ONNX models and a Python-backend module."""

from __future__ import annotations

import importlib.util
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

# A stand-in for the Python backend's utility module, used only when the project's
# own module cannot be imported, so that user model.py files import.
_PB_UTILS_STUB = """
class Tensor:
    def __init__(self, name, data):
        self.name, self.data = name, data
"""


@pytest.fixture
def pb_utils_importable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import triton_python_backend_utils`` work inside model.py files."""
    if importlib.util.find_spec("triton_python_backend_utils") is None:
        stub_dir = tmp_path / "_pb_utils"
        stub_dir.mkdir()
        (stub_dir / "triton_python_backend_utils.py").write_text(_PB_UTILS_STUB)
        monkeypatch.syspath_prepend(str(stub_dir))


ModelWriter = Callable[..., Path]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    return path


@pytest.fixture
def write_model(repo: Path) -> ModelWriter:
    """write_model(name, config_text or None, files={"1/model.pt": b""}) -> model folder."""

    def write(name: str, config: str | None, files: dict[str, bytes | str] | None = None) -> Path:
        model_dir = repo / name
        model_dir.mkdir(parents=True, exist_ok=True)
        if config is not None:
            (model_dir / "config.pbtxt").write_text(textwrap.dedent(config))
        for rel, content in (files or {}).items():
            path = model_dir / rel
            if rel.endswith("/"):
                path.mkdir(parents=True, exist_ok=True)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, str):
                path.write_text(textwrap.dedent(content))
            else:
                path.write_bytes(content)
        return model_dir

    return write


def onnx_model_bytes(
    inputs: Sequence[tuple[str, int, Sequence[int | str]]],
    outputs: Sequence[tuple[str, int, Sequence[int | str]]],
) -> bytes:
    """An ONNX model whose outputs are Identity copies of its inputs (pairwise)."""
    from onnx import TensorProto, helper  # noqa: F401 - TensorProto used by callers through constants

    graph_inputs = [helper.make_tensor_value_info(n, t, list(s)) for n, t, s in inputs]
    graph_outputs = [helper.make_tensor_value_info(n, t, list(s)) for n, t, s in outputs]
    nodes = [helper.make_node("Identity", [i[0]], [o[0]]) for i, o in zip(inputs, outputs, strict=True)]
    graph = helper.make_graph(nodes, "g", graph_inputs, graph_outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


TORCH_IO = """
    backend: "pytorch"
    max_batch_size: 8
    input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
