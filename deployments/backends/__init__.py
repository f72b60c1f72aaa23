"""Backends: the execution layer a model replica holds (ONNX Runtime, PyTorch, TensorRT, Python)."""

from deployments.backends.base import Backend, BackendContext
from deployments.backends.registry import create_backend

__all__ = ["Backend", "BackendContext", "create_backend"]
