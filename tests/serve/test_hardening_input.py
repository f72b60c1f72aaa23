"""End to end through HAProxy and the model replicas: a decompression bomb, encoded paths and lenient
input (faults 1, 3 and 6 of the hardening issue) on the shared Serve instance."""

from __future__ import annotations

import gzip
import http.client
import json
from pathlib import Path

import numpy as np
import pytest

from repository_loader.plan import model_app_name
from tests.serve import processes

pytestmark = pytest.mark.serve


def request(
    url: str, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One request with ``path`` sent exactly as given (no client-side normalisation)."""
    host, port = url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def add_sub_json(a: list, b: list) -> bytes:
    inputs = [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": a},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, 4], "data": b},
    ]
    return json.dumps({"inputs": inputs}).encode()


def error_of(status: int, headers: dict[str, str], body: bytes) -> str:
    assert headers.get("content-type") == "application/json", (status, body[:200])
    return json.loads(body)["error"]


def replica_pids(model: str) -> list[int]:
    """The processes of ``model``'s Serve replicas among this session's (Ray titles them
    ``ray::ServeReplica:<application>:...``)."""
    tag = f"ServeReplica:{model_app_name(model)}:"
    return sorted(p for p in processes.descendants() if tag in processes.command(p))


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM for {pid}")


# --- fault 1: decompression bomb ----------------------------------------------


def test_a_decompression_bomb_is_413_and_the_replica_does_not_grow(server_url: str) -> None:
    ok = request(server_url, "POST", "/v2/models/add_sub/infer", add_sub_json([1] * 4, [2] * 4))
    assert ok[0] == 200
    pids = replica_pids("add_sub")
    assert pids, "add_sub's replica process was not found"
    before = {pid: peak_rss_kib(pid) for pid in pids}
    bomb = gzip.compress(bytes(1 << 30), compresslevel=9)  # 1 GiB of zeros in about 1 MB
    status, headers, body = request(
        server_url, "POST", "/v2/models/add_sub/infer", bomb, {"Content-Encoding": "gzip"}
    )
    grown = max(peak_rss_kib(pid) - before[pid] for pid in pids)
    assert grown < 300 * 1024, f"a replica's peak memory grew by {grown} KiB ({status}: {body[:200]!r})"
    assert status == 413, body[:200]
    assert "inflates to more than the limit" in error_of(status, headers, body)
    assert request(server_url, "POST", "/v2/models/add_sub/infer", add_sub_json([1] * 4, [2] * 4))[0] == 200


def test_a_body_over_the_input_limit_is_413(server_url: str) -> None:
    body = b" " * (64 * 1024 * 1024 + 1)  # one byte over Triton's default --http-max-input-size
    status, headers, reply = request(server_url, "POST", "/v2/models/add_sub/infer", body)
    assert status == 413
    assert "max_input_size" in error_of(status, headers, reply)


# --- fault 3: encoded paths ------------------------------------------------------


@pytest.mark.parametrize(
    "prefix",
    ["/v2/models/add_%73ub", "/v2//models/add_sub", "/v2/models//add_sub", "/v2/models/add_sub%2F"],
)
@pytest.mark.parametrize(("method", "route"), [("POST", "infer"), ("GET", "ready"), ("GET", "config")])
def test_encoded_paths_are_400_on_every_route(server_url: str, prefix: str, method: str, route: str) -> None:
    path = prefix + ("" if prefix.endswith("%2F") else "/") + route
    body = add_sub_json([1] * 4, [2] * 4) if method == "POST" else None
    status, headers, reply = request(server_url, method, path, body)
    assert status == 400, (path, status, reply[:200])
    assert "request path" in error_of(status, headers, reply)


def test_the_canonical_paths_answer(server_url: str) -> None:
    assert request(server_url, "GET", "/v2/models/add_sub/ready")[0] == 200
    assert request(server_url, "GET", "/v2/models/add_sub/config")[0] == 200
    status, _, body = request(server_url, "POST", "/v2/models/add_sub/infer", add_sub_json([1] * 4, [2] * 4))
    assert status == 200
    assert json.loads(body)["outputs"][0]["data"] == [3.0] * 4


# --- fault 6: lenient input -------------------------------------------------------


@pytest.mark.parametrize(("value", "fragment"), [(None, "got null"), (True, "got true"), ("3", 'got "3"')])
def test_fp32_data_of_another_kind_is_400(server_url: str, value: object, fragment: str) -> None:
    status, headers, body = request(
        server_url, "POST", "/v2/models/add_sub/infer", add_sub_json([1, 2, 3, value], [1] * 4)
    )
    assert status == 400, body[:200]
    assert fragment in error_of(status, headers, body)


# Whitespace around a header value is not part of it (RFC 9110, 5.5): " 188 " arrives as "188".
@pytest.mark.parametrize("length", ["1 88", "+188", "1_0", "0x188"])
def test_header_length_other_than_digits_is_400(server_url: str, length: str) -> None:
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    inputs = [
        {"name": n, "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": 16}}
        for n in ("INPUT0", "INPUT1")
    ]
    header = json.dumps({"inputs": inputs}).encode()
    headers = {"Inference-Header-Content-Length": length.replace("188", str(len(header)))}
    status, reply_headers, body = request(
        server_url, "POST", "/v2/models/add_sub/infer", header + x.tobytes() * 2, headers
    )
    assert status == 400, body[:200]
    assert "must be an integer" in error_of(status, reply_headers, body)
    headers = {"Inference-Header-Content-Length": str(len(header))}
    assert (
        request(server_url, "POST", "/v2/models/add_sub/infer", header + x.tobytes() * 2, headers)[0] == 200
    )


def test_non_finite_outputs_are_strict_json(server_url: str) -> None:
    # Triton's bare tokens are read in requests; inf - inf is NaN in OUTPUT1
    body = (
        b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,4],"data":[Infinity,1,-Infinity,2]},'
        b'{"name":"INPUT1","datatype":"FP32","shape":[1,4],"data":[Infinity,1,1,2]}]}'
    )
    status, _, reply = request(server_url, "POST", "/v2/models/add_sub/infer", body)
    assert status == 200, reply[:200]

    def refuse(token: str) -> None:
        raise AssertionError(f"bare {token} in the response JSON")

    outputs = {o["name"]: o["data"] for o in json.loads(reply, parse_constant=refuse)["outputs"]}
    assert outputs["OUTPUT0"] == ["Infinity", 2.0, "-Infinity", 4.0]
    assert outputs["OUTPUT1"] == ["NaN", 0.0, "-Infinity", 0.0]
