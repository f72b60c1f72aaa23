"""KServe v2 inference bodies over HTTP, with Triton's binary tensor extension, both directions.

Pure functions on the request hot path. A request body is a JSON header,
optionally followed by raw tensors (the binary extension): the header's length
comes in the ``Inference-Header-Content-Length`` HTTP header, and each binary
input names its byte count in ``parameters.binary_data_size``. Decoded tensors
are numpy views on the body (``np.frombuffer``), never copies; BYTES tensors are
``object`` arrays of ``bytes``.

A raw binary request (``Inference-Header-Content-Length: 0``) has no JSON at
all: the body is the data of the model's one input (:func:`decode_raw_request`).

A response body is JSON, with the outputs asked for in binary form appended
after it (each with ``parameters.binary_data_size``), in the order of the
header's ``outputs`` list.

The other direction (:func:`encode_infer_request`, :func:`decode_infer_response`)
is the server calling one of its own model replicas over HTTP
(``deployments.serve.peers.ReplicaCalls``): every tensor binary, both ways.

Decoding only parses: a well-formed body, JSON and binary tensors whose sizes
match their data types and shapes, within the server's :class:`RequestLimits`
(shape rank, elements per tensor). JSON tensor data must match its data type
exactly, as Triton reads it: numbers for the floating-point types (integers
included; ``NaN``/``Infinity`` as Triton's bare tokens or as the strings
``"NaN"``, ``"Infinity"``, ``"-Infinity"``), integers within range for the
integer types, ``true``/``false`` only for BOOL, strings only for BYTES; never
``null``. Responses stay strict JSON: a non-finite floating-point value is
written as one of those three strings (``tritonclient``'s ``as_numpy`` reads
them back), where Triton writes bare ``NaN``/``Infinity`` tokens that strict
JSON parsers refuse. Whether a request fits its model (names,
data types, shapes, batch sizes, outputs) is checked once, at the model
runtime's boundary (:mod:`deployments.runtime.checks`), whatever the request's
origin. Encoding reads the model's schema for the classification extension's
labels.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from deployments.inference import InferRequest, InferResponse, RequestedOutput
from deployments.protocol import shared_memory
from deployments.runtime.checks import ModelSchema
from deployments.settings import RequestLimits
from deployments.tensors import to_numpy, wire_datatype
from repository_loader.datatypes import (
    BY_WIRE,
    deserialize_bytes_tensor,
    serialize_bytes_tensor,
    to_numpy_dtype,
)
from repository_loader.errors import (
    InternalError,
    InvalidArgument,
    TooLarge,
    error_for_http_status,
)
from repository_loader.model import ModelDescription

HEADER_LENGTH = "Inference-Header-Content-Length"


def _numpy_types() -> dict[str, np.dtype]:
    types: dict[str, np.dtype] = {}
    for wire in BY_WIRE:
        with contextlib.suppress(InvalidArgument):  # BF16 without ml_dtypes
            types[wire] = to_numpy_dtype(wire)
    return types


_DTYPES = _numpy_types()
_DECODER = json.JSONDecoder()
_ITEMSIZE = {w: BY_WIRE[w].size for w in BY_WIRE}
_RESERVED = frozenset(("sequence_id", "sequence_start", "sequence_end", "priority", "timeout"))
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_LENIENT_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_JSON_NATIVE = frozenset("biuf")  # numpy kinds whose tolist() JSON encodes as is
_DEFAULT_LIMITS = RequestLimits()
_NUMBERS = frozenset((int, float))
_FLOATS = frozenset(("FP16", "FP32", "FP64", "BF16"))
# Python types each data type takes in JSON data (after the nested lists are flattened).
_JSON_TYPES: dict[str, frozenset[type]] = {
    **{
        w: frozenset((int,))
        for w in ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64")
    },
    **dict.fromkeys(_FLOATS, _NUMBERS),
    "BOOL": frozenset((bool,)),
}
_TAKES = {"BOOL": "true or false", **dict.fromkeys(_FLOATS, "numbers")}
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_NON_FINITE_TEXT = {math.inf: "Infinity", -math.inf: "-Infinity"}
_MAX_LENGTH_DIGITS = 20


# --- request ---------------------------------------------------------------


def parse_header_length(value: bytes | str | None, body_size: int) -> int | None:
    """The ``Inference-Header-Content-Length`` value, checked against the body; None when absent."""
    if value is None:
        return None
    if not (value.isascii() and value.isdigit() and len(value) <= _MAX_LENGTH_DIGITS):
        raise InvalidArgument(
            f"Unable to parse {HEADER_LENGTH}, got: {_text(value)[:40]} (it must be an integer)"
        )
    length = int(value)
    if length > body_size:
        raise InvalidArgument(
            f"inference header size should be in range (0, {body_size}), got: {_text(value)}"
        )
    return length


def decode_raw_request(
    body: bytes,
    model: ModelDescription,
    model_version: str = "",
    limits: RequestLimits = _DEFAULT_LIMITS,
) -> InferRequest:
    """A raw binary request (``Inference-Header-Content-Length: 0``): the whole body is the data of
    the model's one input, its data type and shape taken from the configuration (a batch of one
    where the model batches; the one variable-sized dimension, if any, from the byte count).

    Every output is answered in binary form. Raises :class:`InvalidArgument`, in Triton's words,
    for a model whose input cannot be deduced (not exactly one input, more than one
    variable-sized dimension, a BYTES input of more than one element) or a body that does not fit.
    """
    if len(model.inputs) != 1:
        raise InvalidArgument(
            f"Raw request must only have 1 input (found 1) to be deduced but got {len(model.inputs)} "
            f"inputs in '{model.name}' model configuration"
        )
    spec = model.inputs[0]
    name = spec.name
    shape = [1] if model.max_batch_size > 0 else []
    variable = -1
    fixed = 1
    for dim in spec.dims:
        if dim == -1:
            if variable != -1:
                raise InvalidArgument(
                    f"The shape of the raw input '{name}' can not be deduced because there are more "
                    "than one variable-sized dimension"
                )
            variable = len(shape)
        else:
            fixed *= dim
        shape.append(dim)
    size = len(body)
    if spec.datatype == "BYTES":
        if variable != -1 or fixed != 1:
            raise InvalidArgument(
                f"For BYTE datatype raw input '{name}', the model must have input shape [1]"
            )
        array = np.empty(1, dtype=object)
        array[0] = body if type(body) is bytes else bytes(body)
        tensor: Any = array.reshape(shape)
    else:
        dtype = _dtype(name, spec.datatype)
        itemsize = _ITEMSIZE[spec.datatype]
        if size % itemsize:
            raise InvalidArgument(
                f"The input '{name}' has a byte size of {size} which is not a multiple of the data "
                f"type size of {itemsize}"
            )
        if variable != -1:
            shape[variable] = size // itemsize // fixed if fixed else 0
        expected = _count(shape) * itemsize
        if size != expected:
            raise byte_size_mismatch(name, model.name, expected, size)
        check_shape(name, shape, limits)
        tensor = np.frombuffer(body, dtype=dtype, count=size // itemsize).reshape(shape)
    return InferRequest(model_name=model.name, inputs={name: tensor}, model_version=model_version)


def decode_infer_request(
    body: bytes,
    header_length: int | None,
    model_name: str,
    model_version: str = "",
    limits: RequestLimits = _DEFAULT_LIMITS,
) -> tuple[InferRequest, bool]:
    """Decode an infer request body.

    Returns the request and the request-level ``binary_data_output`` flag (the
    default form of outputs the request does not list). Tensors take the data
    types the request declares. Raises :class:`InvalidArgument` naming the
    tensor or field at fault (:class:`TooLarge` for a tensor over ``limits``).
    """
    split = len(body) if header_length is None else header_length
    doc = parse_json(body if header_length is None else body[:split])
    if type(doc) is not dict:
        raise InvalidArgument("the inference request JSON must be an object")
    shared: list[bool] = []
    inputs = _decode_inputs(
        _list(doc, "inputs", required=True), body, split, header_length, limits, model_name, shared
    )
    request = InferRequest(model_name=model_name, inputs=inputs, model_version=model_version)
    request_id = doc.get("id")
    if request_id is not None:
        if type(request_id) is not str:
            raise InvalidArgument("the request 'id' must be a string")
        request.id = request_id
    binary_output = _apply_parameters(request, doc.get("parameters"))
    outputs = doc.get("outputs")
    if outputs is not None:
        request.requested_outputs = _decode_outputs(_list(doc, "outputs"), shared)
    request.shared_memory = bool(shared)
    return request, binary_output


def parse_json(data: bytes, decoder: json.JSONDecoder = _DECODER) -> Any:
    """``data`` as JSON; :class:`InvalidArgument` worded as Triton words its parse errors."""
    try:
        return decoder.decode(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise InvalidArgument(f"{_PARSE_FAILED}Invalid encoding in string. at {e.start}") from None
    except json.JSONDecodeError as e:
        raise InvalidArgument(_PARSE_FAILED + _parse_error_text(e)) from None
    except ValueError as e:
        raise InvalidArgument(f"{_PARSE_FAILED}{e}") from None
    except RecursionError:
        raise InvalidArgument(f"{_PARSE_FAILED}nested too deeply") from None


_PARSE_FAILED = "failed to parse the request JSON buffer: "
# Python's JSON error messages (their start) as the parser Triton uses names them.
_PARSE_ERRORS = (
    ("Extra data", "The document root must not be followed by other values."),
    ("Expecting property name", "Missing a name for object member."),
    ("Expecting ':' delimiter", "Missing a colon after a name of object member."),
    ("Unterminated string", "Missing a closing quotation mark in string."),
    ("Invalid \\uXXXX escape", "Incorrect hex digit after \\u escape in string."),
    ("Invalid \\escape", "Invalid escape character in string."),
)


def _parse_error_text(error: json.JSONDecodeError) -> str:
    """The message and byte offset of a JSON parse error, in Triton's words where they differ."""
    doc, pos = error.doc, error.pos
    offset = len(doc[:pos].encode("utf-8", "surrogatepass"))
    message = error.msg
    if message == "Expecting value":
        text = "The document is empty." if not doc.strip() else "Invalid value."
    elif message == "Expecting ',' delimiter":
        text = (
            "Missing a comma or ']' after an array element."
            if _innermost_open(doc, pos) == "["
            else "Missing a comma or '}' after an object member."
        )
    else:
        text = next((ours for start, ours in _PARSE_ERRORS if message.startswith(start)), message)
    return f"{text} at {offset}"


