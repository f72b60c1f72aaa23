"""Shared paths and helpers for the tests of the example repository."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

ROOT = Path(__file__).resolve().parents[2]
REPOSITORY = ROOT / "examples" / "model_repository"
MODEL_NAMES = sorted(path.name for path in REPOSITORY.iterdir() if (path / "config.pbtxt").is_file())


def triton_config(model: str) -> model_config_pb2.ModelConfig:
    """The model's config.pbtxt parsed with Triton's own ModelConfig message (shipped in tritonclient)."""
    text = (REPOSITORY / model / "config.pbtxt").read_text()
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def triton_config_json(model: str) -> str:
    """The model's configuration as the JSON string Triton hands to a Python model's initialize()."""
    as_dict = json_format.MessageToDict(triton_config(model), preserving_proto_field_name=True)
    return json.dumps(as_dict)


def load_module(path: Path, name: str) -> ModuleType:
    """Imports a Python file by path, without registering it in ``sys.modules``."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def repository() -> Path:
    """The bundled example repository."""
    return REPOSITORY
