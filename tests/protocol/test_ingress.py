"""The replica's ingress middleware: which requests its application answers directly, which go to Serve."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from deployments.serve import ingress
from deployments.serve.ingress import DISCONNECT_DISABLED, ReplicaIngress


class Recorder:
    """An ASGI app that records the scopes it was called with."""

    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.scopes.append(scope)


@pytest.fixture(autouse=True)
def no_registrations() -> Iterator[None]:
    saved = dict(ingress._direct)
    ingress._direct.clear()
    yield
    ingress._direct.clear()
    ingress._direct.update(saved)


def http(path: str, root_path: str = "") -> dict[str, Any]:
    return {"type": "http", "path": path, "root_path": root_path, "headers": [(b"host", b"x")]}


async def call(
    path: str, root_path: str = "", enabled: bool = True
) -> tuple[Recorder, Recorder, dict[str, Any]]:
    """(Serve's handler, the model's app, the scope) after one request through the middleware."""
    serve, model = Recorder(), Recorder()
    ingress.serve_directly("/v2/models/crnn", model, enabled=enabled)
    scope = http(path, root_path)
    await ReplicaIngress(serve)(scope, None, None)
    return serve, model, scope


@pytest.mark.parametrize(
    "path",
    ["/v2/models/crnn", "/v2/models/crnn/infer", "/v2/models/crnn/versions/1/infer", "/v2/models/crnn/"],
)
async def test_the_models_paths_skip_serves_handler(path: str) -> None:
    serve, model, scope = await call(path)
    assert [s["path"] for s in model.scopes] == [path]
    assert serve.scopes == []
    assert DISCONNECT_DISABLED not in scope["headers"]


async def test_each_direct_answer_is_counted() -> None:
    serve = Recorder()
    ingress.serve_directly("/v2/models/crnn", Recorder())
    for path in ("/v2/models/crnn/infer", "/v2/models/crnn/ready", "/-/healthz", "/v2/models/other"):
        await ReplicaIngress(serve)(http(path), None, None)
    assert ingress.answered_directly("/v2/models/crnn") == 2
    assert ingress.answered_directly("/v2/models/other") is None


@pytest.mark.parametrize(
    "path", ["/-/healthz", "/-/routes", "/v2/models/crnn2/infer", "/v2/health/ready", "/"]
)
async def test_serves_own_routes_and_foreign_paths_go_to_serve_run_to_completion(path: str) -> None:
    serve, model, scope = await call(path)
    assert model.scopes == []
    assert [s["path"] for s in serve.scopes] == [path]
    assert DISCONNECT_DISABLED in scope["headers"]


async def test_the_prefix_is_matched_below_the_servers_root_path() -> None:
    serve, model, _ = await call("/api/v2/models/crnn/infer", root_path="/api")
    assert len(model.scopes) == 1 and serve.scopes == []


async def test_a_withdrawn_app_is_no_longer_answered_directly() -> None:
    serve, model = Recorder(), Recorder()
    ingress.serve_directly("/v2/models/crnn", model)
    ingress.withdraw("/v2/models/crnn")
    await ReplicaIngress(serve)(http("/v2/models/crnn/infer"), None, None)
    assert model.scopes == [] and len(serve.scopes) == 1


def test_an_app_of_another_event_loop_is_not_called_from_this_one() -> None:
    """Where Serve runs user code on a loop of its own, requests must reach it through Serve."""
    model = Recorder()

    async def register() -> None:
        ingress.serve_directly("/v2/models/crnn", model)

    other = asyncio.new_event_loop()
    try:
        other.run_until_complete(register())
    finally:
        other.close()

    async def route() -> Any:
        return ingress.route_for("/v2/models/crnn/infer", asyncio.get_running_loop())

    assert asyncio.run(route()) is None


def test_registration_needs_a_running_loop() -> None:
    assert ingress.serve_directly("/v2/models/crnn", Recorder()) is False
    assert ingress._direct == {}


async def test_the_direct_lane_can_be_turned_off() -> None:
    from deployments.settings import DIRECT_ROUTES_ENV, ServerSettings

    settings = ServerSettings.from_args({"model_repository": "/repo"}, {DIRECT_ROUTES_ENV: "0"})
    serve, model, _ = await call("/v2/models/crnn/infer", enabled=settings.direct_routes)
    assert model.scopes == [] and len(serve.scopes) == 1


async def test_the_longest_prefix_wins() -> None:
    short, long, root = Recorder(), Recorder(), Recorder()
    ingress.serve_directly("/v2", short)
    ingress.serve_directly("/v2/models/crnn/", long)
    loop = asyncio.get_running_loop()

    def app_for(path: str) -> Any:
        route = ingress.route_for(path, loop)
        return None if route is None else route.app

    assert app_for("/v2/models/crnn/infer") is long
    assert app_for("/v2/health/live") is short
    assert app_for("/v3") is None
    ingress.serve_directly("/", root)
    assert app_for("/v3") is root and app_for("/v2/models/crnn") is long
    assert app_for("/-/healthz") is None


async def test_lifespan_and_websocket_scopes_go_to_serve() -> None:
    serve, model = Recorder(), Recorder()
    ingress.serve_directly("/v2/models/crnn", model)
    scope = {"type": "websocket", "path": "/v2/models/crnn/infer", "headers": []}
    await ReplicaIngress(serve)(scope, None, None)
    assert model.scopes == [] and serve.scopes == [scope]


async def test_grpc_calls_reach_the_registered_lane_with_the_trailers_extension() -> None:
    from deployments.protocol.http1_server import TRAILERS_EXTENSION
    from deployments.serve.response_writes import coalesce_response_writes

    assert coalesce_response_writes()
    serve, lane, model = Recorder(), Recorder(), Recorder()
    ingress.serve_directly("/v2/models/crnn", model)
    ingress.serve_grpc_calls(lane)
    try:
        for path in ("/inference.GRPCInferenceService/ModelInfer", "/v2/models/crnn/infer", "/-/healthz"):
            await ReplicaIngress(serve)(http(path), None, None)
    finally:
        ingress.serve_grpc_calls(None)
    assert [s["path"] for s in lane.scopes] == ["/inference.GRPCInferenceService/ModelInfer"]
    assert TRAILERS_EXTENSION in lane.scopes[0]["extensions"]
    assert [s["path"] for s in model.scopes] == ["/v2/models/crnn/infer"]
    assert [s["path"] for s in serve.scopes] == ["/-/healthz"]
    await ReplicaIngress(serve)(http("/inference.GRPCInferenceService/ModelInfer"), None, None)
    assert len(lane.scopes) == 1 and serve.scopes[-1]["path"].startswith("/inference")  # withdrawn: Serve's