def _innermost_open(doc: str, pos: int) -> str:
    """The bracket (``[`` or ``{``) of the innermost container still open at ``pos``."""
    stack: list[str] = []
    in_string = escaped = False
    for char in doc[:pos]:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            stack.append(char)
        elif char in "]}" and stack:
            stack.pop()
    return stack[-1] if stack else ""


def _list(doc: dict, key: str, required: bool = False) -> list:
    value = doc.get(key)
    if type(value) is list:
        return value
    if value is None and not required:
        return []
    raise InvalidArgument(f"the request field '{key}' must be a list")


def _decode_inputs(
    items: list,
    body: bytes,
    offset: int,
    header_length: int | None,
    limits: RequestLimits,
    model_name: str,
    shared: list[bool],
) -> dict[str, Any]:
    """The inputs by name; an input in shared memory is left as a ``SharedInput`` (``shared`` then
    holds an entry)."""
    inputs: dict[str, Any] = {}
    miscounted: ElementCountMismatch | None = None
    for item in items:
        name, datatype, shape = _tensor_header(item, limits)
        if name in inputs:
            raise InvalidArgument(f"input '{name}' appears more than once in the request")
        if datatype not in BY_WIRE:
            raise InvalidArgument(
                f"inference input '{name}' data-type is '{datatype}', not a Triton data-type"
            )
        params = item.get("parameters")
        if params and type(params) is dict and shared_memory.REGION in params:
            ref = shared_memory.json_input_ref(name, item, params)
            inputs[name] = shared_memory.SharedInput(ref, datatype, shape)
            shared.append(True)
            continue
        size = _binary_size(name, params)
        if size is None:
            if "data" not in item:
                raise _no_data(name, params)
            inputs[name] = _json_tensor(name, datatype, shape, item["data"])
            continue
        if header_length is None:
            raise InvalidArgument(
                f"input '{name}' has binary_data_size but the request has no {HEADER_LENGTH} header"
            )
        if offset + size > len(body):
            raise InvalidArgument(
                f"input '{name}' needs {size} bytes of binary data but only {len(body) - offset} "
                f"remain after the {HEADER_LENGTH} of {header_length}"
            )
        try:
            inputs[name] = _binary_tensor(name, model_name, datatype, shape, body, offset, size)
        except ElementCountMismatch as e:
            inputs[name], miscounted = None, e
        offset += size
    if miscounted is not None:
        raise miscounted
    if header_length is not None and offset != len(body):
        raise InvalidArgument(
            f"the request body holds {len(body) - offset} bytes beyond the JSON header of "
            f"{header_length} bytes ({HEADER_LENGTH}) and the inputs' binary_data_size"
        )
    return inputs


