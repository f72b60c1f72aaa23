"""Platforms and backends: which ones this server runs, and how Triton names their files."""

from __future__ import annotations

from pathlib import Path

from repository_loader.model import DEFAULT_MODEL_FILENAME, PLATFORM_BACKEND
from repository_loader.proto import model_config_pb2 as pb

ENSEMBLE = "ensemble"

BACKEND_PLATFORM: dict[str, str] = {backend: platform for platform, backend in PLATFORM_BACKEND.items()}

SUPPORTED_BACKENDS: frozenset[str] = frozenset({"onnxruntime", "pytorch", "tensorrt", "python"})
SUPPORTED_PLATFORMS: frozenset[str] = frozenset({*PLATFORM_BACKEND, ENSEMBLE})

# Known to Triton, but not run by this server.
TRITON_ONLY_PLATFORMS: frozenset[str] = frozenset(
    {"tensorflow_graphdef", "tensorflow_savedmodel", "caffe2_netdef", "openvino"}
)
TRITON_ONLY_BACKENDS: frozenset[str] = frozenset(
    {"tensorflow", "openvino", "fil", "dali", "identity", "repeat", "square", "vllm", "tensorrtllm"}
)

# Default model file name -> backend (Triton's auto-complete of platform/backend).
FILENAME_BACKEND: dict[str, str] = {name: backend for backend, name in DEFAULT_MODEL_FILENAME.items()}

# File extension -> backend, for a ``default_model_filename`` with another name.
EXTENSION_BACKEND: dict[str, str] = {
    ".onnx": "onnxruntime",
    ".pt": "pytorch",
    ".plan": "tensorrt",
    ".py": "python",
}

# Backends whose models can stream several responses per request.
DECOUPLED_BACKENDS: frozenset[str] = frozenset({"python"})

# Default instance count of a KIND_CPU group without ``count`` (Triton: 2 for onnxruntime).
CPU_DEFAULT_COUNT: dict[str, int] = {"onnxruntime": 2}


def backend_for(platform: str, backend: str) -> str:
    """The backend that runs a model, from whichever of the two fields is set."""
    return backend or PLATFORM_BACKEND.get(platform, "")


# Triton's default ``--backend-directory``: where a Python-based backend's ``<name>/model.py`` is looked for
DEFAULT_BACKEND_DIRECTORY = "/opt/tritonserver/backends"
PYTHON_BASED_RUNTIME = "model.py"  # the ``runtime`` Triton fills in for a Python-based backend


def is_python_based(config: pb.ModelConfig) -> bool:
    """Whether ``config`` names a Python-based backend: a backend this server has no code of its own for,
    run by the Python backend from ``<backend directory>/<backend>/<runtime>`` (a ``.py`` runtime, as
    the loader fills it in once it found the file)."""
    return (
        bool(config.backend)
        and config.backend not in SUPPORTED_BACKENDS
        and config.platform != ENSEMBLE
        and config.runtime.endswith(".py")
    )


def python_based_runtime(config: pb.ModelConfig, backend_directory: str | Path | None) -> Path | None:
    """The ``model.py`` of a Python-based backend that ``config`` names, where the backend directory
    holds one (Triton looks for it there only); None for any other model. ``config.runtime`` may name
    another ``.py`` file of that folder; a runtime that is not a Python file names a C++ library."""
    backend = config.backend
    if not backend or backend in SUPPORTED_BACKENDS or config.platform == ENSEMBLE or not backend_directory:
        return None
    runtime = config.runtime or PYTHON_BASED_RUNTIME
    if not runtime.endswith(".py") or "/" in runtime or "\\" in runtime:
        return None
    path = Path(backend_directory) / backend / runtime
    return path if path.is_file() else None


def effective_backend(config: pb.ModelConfig) -> str:
    """The backend of this server that runs ``config``'s model: ``python`` for a Python-based backend."""
    return "python" if is_python_based(config) else backend_for(config.platform, config.backend)


def default_model_filename(backend: str) -> str:
    return DEFAULT_MODEL_FILENAME.get(backend, "")


def backend_from_filename(filename: str) -> str | None:
    """The backend a model file (or folder) name implies, or None."""
    if filename in FILENAME_BACKEND:
        return FILENAME_BACKEND[filename]
    for extension, backend in EXTENSION_BACKEND.items():
        if filename.endswith(extension):
            return backend
    return None
