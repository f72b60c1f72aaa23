"""Property-based tests of the codec and of the HTTP front end over a real model runtime (no Ray).

Whatever arrives (random JSON, random binary bodies and header lengths, random shapes and data
types, compressed or not), the answer is never a 5xx and never a crash: it is the model's result,
or a 4xx Triton-form JSON error. The model is the example repository's ``add_sub`` (Python backend,
FP32 ``[-1, 4]`` x 2 -> sum and difference), run in this process by its :class:`ModelRuntime`.
The example counts are bounded so the whole module runs in a few seconds.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deployments.protocol import codec
from deployments.protocol.http import ModelHTTPApp, ServerHTTPApp
from deployments.replica import replica_dataplane
from deployments.runtime.model import ModelRuntime
from repository_loader.errors import ServerError
from repository_loader.repository import load_model
from tests.protocol.test_limits import Reply, call

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "model_repository"
DATATYPES = [
    "BOOL",
    "UINT8",
    "INT8",
    "INT32",
    "INT64",
    "UINT64",
    "FP16",
    "FP32",
    "FP64",
    "BYTES",
    "BF16",
    "X",
]
FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), database=None)


class Served:
    """``add_sub``'s runtime on an event loop of its own, with the model and server HTTP apps over it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.runtime = ModelRuntime(load_model(EXAMPLES, "add_sub"))
        self.loop.run_until_complete(self.runtime.load())
        plane = replica_dataplane(self.runtime)
        self.apps = (ModelHTTPApp(plane, "add_sub"), ServerHTTPApp(plane))

    def request(self, app: int, method: str, path: str, body: bytes, headers: dict[str, str]) -> Reply:
        reply, _ = self.loop.run_until_complete(call(self.apps[app], method, path, body, headers))
        return reply

    def close(self) -> None:
        close = getattr(self.runtime, "close", None) or getattr(self.runtime, "unload", None)
        if close is not None:
            self.loop.run_until_complete(close())
        self.loop.close()


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    s = Served()
    yield s
    s.close()


def answered_well(reply: Reply) -> Any:
    """The parsed body: a 200 with strict JSON, or a 4xx with ``{"error": str}`` (or 501, the project's
    status for a feature it does not serve, such as a ``Content-Encoding`` other than gzip/deflate)."""
    assert reply.status < 500 or reply.status == 501, (reply.status, reply.body[:300])
    if reply.status == 200 and reply.headers.get("content-type") != "application/json":
        return None  # binary outputs: checked by the caller
    if not reply.body:
        assert reply.status in (200, 400)  # readiness answers carry no body
        return None
    doc = json.loads(reply.body, parse_constant=lambda token: pytest.fail(f"bare {token} in JSON"))
    if reply.status != 200:
        assert 400 <= reply.status <= 501 and type(doc.get("error")) is str, reply.body[:300]
    return doc


# --- random bodies ----------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=30,
)
infer_like = st.fixed_dictionaries(
    {
        "inputs": st.lists(
            st.fixed_dictionaries(
                {
                    "name": st.sampled_from(["INPUT0", "INPUT1", "OTHER"]) | json_values,
                    "datatype": st.sampled_from(DATATYPES) | json_values,
                    "shape": st.lists(st.integers(-2, 6), max_size=4) | json_values,
                },
                optional={"data": json_values, "parameters": json_values},
            ),
            max_size=3,
        )
        | json_values
    },
    optional={"outputs": json_values, "parameters": json_values, "id": json_values},
)


@FUZZ
@given(
    doc=json_values | infer_like,
    app=st.integers(0, 1),
    length=st.none() | st.text(max_size=6) | st.integers(-5, 400).map(str),
    tail=st.binary(max_size=64),
    encoding=st.sampled_from([None, "gzip", "deflate", "br", "identity"]),
)
def test_random_bodies_never_get_a_5xx(served, doc, app, length, tail, encoding):
    body = json.dumps(doc).encode() + tail
    headers = {} if length is None else {"inference-header-content-length": length}
    if encoding is not None:
        headers["content-encoding"] = encoding
        if encoding == "gzip":
            body = gzip.compress(body)
        elif encoding == "deflate":
            body = zlib.compress(body)
    answered_well(served.request(app, "POST", "/v2/models/add_sub/infer", body, headers))


@FUZZ
@given(body=st.binary(max_size=256), length=st.none() | st.text(max_size=6), app=st.integers(0, 1))
def test_random_binary_never_gets_a_5xx(served, body, length, app):
    headers = {} if length is None else {"inference-header-content-length": length}
    answered_well(served.request(app, "POST", "/v2/models/add_sub/infer", body, headers))


path_segments = st.lists(
    st.sampled_from(["v2", "models", "add_sub", "infer", "ready", "config", "stats", "versions", "1", ""])
    | st.text(max_size=6),
    max_size=6,
)