def _tensor_header(item: Any, limits: RequestLimits) -> tuple[str, str, list[int]]:
    if type(item) is not dict:
        raise InvalidArgument("each entry of 'inputs' must be an object")
    name = item.get("name")
    if type(name) is not str:
        raise InvalidArgument("an input has no 'name' string")
    datatype = item.get("datatype")
    if type(datatype) is not str:
        raise InvalidArgument(f"input '{name}' has no 'datatype' string")
    shape = item.get("shape")
    if type(shape) is not list or not all(type(d) is int and d >= 0 for d in shape):
        raise InvalidArgument(f"input '{name}' needs a 'shape' list of non-negative integers")
    check_shape(name, shape, limits)
    return name, datatype, shape


def check_shape(name: str, shape: Sequence[int], limits: RequestLimits = _DEFAULT_LIMITS) -> None:
    """Refuse an input shape over ``limits``: its rank (400) or its element count (413)."""
    if len(shape) > limits.max_shape_rank:
        raise InvalidArgument(
            f"input '{name}' has {len(shape)} dimensions, more than the limit of {limits.max_shape_rank}"
        )
    if math.prod(shape) > limits.max_tensor_elements:
        raise TooLarge(
            f"input '{name}' of shape {list(shape)} has more than the limit of {limits.max_tensor_elements} elements"
        )


