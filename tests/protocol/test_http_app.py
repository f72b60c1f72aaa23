"""The ASGI applications called directly: routes, mount points, the error mapping, hostile input."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import numpy as np
import pytest

from deployments.protocol.dataplane import DataPlane
from deployments.protocol.http import (
    MODEL_ROUTES,
    SERVER_ROUTES,
    ModelHTTPApp,
    ServerHTTPApp,
    _BaseApp,
    error_reply,
)
from repository_loader.errors import STATUS_TABLE, error_for_code
from tests.protocol.fakes import FakeDataPlane, all_models


class Reply:
    def __init__(self, messages: list[dict]) -> None:
        start = messages[0]
        assert start["type"] == "http.response.start"
        self.status = start["status"]
        self.headers = {k.decode(): v.decode() for k, v in start["headers"]}
        self.body = b"".join(m.get("body", b"") for m in messages[1:])
        assert int(self.headers["content-length"]) == len(self.body)

    def json(self):
        return json.loads(self.body)


async def call(app, method, path, body=b"", headers=None, root_path="", chunks=1) -> Reply | None:
    """Drive ``app`` with one HTTP request, the body split into ``chunks`` messages."""
    size = max(1, -(-len(body) // chunks))
    parts = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
    incoming = [
        {"type": "http.request", "body": p, "more_body": i < len(parts) - 1} for i, p in enumerate(parts)
    ]
    sent: list[dict] = []

    async def receive():
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "root_path": root_path,
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
    }
    await app(scope, receive, send)
    return Reply(sent) if sent else None


@pytest.fixture(scope="module")
def dataplane(tmp_path_factory) -> FakeDataPlane:
    return FakeDataPlane(all_models(tmp_path_factory.mktemp("models")))


def infer_body(a, b, **extra):
    inputs = [
        {"name": n, "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
        for n, x in (("INPUT0", a), ("INPUT1", b))
    ]
    return json.dumps({"inputs": inputs, **extra}).encode()


def test_the_fake_implements_the_data_plane(dataplane):
    assert isinstance(dataplane, DataPlane)
    assert not isinstance(object(), DataPlane)


def test_every_route_has_a_handler():
    for route in SERVER_ROUTES + MODEL_ROUTES:
        assert callable(getattr(_BaseApp, "_" + route.handler, None)), route
    assert len({(r.method, r.pattern) for r in SERVER_ROUTES}) == len(SERVER_ROUTES)


@pytest.mark.parametrize(
    ("path", "root_path"),
    [
        ("/v2/models/add_sub/infer", "/v2/models/add_sub"),  # path holds the mount point
        ("/infer", "/v2/models/add_sub"),  # path relative to the mount point
        ("/v2/models/add_sub/infer", ""),  # no mount point given
        ("/infer", ""),
        ("/v2/models/add_sub/v2/models/add_sub/infer", "/v2/models/add_sub"),  # uvicorn --root-path
        ("/v2/models/add_sub/versions/2/infer", "/v2/models/add_sub"),
    ],
)
async def test_model_app_answers_relative_and_full_paths(dataplane, path, root_path):
    app = ModelHTTPApp(dataplane, "add_sub")
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    reply = await call(app, "POST", path, infer_body(a, a), root_path=root_path, chunks=3)
    assert reply.status == 200, reply.body
    doc = reply.json()
    assert doc["model_name"] == "add_sub" and doc["model_version"] == "2"
    assert doc["outputs"][0]["data"] == (2 * a + 1).ravel().tolist()  # version 2 adds one


@pytest.mark.parametrize(
    "path", ["/v2/models/strings/infer", "/v2/models/add_subx/infer", "/v2/health/live", "/nope", "/versions"]
)
async def test_model_app_refuses_other_paths(dataplane, path):
    reply = await call(ModelHTTPApp(dataplane, "add_sub"), "POST", path, b"{}")
    assert reply.status == 404
    assert reply.json()["error"] == "Not Found"


async def test_model_app_metadata_routes(dataplane):
    app = ModelHTTPApp(dataplane, "add_sub")
    root = "/v2/models/add_sub"
    meta = (await call(app, "GET", root, root_path=root)).json()
    assert meta["name"] == "add_sub" and meta["versions"] == ["1", "2"]
    assert meta["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}
    assert (await call(app, "GET", "/", root_path=root)).json() == meta
    assert (await call(app, "GET", "/versions/1", root_path=root)).json() == meta
    assert (await call(app, "GET", "/ready", root_path=root)).status == 200
    assert (await call(app, "GET", "/config")).json()["max_batch_size"] == 8
    assert (await call(app, "GET", "/versions/7/ready")).json() == {"error": "Model version not ready"}
    stats = (await call(app, "GET", "/versions/1/stats")).json()
    assert [s["version"] for s in stats["model_stats"]] == ["1"]


@pytest.mark.parametrize("root_path", ["", "/v2"])
async def test_server_app_routes(dataplane, root_path):
    app = ServerHTTPApp(dataplane)
    strip = len(root_path)
    get = lambda path: call(app, "GET", path[strip:], root_path=root_path)  # noqa: E731
    assert (await get("/v2")).json()["name"] == "triton"
    assert (await get("/v2/health/live")).status == 200
    assert (await get("/v2/health/ready")).status == 400  # strict: 'broken' is not ready
    assert (await get("/v2/models/strings/ready")).status == 200
    assert (await get("/v2/models/broken/ready")).status == 400
    names = [s["name"] for s in (await get("/v2/models/stats")).json()["model_stats"]]
    assert {"add_sub", "strings", "classifier", "broken"} <= set(names)
    index = (
        await call(app, "POST", "/v2/repository/index"[strip:], b'{"ready": true}', root_path=root_path)
    ).json()
    assert "broken" not in [m["name"] for m in index]


async def test_repository_load_and_unload(dataplane):
    app = ServerHTTPApp(dataplane)
    body = json.dumps({"parameters": {"config": "{}"}}).encode()
    assert (await call(app, "POST", "/v2/repository/models/new_one/load", body)).status == 200
    assert dataplane.loaded[-1] == ("new_one", {"config": "{}"})
    reply = await call(app, "POST", "/v2/repository/models/absent/load")
    assert reply.status == 400 and "failed to load 'absent'" in reply.json()["error"]
    assert (await call(app, "POST", "/v2/repository/models/strings/unload", b"")).status == 200
    assert dataplane.unloaded[-1] == ("strings", {})
    assert (await call(app, "POST", "/v2/repository/models/nope/unload")).status == 404


async def test_errors_map_to_their_status(dataplane):
    app = ServerHTTPApp(dataplane)
    a = np.zeros((1, 16), np.float32)
    cases = [
        ("GET", "/v2/models/nope", b"", 404, "unknown model: 'nope'"),
        ("POST", "/v2/models/nope/infer", infer_body(a, a), 404, "unknown model"),
        (
            "POST",
            "/v2/models/broken/infer",
            b'{"inputs":[{"name":"X","datatype":"INT64","shape":[1],"data":[1]}]}',
            503,
            "not ready",
        ),
        ("POST", "/v2/models/add_sub/infer", b"{bad json", 400, "failed to parse"),
        ("GET", "/v2/models/add_sub/infer", b"", 405, "Method Not Allowed"),
        ("GET", "/v3/anything", b"", 404, "Not Found"),
        ("POST", "/v2/repository/index", b"[]", 400, "must be an object"),
    ]
    for method, path, body, status, message in cases:
        reply = await call(app, method, path, body)
        assert reply.status == status, (path, reply.body)
        assert message in reply.json()["error"]
        assert reply.headers["content-type"] == "application/json"


def test_every_error_code_maps_once():
    for code, (status, _) in STATUS_TABLE.items():
        reply_status, _, body = error_reply(error_for_code(code, f"failed with {code.value}"))
        assert reply_status == status
        assert json.loads(body) == {"error": f"failed with {code.value}"}
    status, _, body = error_reply(RuntimeError("boom"))
    assert status == 500 and "RuntimeError: boom" in json.loads(body)["error"]


async def test_a_failing_data_plane_gives_500_not_a_crash(tmp_path: Path):
    plane = FakeDataPlane(all_models(tmp_path))

    def explode(inputs, version):
        raise RuntimeError("backend fell over")

    plane.models["add_sub"].compute = explode
    a = np.zeros((1, 16), np.float32)
    reply = await call(ServerHTTPApp(plane), "POST", "/v2/models/add_sub/infer", infer_body(a, a))
    assert reply.status == 500 and "backend fell over" in reply.json()["error"]


async def test_compressed_request_and_response(dataplane):
    import gzip

    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    body = gzip.compress(infer_body(a, a))
    headers = {"Content-Encoding": "gzip", "Accept-Encoding": "deflate"}
    reply = await call(ServerHTTPApp(dataplane), "POST", "/v2/models/add_sub/versions/1/infer", body, headers)
    assert reply.status == 200 and reply.headers["content-encoding"] == "deflate"
    import zlib

    assert json.loads(zlib.decompress(reply.body))["outputs"][0]["data"] == (2 * a).ravel().tolist()


async def test_metrics_hook_and_lifespan(dataplane):
    async def metrics():
        return "nv_inference_count 3\n"

    app = ServerHTTPApp(dataplane, metrics=metrics)
    reply = await call(app, "GET", "/metrics")
    assert reply.status == 200 and reply.body == b"nv_inference_count 3\n"
    assert (await call(ServerHTTPApp(dataplane), "GET", "/metrics")).status == 404
    events = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[dict] = []

    async def receive():
        return events.pop(0)

    async def send(message):
        sent.append(message)

    await app({"type": "lifespan"}, receive, send)
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


async def test_client_gone_before_the_body():
    sent: list[dict] = []

    async def receive():
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v2/models/x/infer", "headers": []}
    await ServerHTTPApp(FakeDataPlane([]))(scope, receive, send)
    assert sent == []


async def test_hostile_input_never_crashes(dataplane):
    rng = random.Random(7)
    app = ServerHTTPApp(dataplane)
    a = np.ones((1, 16), np.float32)
    seeds = [
        infer_body(a, a),
        infer_body(a, a, outputs=[{"name": "OUTPUT0", "parameters": {"classification": 3}}]),
        b'{"inputs":[{"name":"TEXT","datatype":"BYTES","shape":[2],"data":["a","b"]}]}',
    ]
    paths = [
        "/v2/models/add_sub/infer",
        "/v2/models/strings/infer",
        "/v2/models/classifier/infer",
        "/v2/repository/index",
    ]
    for _ in range(400):
        body = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 6)):
            i = rng.randrange(len(body))
            body[i : i + rng.randint(0, 3)] = bytes(rng.randrange(256) for _ in range(rng.randint(0, 3)))
        headers = {}
        if rng.random() < 0.3:
            headers["Inference-Header-Content-Length"] = str(rng.randint(-5, len(body) + 5))
        if rng.random() < 0.1:
            headers["Content-Encoding"] = rng.choice(["gzip", "deflate", "zstd"])
        reply = await call(app, "POST", rng.choice(paths), bytes(body), headers)
        assert reply.status in (200, 400, 404, 501), (reply.status, reply.body)
        if reply.status != 200:
            assert "error" in reply.json()


def random_value(rng: random.Random, depth: int = 0):
    choices = [None, True, -1, 0, 3, 2**70, 1.5, "x", "FP32", "BYTES", [], {}]
    value = rng.choice(choices)
    if depth < 2 and rng.random() < 0.3:
        value = [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return value


async def test_well_formed_json_of_wrong_shapes_never_crashes(dataplane):
    rng = random.Random(11)
    app = ServerHTTPApp(dataplane)
    statuses = set()
    for _ in range(300):
        data = [rng.random() for _ in range(16)]
        tensor = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": data}
        other = dict(tensor, name="INPUT1")
        field_to_break = rng.choice(["name", "datatype", "shape", "data", "parameters"])
        tensor[field_to_break] = random_value(rng)
        doc = {
            "inputs": [tensor, other],
            "id": rng.choice(["a", 3]),
            "parameters": rng.choice([{}, {"sequence_id": random_value(rng)}]),
        }
        if rng.random() < 0.5:
            doc["outputs"] = [
                {
                    "name": rng.choice(["OUTPUT0", 5]),
                    "parameters": {"binary_data": random_value(rng), "classification": random_value(rng)},
                }
            ]
        reply = await call(app, "POST", "/v2/models/add_sub/infer", json.dumps(doc).encode())
        statuses.add(reply.status)
        assert reply.status in (200, 400), (doc, reply.body)
    assert statuses == {200, 400}


async def test_a_decoupled_model_is_refused_on_http_infer_in_tritons_words(tmp_path):
    from tests.protocol.grpc_fakes import StreamingFakeDataPlane, grpc_models

    app = ModelHTTPApp(StreamingFakeDataPlane(grpc_models(tmp_path)), "repeat")
    inputs = [{"name": n, "datatype": "INT32", "shape": [1], "data": [1]} for n in ("COUNT", "VALUE")]
    reply = await call(app, "POST", "/v2/models/repeat/infer", json.dumps({"inputs": inputs}).encode())
    assert reply.status == 501
    assert reply.json() == {
        "error": "HTTP end point doesn't support models with decoupled transaction policy"
    }


class _HeldDataPlane(FakeDataPlane):
    """Its inferences wait for ``release``; ``cancelled`` counts those cancelled meanwhile."""

    def __init__(self, models) -> None:
        super().__init__(models)
        self.release = asyncio.Event()
        self.cancelled = 0

    async def infer(self, request, raw=None):
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return await super().infer(request, raw)


@pytest.mark.parametrize("forwarded", [False, True], ids=["a client's", "a peer's forward"])
async def test_only_a_forwarded_request_is_cancelled_when_its_connection_closes(tmp_path, forwarded):
    """A client that leaves does not cancel its HTTP inference (Triton); a request a peer replica sent
    on to its sequence's owner is cancelled with the peer's call (the peer closes the connection)."""
    from deployments.runtime.router import FORWARDED

    dataplane = _HeldDataPlane(all_models(tmp_path))
    app = ModelHTTPApp(dataplane, "add_sub")
    a = np.ones((1, 16), np.float32)
    headers = {FORWARDED.decode(): "0"} if forwarded else {}
    answering = asyncio.ensure_future(
        call(app, "POST", "/v2/models/add_sub/infer", infer_body(a, a), headers=headers)
    )
    await asyncio.sleep(0.05)  # the body is read; the next receive says the connection closed
    if forwarded:
        assert await asyncio.wait_for(answering, 5) is None
        assert dataplane.cancelled == 1 and dataplane.requests == []
    else:
        assert not answering.done()  # still running, as in Triton
        dataplane.release.set()
        reply = await asyncio.wait_for(answering, 5)
        assert reply is not None and reply.status == 200 and dataplane.cancelled == 0


class _RepliesAsIs(FakeDataPlane):
    """Answers every inference with ``reply``, as a router answers a probe (a shared constant)."""

    def __init__(self, models, reply) -> None:
        super().__init__(models)
        self.reply = reply

    async def infer(self, request, raw=None):
        return self.reply


@pytest.mark.parametrize("name", ["ABSENT_REPLY", "TAKEN_REPLY"])
async def test_a_reply_written_as_it_came_is_left_as_it_was(tmp_path, name):
    """Writing a reply adds its length to the headers sent, not to the reply: the probe answers are
    module constants, and a second answer with two lengths failed to parse at the asking replica."""
    from deployments.runtime import router

    constant = getattr(router, name)
    before = (constant[0], list(constant[1]), constant[2])
    app = ModelHTTPApp(_RepliesAsIs(all_models(tmp_path), constant), "add_sub")
    a = np.ones((1, 16), np.float32)
    for _ in range(3):
        reply = await call(app, "POST", "/v2/models/add_sub/infer", infer_body(a, a))
        assert reply is not None and reply.status == constant[0]
        assert reply.headers["content-length"] == "0"
    assert (constant[0], constant[1], constant[2]) == before
