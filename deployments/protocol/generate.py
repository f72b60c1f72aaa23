"""Triton's generate extension: a JSON object in, JSON objects out, mapped to and from tensors.

``POST /v2/models/<m>[/versions/<v>]/generate`` answers one JSON object;
``.../generate_stream`` answers one Server-Sent Event (``data: {...}``) per
response of the model (a decoupled model: each response it sends).

Request, mapped as Triton maps it, field by field in the order they come: a
field named as one of the model's inputs becomes that input (a scalar is one
element, an array a list of them); its shape is the input's shape as metadata
reports it (the batch dimension included), each fixed dimension dividing the
element count, the innermost variable-sized one taking what is left and any
other one 1. Every other field is a request parameter (a string, number or
boolean); ``parameters`` is an object mapped the same way; ``id`` is also the
request's ID. Errors use Triton's words.
Response: ``model_name``, ``model_version``, ``id`` (when there is one), the
response's parameters, then one field per output tensor (one element: the
value, BYTES as text; otherwise a flat list).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from deployments.inference import InferRequest, InferResponse
from deployments.protocol.codec import parse_json
from deployments.tensors import to_numpy
from repository_loader.datatypes import to_numpy_dtype
from repository_loader.errors import InvalidArgument
from repository_loader.model import ModelDescription, TensorSpec

SSE_CONTENT_TYPE = b"text/event-stream; charset=utf-8"
PARAMETERS = "parameters"


class _Members(list):
    """A JSON object as its ``(key, value)`` members in document order, repeated keys kept."""

    def first(self, key: str) -> Any:
        """The value of the first member named ``key`` (how Triton looks a member up)."""
        for name, value in self:
            if name == key:
                return value
        return None


_DECODER = json.JSONDecoder(object_pairs_hook=_Members)
_INT64 = (-(2**63), 2**63)
_UINT64 = (0, 2**64)
_FAMILY = {"IN": "INT", "UI": "UINT"}  # by a data type's first two letters; the rest is FP
_NOT = {
    "BOOL": "non-boolean as boolean",
    "INT": "non-signed-integer as signed-integer",
    "UINT": "non-unsigned-integer as unsigned-integer",
    "FP": "non-number as double",
}


def decode_generate_request(body: bytes, description: ModelDescription, version: str) -> InferRequest:
    """The inference request a generate body stands for, against the model's inputs."""
    document = parse_json(body, _DECODER)
    if type(document) is not _Members:
        raise InvalidArgument("attempt to get members for non-object")
    request_id = document.first("id")
    if request_id is not None and type(request_id) is not str:
        raise InvalidArgument("Unable to parse 'id': attempt to access JSON non-string as string")
    mapping = _Mapping(description)
    for key, _ in document:
        if key != PARAMETERS:
            mapping.add(key, document)
            continue
        if key in mapping.specs:
            raise InvalidArgument(f"Keyword '{key}' for nested schema also given as input tensor name")
        nested = document.first(key)
        if type(nested) is not _Members:
            raise InvalidArgument(
                f"Expected JSON object for keyword: '{key}': attempt to access JSON non-object as object"
            )
        try:
            for name, _ in nested:
                mapping.add(name, nested)
        except InvalidArgument as e:
            raise InvalidArgument(f"Converting keyword: '{key}': {e.message}") from None
    return InferRequest(
        model_name=description.name,
        model_version=version,
        inputs=mapping.tensors,
        id=request_id or "",
        parameters=mapping.parameters,
    )


class _Mapping:
    """The tensors and parameters of one generate request, as its fields are mapped."""

    def __init__(self, description: ModelDescription) -> None:
        self.specs = {spec.name: spec for spec in description.inputs}
        self.max_batch_size = description.max_batch_size
        self.tensors: dict[str, Any] = {}
        self.parameters: dict[str, Any] = {}

    def add(self, name: str, members: _Members) -> None:
        value = members.first(name)
        spec = self.specs.get(name)
        if spec is None:
            self.parameters[name] = _parameter(name, value)
            return
        tensor = _tensor(name, value, spec, spec.full_shape(self.max_batch_size))
        if name in self.tensors:
            raise InvalidArgument(f"input '{name}' already exists in request")
        self.tensors[name] = tensor