def _binary_size(name: str, params: Any) -> int | None:
    if not params:
        return None
    if type(params) is not dict:
        raise InvalidArgument(f"the parameters of input '{name}' must be an object")
    size = params.get("binary_data_size")
    if size is None:
        return None
    if type(size) is not int or size < 0:
        raise InvalidArgument(f"binary_data_size of input '{name}' must be a non-negative integer")
    return size


def _no_data(name: str, params: Any) -> Exception:
    return InvalidArgument(f"input '{name}' has neither 'data' nor binary_data_size")


def _count(shape: Sequence[int]) -> int:
    return math.prod(shape)


def byte_size_mismatch(name: str, model: str, expected: int, got: int) -> InvalidArgument:
    """An input whose data is not the size its shape and data type make, in Triton's words."""
    return InvalidArgument(
        f"input byte size mismatch for input '{name}' for model '{model}'. Expected {expected}, got {got}"
    )


class ElementCountMismatch(InvalidArgument):
    """A BYTES input with more or fewer elements than its shape. Where several inputs are wrong, the
    request's decoders go on and report the last one, as Triton's validation does."""


def bytes_tensor(name: str, model: str, data: bytes | memoryview, shape: list[int]) -> Any:
    """A BYTES input of ``shape`` from its length-prefixed ``data``; a different element count is refused
    in Triton's words (an extra element is named as the one past those expected)."""
    expected = _count(shape)
    try:
        flat = deserialize_bytes_tensor(data)
    except InvalidArgument as e:
        raise InvalidArgument(f"input '{name}': {e.message}") from None
    if len(flat) > expected:
        raise ElementCountMismatch(
            f"unexpected number of string elements {expected + 1} for inference input '{name}' for "
            f"model '{model}', expecting {expected}"
        )
    if len(flat) < expected:
        raise ElementCountMismatch(
            f"expected {expected} string elements for inference input '{name}' for model '{model}', "
            f"got {len(flat)}"
        )
    return flat.reshape(shape)