@FUZZ
@given(segments=path_segments, method=st.sampled_from(["GET", "POST", "PUT"]), app=st.integers(0, 1))
def test_random_paths_never_get_a_5xx(served, segments, method, app):
    answered_well(served.request(app, method, "/" + "/".join(segments), b"", {}))


# --- random well-formed tensors -------------------------------------------


def tensor_data(datatype: str, count: int) -> st.SearchStrategy[Any]:
    scalars = {
        "BOOL": st.booleans(),
        "INT32": st.integers(-(1 << 31), (1 << 31) - 1),
        "INT8": st.integers(-200, 200),
        "UINT8": st.integers(-5, 300),
        "FP32": st.floats(allow_nan=True, allow_infinity=True, width=32),
        "FP64": st.floats(),
        "BYTES": st.text(max_size=4),
    }.get(datatype, st.integers(0, 10))
    return st.lists(scalars | json_values, min_size=max(0, count - 1), max_size=count + 1)


@st.composite
def tensor_requests(draw: st.DrawFn) -> tuple[bytes, dict[str, str], dict[str, np.ndarray] | None]:
    """A request for add_sub: usually a right one (rows x 4 FP32, JSON or binary), sometimes with
    a random data type, shape or data. Returns the body, the headers and the inputs when they are
    right (what the model must answer), else None."""
    rows = draw(st.integers(1, 8))
    right = draw(st.booleans())
    inputs: dict[str, np.ndarray] = {}
    entries, blobs = [], []
    for name in ("INPUT0", "INPUT1"):
        if right:
            datatype, shape = "FP32", [rows, 4]
        else:
            datatype = draw(st.sampled_from(DATATYPES))
            shape = draw(st.lists(st.integers(0, 5), max_size=4))
        count = int(np.prod(shape))
        binary = draw(st.booleans()) and datatype in ("FP32", "INT32", "UINT8")
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
        if right or binary:
            values = draw(
                st.lists(
                    st.floats(-1e6, 1e6, width=32) if datatype == "FP32" else st.integers(0, 255),
                    min_size=count,
                    max_size=count,
                )
            )
            array = np.array(
                values, dtype={"FP32": np.float32, "INT32": np.int32, "UINT8": np.uint8}[datatype]
            )
            inputs[name] = array.reshape(shape)
            if binary:
                blob = array.tobytes()
                if not right and draw(st.booleans()):
                    blob = blob[: draw(st.integers(0, len(blob)))]
                entry["parameters"] = {"binary_data_size": len(blob)}
                blobs.append(blob)
            else:
                entry["data"] = values
        else:
            entry["data"] = draw(tensor_data(datatype, count))
        entries.append(entry)
    doc: dict[str, Any] = {"inputs": entries}
    if draw(st.booleans()):
        doc["parameters"] = {"binary_data_output": True}
    header = json.dumps(doc).encode()
    headers = {"inference-header-content-length": str(len(header))} if blobs else {}
    return header + b"".join(blobs), headers, inputs if right else None


@FUZZ
@given(case=tensor_requests(), app=st.integers(0, 1))
def test_tensors_answer_the_models_result_or_a_4xx(served, case, app):
    body, headers, inputs = case
    reply = served.request(app, "POST", "/v2/models/add_sub/infer", body, headers)
    answered_well(reply)
    if inputs is None:
        return
    assert reply.status == 200, reply.body[:300]
    length = reply.headers.get("inference-header-content-length")
    split = int(length) if length is not None else len(reply.body)
    doc = json.loads(reply.body[:split])
    offset = split
    got = {}
    for out in doc["outputs"]:
        if "data" in out:
            got[out["name"]] = np.array(out["data"], dtype=np.float32).reshape(out["shape"])
        else:
            size = out["parameters"]["binary_data_size"]
            raw = reply.body[offset : offset + size]
            got[out["name"]] = np.frombuffer(raw, dtype=np.float32).reshape(out["shape"])
            offset += size
    a, b = inputs["INPUT0"], inputs["INPUT1"]
    np.testing.assert_array_equal(got["OUTPUT0"], a + b)
    np.testing.assert_array_equal(got["OUTPUT1"], a - b)


# --- the codec alone ----------------------------------------------------------


@FUZZ
@given(doc=json_values | infer_like, tail=st.binary(max_size=32), length=st.none() | st.integers(-3, 300))
def test_the_codec_raises_only_server_errors(doc, tail, length):
    body = json.dumps(doc).encode() + tail
    try:
        header = None if length is None else codec.parse_header_length(str(length).encode(), len(body))
        request, _ = codec.decode_infer_request(body, header, "m")
    except ServerError as e:
        assert 400 <= e.http_status < 500 or e.http_status == 501, e.message
        return
    for tensor in request.inputs.values():
        assert isinstance(tensor, np.ndarray)