def _parameter(name: str, value: Any) -> Any:
    kind = type(value)
    if kind is str or kind is bool or kind is float:
        return value
    if kind is int:
        return value if _INT64[0] <= value < _INT64[1] else float(value)
    raise InvalidArgument(
        f"parameter '{name}' has invalid type. It should be either 'int', 'bool', or 'string'."
    )


def _tensor(name: str, value: Any, spec: TensorSpec, dims: Sequence[int]) -> np.ndarray:
    """``value`` (a scalar or a flat list) as the tensor of input ``spec``."""
    items = value if type(value) is list else [value]
    datatype = spec.datatype
    if datatype == "BYTES" and not all(type(item) is str for item in items):
        if all(type(item) is str or type(item) is list for item in items):
            raise _shape_mismatch()
        raise InvalidArgument("Unable to parse JSON bytes array: attempt to access JSON non-string as string")
    shape = _shape(name, len(items), dims)
    if datatype == "BYTES":
        array = np.empty(len(items), dtype=np.object_)
        array[:] = [item.encode("utf-8") for item in items]
        return array.reshape(shape)
    if datatype in ("FP16", "BF16"):
        raise InvalidArgument(
            f"receiving {datatype} data via JSON is not supported. Please use the binary data "
            f"format for input {name}"
        )
    family = _FAMILY.get(datatype[:2], "FP") if datatype != "BOOL" else "BOOL"
    for item in items:
        if not _fits(family, item):
            if type(item) is list:
                raise _shape_mismatch()
            raise InvalidArgument(f"Unable to parse 'data': attempt to access JSON {_NOT[family]}")
    dtype = to_numpy_dtype(datatype)
    if family == "INT":
        array = np.array(items, dtype=np.int64).astype(dtype)
    elif family == "UINT":
        array = np.array(items, dtype=np.uint64).astype(dtype)
    else:
        array = np.array(items, dtype=dtype)
    return array.reshape(shape)


def _fits(family: str, item: Any) -> bool:
    kind = type(item)
    if family == "BOOL":
        return kind is bool
    if family == "FP":
        return kind is float or kind is int
    bounds = _INT64 if family == "INT" else _UINT64
    return kind is int and bounds[0] <= item < bounds[1]


def _shape(name: str, count: int, dims: Sequence[int]) -> list[int]:
    """Triton's shape for ``count`` elements of an input of metadata shape ``dims``."""
    shape = list(dims)
    left = count
    for dim in shape:
        if dim != -1:
            if dim == 0 or left % dim:
                raise _no_shape(name)
            left //= dim
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] == -1:
            shape[i] = left
            left = 1
    if left != 1:
        raise _no_shape(name)
    return shape


def _no_shape(name: str) -> InvalidArgument:
    return InvalidArgument(f"The schema can not convert input '{name}' to tensor with proper shape")


def _shape_mismatch() -> InvalidArgument:
    return InvalidArgument("Unable to parse 'data': Shape does not match true shape of 'data' field")


def generate_document(response: InferResponse) -> dict[str, Any]:
    """The generate response object: model name and version, the ID, parameters, then the outputs;
    a name taken by an earlier field is not written again."""
    document: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        document["id"] = response.id
    for name, value in response.parameters.items():
        if type(value) in (str, bool, int, float):
            document.setdefault(name, value)
    for name, tensor in response.outputs.items():
        flat = to_numpy(tensor).reshape(-1)
        values = [_plain(v) for v in flat]
        document.setdefault(name, values[0] if len(values) == 1 else values)
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