def _binary_tensor(
    name: str, model: str, datatype: str, shape: list[int], body: bytes | memoryview, offset: int, size: int
) -> Any:
    if datatype == "BYTES":
        return bytes_tensor(name, model, memoryview(body)[offset : offset + size], shape)
    count = _count(shape)
    dtype = _dtype(name, datatype)
    expected = count * _ITEMSIZE[datatype]
    if size != expected:
        raise byte_size_mismatch(name, model, expected, size)
    return np.frombuffer(body, dtype=dtype, count=count, offset=offset).reshape(shape)


def _json_tensor(name: str, datatype: str, shape: list[int], data: Any) -> Any:
    count = _count(shape)
    if datatype == "BYTES":
        return _json_bytes(name, shape, count, data)
    dtype = _dtype(name, datatype)
    flat = data if type(data) is list else [data]
    kinds = set(map(type, flat))
    if list in kinds:
        flat = []
        _flatten(data, flat)
        kinds = set(map(type, flat))
    allowed = _JSON_TYPES.get(datatype, _NUMBERS)
    if not kinds <= allowed:
        flat = _strict_values(name, datatype, flat, allowed)
    if len(flat) != count:
        raise InvalidArgument(
            f"input '{name}' has {len(flat)} elements of data but shape {shape} needs {count}"
        )
    try:
        array = np.array(flat, dtype=dtype)
    except OverflowError:
        raise InvalidArgument(f"input '{name}' has data out of the range of {datatype}") from None
    except (ValueError, TypeError) as e:
        raise InvalidArgument(f"input '{name}' has data that is not {datatype}: {e}") from None
    return array.reshape(shape)


def _flatten(items: list, out: list) -> None:
    for item in items:
        if type(item) is list:
            _flatten(item, out)
        else:
            out.append(item)


def _strict_values(name: str, datatype: str, flat: list, allowed: frozenset[type]) -> list:
    """``flat`` with Triton's non-finite strings read for the floating-point types; anything else that
    is not of the data type's JSON kind raises."""
    floats = datatype in _FLOATS
    values = []
    for item in flat:
        if type(item) in allowed:
            values.append(item)
        elif floats and type(item) is str and item in _NON_FINITE:
            values.append(_NON_FINITE[item])
        else:
            takes = _TAKES.get(datatype, "integers")
            raise InvalidArgument(
                f"input '{name}' of data-type {datatype} takes {takes}, got {_json_text(item)}"
            )
    return values


def _json_text(item: Any) -> str:
    text = (
        _LENIENT_ENCODER.encode(item) if item is None or type(item) in (bool, int, float, str) else repr(item)
    )
    return text if len(text) <= 40 else text[:37] + "..."


def _json_bytes(name: str, shape: list[int], count: int, data: Any) -> np.ndarray:
    flat: list[bytes] = []
    _flatten_strings(name, data if type(data) is list else [data], flat)
    if len(flat) != count:
        raise InvalidArgument(
            f"input '{name}' has {len(flat)} elements of data but shape {shape} needs {count}"
        )
    array = np.empty(count, dtype=object)
    array[:] = flat
    return array.reshape(shape)


def _flatten_strings(name: str, items: list, out: list[bytes]) -> None:
    for item in items:
        if type(item) is str:
            out.append(item.encode("utf-8"))
        elif type(item) is list:
            _flatten_strings(name, item, out)
        else:
            raise InvalidArgument(f"input '{name}' of data-type BYTES takes strings, got {item!r}")


def _dtype(name: str, datatype: str) -> np.dtype:
    dtype = _DTYPES.get(datatype)
    if dtype is None:
        raise InvalidArgument(f"input '{name}' has unsupported data-type '{datatype}'")
    return dtype


# the one parameter starting with "triton_" a client may send (gRPC streams of decoupled models)
ALLOWED_TRITON_PARAMETERS = frozenset({"triton_enable_empty_final_response"})


