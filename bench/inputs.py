"""Infer requests for any model, built from its metadata: shapes, random data, binary or JSON form.

Shapes follow perf_analyzer's conventions: ``--shape NAME:d1,d2`` fixes an input's dimensions without
the batch dimension, and ``batch_size`` rows are sent when the model batches (``max_batch_size > 0``).
A pool of distinct request bodies is made once and cycled through, so the server never sees the same
payload twice in a row and the client does no encoding while it measures.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.client import encode_request

_NUMPY: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BF16": np.uint16,
}


class InputSpecError(ValueError):
    """An input's shape or data type cannot be turned into a request (names the input and the rule)."""


@dataclass(frozen=True)
class TensorSpec:
    """One input to send: name, KServe data type and the full shape (batch dimension included)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


def parse_shape_options(options: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """``["NAME:1,2", ...]`` as ``{"NAME": (1, 2)}``."""
    shapes = {}
    for opt in options:
        name, sep, dims = opt.rpartition(":")
        if not sep or not name:
            raise InputSpecError(f"--shape {opt!r}: expected NAME:d1,d2,...")
        try:
            shapes[name] = tuple(int(d) for d in dims.split(",") if d)
        except ValueError as exc:
            raise InputSpecError(f"--shape {opt!r}: dimensions must be integers") from exc
    return shapes


def tensor_specs(
    metadata: Mapping[str, Any],
    max_batch_size: int,
    batch_size: int = 1,
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> list[TensorSpec]:
    """The inputs of a model (its ``/v2/models/m`` metadata) with every dimension fixed."""
    shapes = shapes or {}
    specs = []
    for inp in metadata.get("inputs", []):
        name, dims = inp["name"], [int(d) for d in inp["shape"]]
        if max_batch_size > 0:
            dims = dims[1:]
        if name in shapes:
            dims = list(shapes[name])
        if any(d < 0 for d in dims):
            raise InputSpecError(
                f"input '{name}' of model '{metadata.get('name')}' has variable dims {dims}: give --shape {name}:d1,d2"
            )
        full = ([batch_size] if max_batch_size > 0 else []) + dims
        specs.append(TensorSpec(name, inp["datatype"], tuple(full)))
    return specs


def random_tensor(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    """Random data for one input: floats in [0, 1), small integers, random booleans or strings."""
    if spec.datatype == "BYTES":
        n = int(np.prod(spec.shape))
        words = [int(rng.integers(0, 1 << 30)).to_bytes(4, "little").hex().encode() for _ in range(n)]
        return np.array(words, dtype=np.object_).reshape(spec.shape)
    if spec.datatype not in _NUMPY:
        raise InputSpecError(f"input '{spec.name}': unsupported data type {spec.datatype}")
    dtype = _NUMPY[spec.datatype]
    if spec.datatype == "BOOL":
        return rng.integers(0, 2, spec.shape).astype(np.bool_)
    if np.issubdtype(dtype, np.floating):
        return rng.random(spec.shape).astype(dtype)
    return rng.integers(0, 100, spec.shape).astype(dtype)


def _raw_bytes(spec: TensorSpec, data: np.ndarray) -> bytes:
    """The binary-extension bytes of a tensor (BYTES elements as 4-byte length + content)."""
    if spec.datatype == "BYTES":
        return b"".join(struct.pack("<I", len(x)) + x for x in data.reshape(-1))
    return np.ascontiguousarray(data).tobytes()


def _json_data(spec: TensorSpec, data: np.ndarray) -> list[Any]:
    """A tensor's flat data for a JSON request."""
    if spec.datatype == "BYTES":
        return [x.decode() for x in data.reshape(-1)]
    return data.reshape(-1).tolist()


def infer_body(
    specs: Sequence[TensorSpec], arrays: Sequence[np.ndarray], outputs: Sequence[str], binary: bool
) -> tuple[bytes, dict[str, str]]:
    """The body and extra headers of one infer request, in the binary extension or in JSON."""
    header: dict[str, Any] = {"inputs": []}
    blobs = []
    for spec, data in zip(specs, arrays, strict=True):
        entry: dict[str, Any] = {"name": spec.name, "shape": list(spec.shape), "datatype": spec.datatype}
        if binary:
            blob = _raw_bytes(spec, data)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = _json_data(spec, data)
        header["inputs"].append(entry)
    header["outputs"] = [{"name": o, "parameters": {"binary_data": binary}} for o in outputs]
    head = json.dumps(header, separators=(",", ":")).encode()
    if not binary:
        return head, {"Content-Type": "application/json"}
    extra = {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}
    return head + b"".join(blobs), extra


def request_pool(
    url_host: str,
    model: str,
    specs: Sequence[TensorSpec],
    outputs: Sequence[str],
    *,
    binary: bool = True,
    version: str = "",
    variants: int = 16,
    seed: int = 0,
) -> list[bytes]:
    """``variants`` distinct, fully encoded infer requests for ``model``."""
    rng = np.random.default_rng(seed)
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    pool = []
    for _ in range(max(1, variants)):
        arrays = [random_tensor(s, rng) for s in specs]
        body, headers = infer_body(specs, arrays, outputs, binary)
        pool.append(encode_request("POST", url_host, path, body, headers))
    return pool
