"""``triton_python_backend_utils``: the module a Triton Python model imports as ``pb_utils``.

It offers the public API of Triton's Python backend (tensors, requests,
responses, response senders, errors, type helpers, logging, custom metrics,
BLS and BLS model control) so that a repository's ``model.py`` runs unchanged.
"""

from deployments.backends.python_api.config import (
    get_input_config_by_name,
    get_output_config_by_name,
    using_decoupled_model_transaction_policy,
)
from deployments.backends.python_api.context import get_model_dir
from deployments.backends.python_api.dtypes import (
    TRITON_STRING_TO_NUMPY,
    deserialize_bytes_tensor,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
)
from deployments.backends.python_api.errors import TritonError, TritonModelException
from deployments.backends.python_api.logger import Logger
from deployments.backends.python_api.metrics import Metric, MetricFamily
from deployments.backends.python_api.model_control import is_model_ready, load_model, unload_model
from deployments.backends.python_api.request import (
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    InferenceRequest,
)
from deployments.backends.python_api.response import InferenceResponse
from deployments.backends.python_api.response_sender import (
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceResponseSender,
)
from deployments.backends.python_api.tensor import (
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_MEMORY_CPU_PINNED,
    TRITONSERVER_MEMORY_GPU,
    PreferredMemory,
    Tensor,
    get_input_tensor_by_name,
    get_output_tensor_by_name,
)

__all__ = [
    "TRITON_STRING_TO_NUMPY",
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_CPU_PINNED",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "Logger",
    "Metric",
    "MetricFamily",
    "ModelConfig",  # noqa: F822 - provided by __getattr__
    "PreferredMemory",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_model_dir",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]


def __getattr__(name: str):  # noqa: ANN202 - module attribute hook
    # ModelConfig (the object auto_complete_config receives) lives with the loader.
    if name == "ModelConfig":
        from repository_loader.python_autocomplete import AutoCompleteModelConfig

        return AutoCompleteModelConfig
    raise AttributeError(name)