def check_reserved_parameters(params: Mapping[str, Any], grpc: bool = False) -> None:
    """Refuse a request parameter starting with ``triton_`` (Triton's own), in Triton's words per protocol."""
    for key in params:
        if key.startswith("triton_") and key not in ALLOWED_TRITON_PARAMETERS:
            if grpc:
                raise InvalidArgument(
                    "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following "
                    f"keys starting with 'triton_' are allowed: {' '.join(sorted(ALLOWED_TRITON_PARAMETERS))}"
                )
            raise InvalidArgument(
                "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
            )


def _apply_parameters(request: InferRequest, params: Any, grpc: bool = False) -> bool:
    """Move Triton's request parameters onto ``request``; return ``binary_data_output``."""
    if not params:
        return False
    if type(params) is not dict:
        raise InvalidArgument("the request 'parameters' must be an object")
    check_reserved_parameters(params, grpc)
    binary_output = params.get("binary_data_output", False)
    if type(binary_output) is not bool:
        raise InvalidArgument("the request parameter 'binary_data_output' must be a boolean")
    if _RESERVED.isdisjoint(params):
        request.parameters = {k: v for k, v in params.items() if k != "binary_data_output"}
        return binary_output
    sequence_id = params.get("sequence_id", 0)
    if type(sequence_id) is not str and (type(sequence_id) is not int or sequence_id < 0):
        raise InvalidArgument(
            "the request parameter 'sequence_id' must be a non-negative integer or a string"
        )
    request.correlation_id = sequence_id
    request.sequence_start = _flag(params, "sequence_start")
    request.sequence_end = _flag(params, "sequence_end")
    request.priority = _natural(params, "priority")
    request.timeout_us = _natural(params, "timeout")
    request.parameters = {k: v for k, v in params.items() if k not in _RESERVED and k != "binary_data_output"}
    return binary_output


def _flag(params: dict, key: str) -> bool:
    value = params.get(key, False)
    if type(value) is not bool:
        raise InvalidArgument(f"the request parameter '{key}' must be a boolean")
    return value


def _natural(params: dict, key: str) -> int:
    value = params.get(key, 0)
    if type(value) is not int or value < 0:
        raise InvalidArgument(f"the request parameter '{key}' must be a non-negative integer")
    return value


def _decode_outputs(items: list, shared: list[bool]) -> list[RequestedOutput]:
    outputs: list[RequestedOutput] = []
    for item in items:
        if type(item) is not dict or type(item.get("name")) is not str:
            raise InvalidArgument("each entry of 'outputs' must be an object with a 'name' string")
        name = item["name"]
        requested = RequestedOutput(name)
        params = item.get("parameters")
        if params:
            if type(params) is not dict:
                raise InvalidArgument(f"the parameters of output '{name}' must be an object")
            binary = params.get("binary_data")
            if binary is not None and type(binary) is not bool:
                raise InvalidArgument(f"binary_data of output '{name}' must be a boolean")
            requested.binary = binary
            classes = params.get("classification", 0)
            if type(classes) is not int or classes < 0:
                raise InvalidArgument(f"classification of output '{name}' must be a non-negative integer")
            requested.class_count = classes
            if shared_memory.REGION in params:
                requested.shared = shared_memory.json_output_ref(params)
                shared.append(True)
        outputs.append(requested)
    return outputs


# --- response --------------------------------------------------------------


