"""From a model's ``backend`` / ``platform`` to the class that runs it.

Each backend module is imported only when a model needs it, so a server
without TensorRT (or torch) still serves every other model; a model whose
framework is missing fails to load with an error naming the package.

The backends of this package are known here; a layer above adds its own with
:func:`register_backend` (the ensemble backend, which runs composing models
through the runtime, registers itself when the ``ensembles`` package is imported).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable

from deployments.backends.base import Backend, BackendContext
from repository_loader.errors import Unavailable, Unsupported
from repository_loader.model import PLATFORM_BACKEND

BackendLoader = Callable[[], type[Backend]]
"""Imports and returns a backend class; an ``ImportError`` means its framework is missing."""


def _from_module(module_name: str, class_name: str) -> BackendLoader:
    def load() -> type[Backend]:
        cls: type[Backend] = getattr(importlib.import_module(module_name), class_name)
        return cls

    return load


# backend name -> (the loader of its class, the package that provides the framework)
_BACKENDS: dict[str, tuple[BackendLoader, str]] = {
    "onnxruntime": (_from_module("deployments.backends.onnxruntime", "OnnxRuntimeBackend"), "onnxruntime"),
    "pytorch": (_from_module("deployments.backends.pytorch", "PyTorchBackend"), "torch"),
    "tensorrt": (_from_module("deployments.backends.tensorrt", "TensorRTBackend"), "tensorrt"),
    "python": (_from_module("deployments.backends.python", "PythonBackend"), "numpy"),
}

# platform -> backend name: this package's platforms, and those a layer above registers
_PLATFORMS: dict[str, str] = dict(PLATFORM_BACKEND)


def register_backend(
    name: str, load: BackendLoader, package: str = "numpy", platforms: Iterable[str] = ()
) -> None:
    """Make backend ``name`` (and the ``platforms`` it runs) available: ``load`` returns its class,
    called when a model first needs it; ``package`` is named when that import fails."""
    _BACKENDS[name] = (load, package)
    for platform in platforms:
        _PLATFORMS[platform] = name


def supported() -> frozenset[str]:
    """The backend and platform names known in this process."""
    return frozenset(_BACKENDS) | frozenset(_PLATFORMS)


def backend_class(name: str, model_name: str = "") -> type[Backend]:
    """Import and return the class for backend ``name``.

    Raises :class:`Unsupported` for an unknown backend and :class:`Unavailable`
    when its framework package is not installed.
    """
    name = _PLATFORMS.get(name, name)
    if name not in _BACKENDS:
        known = ", ".join(sorted(supported()))
        raise Unsupported(
            f"model '{model_name}': backend or platform '{name}' is not supported (known: {known})"
        )
    load, package = _BACKENDS[name]
    try:
        return load()
    except ImportError as error:
        raise Unavailable(
            f"model '{model_name}' needs the '{package}' package for backend '{name}', "
            f"which cannot be imported here: {error}"
        ) from None


def create_backend(context: BackendContext) -> Backend:
    """A backend instance for ``context.model`` (not loaded yet: call ``load()``)."""
    model = context.model
    return backend_class(model.kind, model.name)(context)
