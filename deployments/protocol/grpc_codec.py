"""KServe v2 gRPC messages to and from the transport-neutral requests, responses and documents.

Pure functions on the request hot path, the gRPC counterpart of
:mod:`deployments.protocol.codec`. Inputs sent in ``raw_input_contents`` become
numpy views on the received bytes (``np.frombuffer``), never copies; BYTES
elements travel there as 4-byte little-endian lengths followed by their bytes.
Typed ``contents`` are accepted too. Outputs always go back in
``raw_output_contents``, as Triton sends them.

Decoding only parses: what a request must hold for its model (names, data
types, shapes, batch size) is checked once, behind the data plane, at the
model runtime's boundary (``ModelSchema.check_request``), whatever the
transport. The schema serves encoding (labels for classification). The
reserved request parameters (``sequence_id``, ``sequence_start``,
``sequence_end``, ``priority``, ``timeout``) are read by the HTTP codec's rules.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from deployments.inference import InferRequest, InferResponse, RequestedOutput
from deployments.protocol import codec, shared_memory
from deployments.protocol.proto import grpc_service_pb2 as pb
from deployments.protocol.raw_tail import RAW_OUTPUT_FIELD, TAIL_MIN_BYTES, Tailed
from deployments.runtime.checks import ModelSchema
from deployments.settings import RequestLimits
from deployments.tensors import to_numpy
from repository_loader.datatypes import (
    BY_WIRE,
    from_numpy_dtype,
    serialize_bytes_tensor,
    to_numpy_dtype,
)
from repository_loader.errors import InvalidArgument

# datatype -> the InferTensorContents field that carries it in typed form
TYPED_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
_SHARED_MEMORY = "shared_memory_region"
_DEFAULT_LIMITS = RequestLimits()
_WIRE_OF: dict[np.dtype, str] = {}
_Tensor = pb.ModelInferRequest.InferInputTensor
_Output = pb.ModelInferResponse.InferOutputTensor


# --- parameters --------------------------------------------------------------


def parameter_value(param: Any) -> Any:
    """The Python value of an ``InferParameter`` or ``ModelRepositoryParameter`` (None when unset)."""
    choice = param.WhichOneof("parameter_choice")
    return None if choice is None else getattr(param, choice)


def parameters_dict(params: Mapping[str, Any]) -> dict[str, Any]:
    """A parameters map as plain Python values."""
    return {key: parameter_value(value) for key, value in params.items()}


def set_parameter(target: Any, value: Any) -> None:
    """Store ``value`` in the ``InferParameter`` ``target`` (bool, int, float or str)."""
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int):
        if value >= 2**63:
            target.uint64_param = value
        else:
            target.int64_param = value
    elif isinstance(value, float):
        target.double_param = value
    else:
        target.string_param = str(value)


# --- ModelInferRequest -> InferRequest -------------------------------------------


def decode_infer_request(message: Any, limits: RequestLimits = _DEFAULT_LIMITS) -> InferRequest:
    """Decode a ``ModelInferRequest``.

    Raises :class:`InvalidArgument` naming the tensor or field at fault (a data
    type or byte count that does not fit the tensor's shape, a shape over
    ``limits``). An input in shared memory is left as a ``SharedInput`` (read by the front end).
    """
    raw = message.raw_input_contents
    tensors = message.inputs
    shared = 0  # inputs in shared memory: raw contents are given for the others only
    inputs: dict[str, Any] = {}
    miscounted: codec.ElementCountMismatch | None = None
    for tensor in tensors:
        name, datatype, shape = tensor.name, tensor.datatype, list(tensor.shape)
        if name in inputs:
            raise InvalidArgument(f"input '{name}' appears more than once in the request")
        if any(d < 0 for d in shape):
            raise InvalidArgument(f"input '{name}' needs a shape of non-negative integers, got {shape}")
        codec.check_shape(name, shape, limits)
        if datatype not in BY_WIRE:
            raise InvalidArgument(f"input '{name}' has unknown data-type '{datatype}'")
        params = tensor.parameters
        if params and _SHARED_MEMORY in params:
            ref = shared_memory.grpc_ref(name, parameters_dict(params))
            inputs[name] = shared_memory.SharedInput(ref, datatype, shape)
            shared += 1
        elif raw:
            index = len(inputs) - shared
            if index >= len(raw):
                raise _raw_count(len(tensors) - shared, len(raw))
            try:
                inputs[name] = _raw_tensor(name, message.model_name, datatype, shape, raw[index])
            except codec.ElementCountMismatch as e:
                inputs[name], miscounted = None, e
        elif tensor.HasField("contents"):
            inputs[name] = _typed_tensor(name, datatype, shape, tensor.contents)
        else:
            raise InvalidArgument(f"input '{name}' has neither contents nor raw_input_contents")
    if raw and len(raw) != len(tensors) - shared:
        raise _raw_count(len(tensors) - shared, len(raw))
    if miscounted is not None:
        raise miscounted
    request = InferRequest(
        model_name=message.model_name,
        inputs=inputs,
        model_version=message.model_version,
        id=message.id,
    )
    if message.parameters:
        codec._apply_parameters(request, parameters_dict(message.parameters), grpc=True)
    if message.outputs:
        request.requested_outputs = [_requested_output(o) for o in message.outputs]
        shared += sum(o.shared is not None for o in request.requested_outputs)
    request.shared_memory = shared > 0
    return request


def _raw_count(inputs: int, raw: int) -> InvalidArgument:
    return InvalidArgument(
        f"the request has {inputs} inputs outside shared memory but {raw} raw_input_contents; "
        "raw contents must be given for every such input or none"
    )


def _raw_tensor(name: str, model: str, datatype: str, shape: list[int], data: bytes) -> Any:
    if datatype == "BYTES":
        return codec.bytes_tensor(name, model, data, shape)
    count = math.prod(shape)
    dtype = _numpy_dtype(name, datatype)
    expected = count * dtype.itemsize
    if len(data) != expected:
        raise codec.byte_size_mismatch(name, model, expected, len(data))
    return np.frombuffer(data, dtype=dtype, count=count).reshape(shape)


def _typed_tensor(name: str, datatype: str, shape: list[int], contents: Any) -> Any:
    field = TYPED_FIELD.get(datatype)
    if field is None:
        raise InvalidArgument(f"input '{name}' of data-type {datatype} must be sent in raw_input_contents")
    values = getattr(contents, field)
    count = math.prod(shape)
    if len(values) != count:
        raise InvalidArgument(
            f"input '{name}' has {len(values)} elements in {field} but shape {shape} needs {count}"
        )
    if datatype == "BYTES":
        array = np.empty(count, dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    return np.array(values, dtype=_numpy_dtype(name, datatype)).reshape(shape)


def _numpy_dtype(name: str, datatype: str) -> np.dtype:
    try:
        return to_numpy_dtype(datatype)
    except InvalidArgument as e:
        raise InvalidArgument(f"input '{name}': {e.message}") from None


def _requested_output(output: Any) -> RequestedOutput:
    name = output.name
    requested = RequestedOutput(name)
    params = output.parameters
    if params:
        if _SHARED_MEMORY in params:
            requested.shared = shared_memory.grpc_ref(name, parameters_dict(params))
        classes = parameter_value(params["classification"]) if "classification" in params else 0
        if type(classes) is not int or classes < 0:
            raise InvalidArgument(f"classification of output '{name}' must be a non-negative integer")
        requested.class_count = classes
    return requested


# --- InferResponse -> ModelInferResponse -----------------------------------------


def encode_infer_response(
    response: InferResponse,
    requested: list[RequestedOutput] | None,
    schema: ModelSchema | None = None,
    tailed: bool = False,
) -> Any:
    """Encode ``response`` as a ``ModelInferResponse``, every output in ``raw_output_contents``.

    ``requested`` is the request's outputs (None: every output of the
    response, in its order); an output asked for with ``classification``
    becomes Triton's top-k BYTES tensor. ``tailed``: where the outputs' bytes come to
    ``raw_tail.TAIL_MIN_BYTES`` or more, a :class:`raw_tail.Tailed` message that refers to them
    instead of copying them in (for a transport that writes its ``parts()``).
    """
    outputs: list[Any] = []
    raw: list[Any] = []
    tensors = response.outputs
    if requested is None:
        for name, tensor in tensors.items():
            _encode_output(outputs, raw, name, to_numpy(tensor))
    else:
        for ro in requested:
            tensor = tensors.get(ro.name)
            if tensor is None:
                raise InvalidArgument(f"the model did not produce the requested output '{ro.name}'")
            array = to_numpy(tensor)
            if ro.shared is not None:  # written into shared memory: named, with no contents
                _encode_output(outputs, raw, ro.name, array, with_data=False)
                continue
            if ro.class_count:
                labels = schema.labels(ro.name) if schema is not None else None
                batched = schema.batched if schema is not None else False
                array = codec.classify(array, ro.class_count, batched, labels)
            _encode_output(outputs, raw, ro.name, array)
    tail = tailed and sum(r.nbytes if isinstance(r, np.ndarray) else len(r) for r in raw) >= TAIL_MIN_BYTES
    message = pb.ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id,
        outputs=outputs,
        raw_output_contents=() if tail else [r.tobytes() if isinstance(r, np.ndarray) else r for r in raw],
    )
    for key, value in response.parameters.items():
        set_parameter(message.parameters[key], value)
    if tail:
        views = [r.data.cast("B") if isinstance(r, np.ndarray) else r for r in raw]
        return Tailed(message, "raw_output_contents", RAW_OUTPUT_FIELD, views)
    return message


def _encode_output(
    outputs: list[Any], raw: list[Any], name: str, array: np.ndarray, with_data: bool = True
) -> None:
    """The output's header into ``outputs``, its contents into ``raw``: bytes, or the array itself
    (C-ordered), which the caller copies out or refers to."""
    datatype = _WIRE_OF.get(array.dtype)
    if datatype is None:
        datatype = from_numpy_dtype(array.dtype)
        if datatype != "BYTES":
            _WIRE_OF[array.dtype] = datatype
    outputs.append(_Output(name=name, datatype=datatype, shape=array.shape))
    if not with_data:  # an output written into shared memory: an empty entry keeps the others' places
        raw.append(b"")
    elif datatype == "BYTES":
        raw.append(serialize_bytes_tensor(array))
    else:
        raw.append(np.ascontiguousarray(array))


# --- documents -> messages -------------------------------------------------------


def model_metadata_message(document: Mapping[str, Any]) -> Any:
    """``ModelMetadataResponse`` from the KServe v2 metadata document."""
    tensor = pb.ModelMetadataResponse.TensorMetadata
    return pb.ModelMetadataResponse(
        name=document["name"],
        versions=document.get("versions", []),
        platform=document.get("platform", ""),
        inputs=[tensor(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in document["inputs"]],
        outputs=[
            tensor(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in document["outputs"]
        ],
    )


def statistics_message(document: Mapping[str, Any]) -> Any:
    """``ModelStatisticsResponse`` from ``{"model_stats": [...]}`` (field names are the proto's)."""
    from google.protobuf import json_format

    message = pb.ModelStatisticsResponse()
    json_format.ParseDict(_plain(document), message, ignore_unknown_fields=True)
    return message


def repository_index_message(entries: Iterable[Mapping[str, Any]]) -> Any:
    """``RepositoryIndexResponse`` from the data plane's index entries."""
    index = pb.RepositoryIndexResponse.ModelIndex
    return pb.RepositoryIndexResponse(
        models=[
            index(
                name=e["name"],
                version=str(e.get("version", "")),
                state=str(e.get("state", "")),
                reason=str(e.get("reason", "")),
            )
            for e in entries
        ]
    )


def repository_parameters(params: Mapping[str, Any]) -> dict[str, Any]:
    """Load/unload parameters as the data plane takes them: ``file:<path>`` contents base64 text."""
    import base64

    values: dict[str, Any] = {}
    for key, param in params.items():
        value = parameter_value(param)
        if isinstance(value, bytes) and key.startswith("file:"):
            value = base64.b64encode(value).decode("ascii")
        values[key] = value
    return values


def _plain(value: Any) -> Any:
    """Mappings as dicts and tuples as lists, so ``json_format`` accepts them."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