def encode_infer_response(
    response: InferResponse,
    requested: list[RequestedOutput] | None,
    binary_output: bool = False,
    schema: ModelSchema | None = None,
) -> tuple[bytes, int | None]:
    """Encode ``response`` as an HTTP body.

    ``requested`` is the request's ``outputs`` list (None: every output of the
    response, in its order); ``binary_output`` the default form of outputs the
    request does not mark with ``binary_data``. Returns the body and the JSON
    header's length when binary outputs follow it (the value of the
    ``Inference-Header-Content-Length`` response header), else None.
    """
    outputs: list[dict[str, Any]] = []
    blobs: list[Any] = []
    tensors = response.outputs
    if requested is None:
        for name, tensor in tensors.items():
            _encode_output(outputs, blobs, name, tensor, binary_output)
    else:
        for ro in requested:
            tensor = tensors.get(ro.name)
            if tensor is None:
                raise InvalidArgument(f"the model did not produce the requested output '{ro.name}'")
            if ro.shared is not None:  # written into shared memory: named, not sent
                outputs.append(tensor_header(ro.name, to_numpy(tensor)))
                continue
            if ro.class_count:
                labels = schema.labels(ro.name) if schema is not None else None
                batched = schema.batched if schema is not None else False
                tensor = classify(to_numpy(tensor), ro.class_count, batched, labels)
            binary = binary_output if ro.binary is None else ro.binary
            _encode_output(outputs, blobs, ro.name, tensor, binary)
    doc: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        doc["id"] = response.id
    if response.parameters:
        doc["parameters"] = response.parameters
    doc["outputs"] = outputs
    try:
        text = _ENCODER.encode(doc)  # strict: refuses NaN and Infinity, at no cost when there are none
    except ValueError:
        text = _encode_non_finite(doc)
    header = text.encode("utf-8")
    if not blobs:
        return header, None
    blobs.insert(0, header)
    return b"".join(blobs), len(header)


def tensor_header(name: str, array: np.ndarray) -> dict[str, Any]:
    """An output's entry without its data: name, data type and shape."""
    return {"name": name, "datatype": wire_datatype(array), "shape": list(array.shape)}


def tensor_bytes(array: np.ndarray, datatype: str | None = None) -> Any:
    """A tensor's bytes as the binary extension (and shared memory) hold them: BYTES elements each
    after its 4-byte length, any other data type its elements in order (no copy where contiguous)."""
    if (datatype or wire_datatype(array)) == "BYTES":
        return serialize_bytes_tensor(array)
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def _encode_output(outputs: list, blobs: list, name: str, tensor: Any, binary: bool) -> None:
    array = to_numpy(tensor)
    entry = tensor_header(name, array)
    datatype = entry["datatype"]
    if binary:
        blob = tensor_bytes(array, datatype)
        entry["parameters"] = {"binary_data_size": len(blob)}
        blobs.append(blob)
    else:
        entry["data"] = _json_data(name, array, datatype)
    outputs.append(entry)


def _json_data(name: str, array: np.ndarray, datatype: str) -> list:
    if datatype == "BYTES":
        try:
            return [_as_text(x) for x in array.reshape(-1).tolist()]
        except UnicodeDecodeError:
            raise InvalidArgument(
                f"output '{name}' holds bytes that are not UTF-8; request it with binary_data"
            ) from None
    if array.dtype.kind not in _JSON_NATIVE and datatype != "BOOL":
        array = array.astype(np.float32)  # BF16
    return array.reshape(-1).tolist()


def _encode_non_finite(doc: dict[str, Any]) -> str:
    """``doc`` as JSON with the non-finite numbers of its outputs' data written as Triton's names, in
    strings (``"NaN"``, ``"Infinity"``, ``"-Infinity"``); a non-finite number elsewhere (a model's
    response parameters) keeps Python's bare token."""
    for output in doc["outputs"]:
        data = output.get("data")
        if data and output["datatype"] in _FLOATS:
            output["data"] = [v if math.isfinite(v) else _NON_FINITE_TEXT.get(v, "NaN") for v in data]
    try:
        return _ENCODER.encode(doc)
    except ValueError:
        return _LENIENT_ENCODER.encode(doc)


def _as_text(item: Any) -> str:
    if isinstance(item, bytes):
        return item.decode("utf-8")
    return item if isinstance(item, str) else str(item)


def classify(array: np.ndarray, count: int, batched: bool, labels: Sequence[str] | None) -> np.ndarray:
    """Triton's classification extension: the top ``count`` scores as ``"score:index[:label]"``.

    For a batching model each row (first dimension) is classified on its own;
    the result is a BYTES tensor of shape ``[rows, k]`` (``[k]`` without batching).
    """
    if array.dtype.kind not in "biuf":
        raise InvalidArgument(f"classification needs a numeric output, got data-type {array.dtype}")
    rows = array.reshape(array.shape[0] if batched and array.ndim else 1, -1)
    k = min(count, rows.shape[1])
    out = np.empty((rows.shape[0], k), dtype=object)
    for r, row in enumerate(rows):
        top = np.argsort(-row.astype(np.float64), kind="stable")[:k]
        for j, index in enumerate(top.tolist()):
            text = f"{float(row[index]):f}:{index}"
            if labels is not None and index < len(labels):
                text += f":{labels[index]}"
            out[r, j] = text.encode("utf-8")
    return out if batched and array.ndim else out.reshape(k)


