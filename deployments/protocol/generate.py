"""Triton's generate extension: a JSON object in, JSON objects out, mapped to and from tensors.

``POST /v2/models/<m>[/versions/<v>]/generate`` answers one JSON object;
``.../generate_stream`` answers one Server-Sent Event (``data: {...}``) per
response of the model (a decoupled model: each response it sends).

Request (Triton's mapping): every top-level field named as one of the model's
inputs becomes that input tensor (a string: BYTES; a number or boolean: the
input's datatype; an array: a tensor of its shape; one scalar has shape
``[1]``, with a batch dimension of 1 in front where the model batches); the
``parameters`` object and every other field become request parameters.
Response: ``model_name``, ``model_version`` and one field per output tensor
(one element: the value, BYTES as text; more: a flat list).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from deployments.inference import InferRequest, InferResponse
from deployments.tensors import to_numpy
from repository_loader.datatypes import to_numpy_dtype
from repository_loader.errors import InvalidArgument
from repository_loader.model import ModelDescription

SSE_CONTENT_TYPE = b"text/event-stream; charset=utf-8"


def decode_generate_request(body: bytes, description: ModelDescription, version: str) -> InferRequest:
    """The inference request a generate body stands for, against the model's inputs."""
    try:
        document = json.loads(body or b"{}")
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidArgument(f"failed to parse the request JSON buffer: {e}") from None
    if not isinstance(document, dict):
        raise InvalidArgument("the generate request must be a JSON object")
    parameters = document.pop("parameters", None) or {}
    if not isinstance(parameters, dict):
        raise InvalidArgument("the generate request field 'parameters' must be a JSON object")
    inputs = {spec.name: spec for spec in description.inputs}
    tensors: dict[str, Any] = {}
    for field, value in document.items():
        spec = inputs.get(field)
        if spec is None:
            _check_parameter(field, value)
            parameters[field] = value
        else:
            tensors[field] = _tensor(field, value, spec.datatype, description.max_batch_size > 0)
    request_id = parameters.pop("id", "") if isinstance(parameters.get("id"), str) else ""
    return InferRequest(
        model_name=description.name,
        model_version=version,
        inputs=tensors,
        id=request_id,
        parameters=parameters,
    )


def _check_parameter(name: str, value: Any) -> None:
    if not isinstance(value, (str, int, float, bool)):
        raise InvalidArgument(
            f"generate request field '{name}' is not an input of the model, and a parameter must be "
            "a string, a number or a boolean"
        )


def _tensor(name: str, value: Any, datatype: str, batched: bool) -> np.ndarray:
    """``value`` as the input's tensor: a scalar has shape [1]; a batching model gets a batch of one."""
    try:
        if datatype == "BYTES":
            array = np.array(_as_bytes(value), dtype=np.object_)
        else:
            array = np.array(value, dtype=to_numpy_dtype(datatype))
    except (TypeError, ValueError, OverflowError):
        raise InvalidArgument(f"generate request field '{name}' cannot be read as {datatype}") from None
    if array.ndim == 0:
        array = array.reshape(1)
    return array[np.newaxis] if batched else array


def _as_bytes(value: Any) -> Any:
    if isinstance(value, list):
        return [_as_bytes(v) for v in value]
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (int, float, bool)):
        return str(value).encode()
    raise TypeError(value)


def generate_document(response: InferResponse) -> dict[str, Any]:
    """The generate response object: model name and version, then one field per output."""
    document: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    for name, tensor in response.outputs.items():
        flat = to_numpy(tensor).reshape(-1)
        values = [_plain(v) for v in flat]
        document[name] = values[0] if len(values) == 1 else values
    return document


def _plain(value: Any) -> Any:
    if isinstance(value, (bytes, np.bytes_)):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, np.generic):
        return value.item()
    return value


def sse_event(document: dict[str, Any]) -> bytes:
    """One Server-Sent Event carrying ``document``."""
    return b"data: " + json.dumps(document, separators=(",", ":")).encode() + b"\n\n"
