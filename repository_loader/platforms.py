"""Platforms and backends: which ones this server runs, and how Triton names their files."""

from __future__ import annotations

from repository_loader.model import DEFAULT_MODEL_FILENAME

ENSEMBLE = "ensemble"

# platform -> backend, for the platforms this server runs.
PLATFORM_BACKEND: dict[str, str] = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorrt_plan": "tensorrt",
}

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