def _text(value: bytes | str) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


# --- the server as a client of its own replicas --------------------------------


def encode_infer_request(request: InferRequest) -> tuple[bytes, int]:
    """``request`` as an HTTP body with every input binary, asking for binary outputs (the requested
    ones by name, classification left to the caller); returns the body and its JSON header's length."""
    inputs: list[dict[str, Any]] = []
    blobs: list[Any] = []
    for name, tensor in request.inputs.items():
        array = to_numpy(tensor)
        datatype = wire_datatype(array)
        if datatype == "BYTES":
            blob: Any = serialize_bytes_tensor(array)
        else:
            blob = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        parameters = {"binary_data_size": len(blob)}
        inputs.append(
            {"name": name, "datatype": datatype, "shape": list(array.shape), "parameters": parameters}
        )
        blobs.append(blob)
    params: dict[str, Any] = {**request.parameters, "binary_data_output": True}
    if request.correlation_id:
        params["sequence_id"] = request.correlation_id
        params["sequence_start"] = request.sequence_start
        params["sequence_end"] = request.sequence_end
    if request.priority:
        params["priority"] = request.priority
    if request.timeout_us:
        params["timeout"] = request.timeout_us
    doc: dict[str, Any] = {"inputs": inputs, "parameters": params}
    if request.id:
        doc["id"] = request.id
    if request.requested_outputs is not None:
        doc["outputs"] = [
            {"name": o.name, "parameters": {"binary_data": True}} for o in request.requested_outputs
        ]
    header = _LENIENT_ENCODER.encode(doc).encode("utf-8")
    blobs.insert(0, header)
    return b"".join(blobs), len(header)


def decode_infer_response(
    status: int, body: bytes, header_length: int | None, error_code: str | None = None
) -> InferResponse:
    """A replica's HTTP answer as a response: its outputs (writable arrays), or its error as the
    server error its status (and ``error_code``, the reply's ``ERROR_CODE_HEADER``) stands for."""
    split = len(body) if header_length is None else header_length
    try:
        doc = json.loads(body[:split])
    except ValueError:
        doc = None
    if type(doc) is not dict:
        message = f"a replica answered {status} with a body that is not an inference response"
        if status == 200:
            raise InternalError(message)
        return InferResponse(error=error_for_http_status(status, message))
    if status != 200:
        message = str(doc.get("error", f"HTTP {status}"))
        return InferResponse(error=error_for_http_status(status, message, error_code))
    data = bytearray(body)  # tensors are views on it, writable (a model may change what it is handed)
    outputs: dict[str, Any] = {}
    offset = split
    for item in doc.get("outputs", []):
        name, datatype, shape = item["name"], item["datatype"], list(item["shape"])
        size = (item.get("parameters") or {}).get("binary_data_size")
        if size is None:
            outputs[name] = _json_tensor(name, datatype, shape, item.get("data"))
            continue
        model = str(doc.get("model_name", ""))
        outputs[name] = _binary_tensor(name, model, datatype, shape, data, offset, int(size))  # type: ignore[arg-type]
        offset += int(size)
    return InferResponse(
        outputs=outputs,
        parameters=doc.get("parameters") or {},
        model_name=str(doc.get("model_name", "")),
        model_version=str(doc.get("model_version", "")),
        id=str(doc.get("id", "")),
    )


def shared_tensor(name: str, model: str, datatype: str, shape: list[int], data: memoryview) -> Any:
    """An input read from shared memory: a read-only view on the region's bytes (BYTES: copied out)."""
    tensor = _binary_tensor(name, model, datatype, shape, data, 0, len(data))
    if isinstance(tensor, np.ndarray) and tensor.flags.writeable:
        tensor.flags.writeable = False
    return tensor
