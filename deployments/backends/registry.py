"""From a model's ``backend`` / ``platform`` to the class that runs it (ensembles included).

Each backend module is imported only when a model needs it, so a server
without TensorRT (or torch) still serves every other model; a model whose
framework is missing fails to load with an error naming the package.
"""

from __future__ import annotations

import importlib

from deployments.backends.base import Backend, BackendContext
from repository_loader.errors import Unavailable, Unsupported

# backend name -> (module, class, the package that provides the framework)
_BACKENDS: dict[str, tuple[str, str, str]] = {
    "onnxruntime": ("deployments.backends.onnxruntime", "OnnxRuntimeBackend", "onnxruntime"),
    "pytorch": ("deployments.backends.pytorch", "PyTorchBackend", "torch"),
    "tensorrt": ("deployments.backends.tensorrt", "TensorRTBackend", "tensorrt"),
    "python": ("deployments.backends.python", "PythonBackend", "numpy"),
    "ensemble": ("ensembles.backend", "EnsembleBackend", "numpy"),
}

_PLATFORMS: dict[str, str] = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorrt_plan": "tensorrt",
    "ensemble": "ensemble",
}

SUPPORTED: frozenset[str] = frozenset(_BACKENDS) | frozenset(_PLATFORMS)


def backend_name(backend: str, platform: str) -> str:
    """The backend that runs a model configured with ``backend`` and ``platform``."""
    return backend or _PLATFORMS.get(platform, platform)


def backend_class(name: str, model_name: str = "") -> type[Backend]:
    """Import and return the class for backend ``name``.

    Raises :class:`Unsupported` for an unknown backend and :class:`Unavailable`
    when its framework package is not installed.
    """
    name = _PLATFORMS.get(name, name)
    if name not in _BACKENDS:
        known = ", ".join(sorted(SUPPORTED))
        raise Unsupported(
            f"model '{model_name}': backend or platform '{name}' is not supported (known: {known})"
        )
    module_name, class_name, package = _BACKENDS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise Unavailable(
            f"model '{model_name}' needs the '{package}' package for backend '{name}', "
            f"which cannot be imported here: {error}"
        ) from None
    cls: type[Backend] = getattr(module, class_name)
    return cls


def create_backend(context: BackendContext) -> Backend:
    """A backend instance for ``context.model`` (not loaded yet: call ``load()``)."""
    model = context.model
    name = backend_name(model.backend, model.platform)
    return backend_class(name, model.name)(context)
