"""The settings object and the one data plane over the server's registry (no Ray)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from deployments.control import ModelController
from deployments.protocol.dataplane import DataPlane, ModelDataPlane
from deployments.runtime.router import Router
from deployments.serve.cli import NO_EFFECT, add_parser, server_args, unapplied_flags
from deployments.settings import (
    DIRECT_ROUTES_ENV,
    REPLICA_HTTP_ENV,
    ResourceLimit,
    ServerSettings,
    SettingsError,
)
from repository_loader.autoscaling import Autoscaling
from repository_loader.errors import NotFound, Unavailable
from repository_loader.model import ModelDescription, ModelState, TensorSpec

ROOT = Path(__file__).resolve().parents[2]


def test_serve_config_args_and_environment_are_read_once() -> None:
    settings = ServerSettings.from_args(
        {
            "model_repository": "examples/model_repository",
            "model_control_mode": "EXPLICIT",
            "load_model": "a",
        },
        {DIRECT_ROUTES_ENV: "0"},
    )
    assert settings.model_repository == str(ROOT / "examples" / "model_repository")
    assert settings.model_control_mode == "explicit" and settings.load_models == ("a",)
    assert settings.direct_routes is False and settings.auto_complete and settings.strict_readiness
    assert ServerSettings.from_args(settings.to_args(), {DIRECT_ROUTES_ENV: "0"}) == settings
    with pytest.raises(AttributeError):
        settings.http_port = 1  # type: ignore[misc]


def test_the_replica_http_server_and_its_busy_poll() -> None:
    repo = {"model_repository": "s3://b/m"}
    default = ServerSettings.from_args(repo, {})
    assert default.replica_http == "own" and default.busy_poll_us == 300
    chosen = ServerSettings.from_args({**repo, "busy_poll_us": "0"}, {REPLICA_HTTP_ENV: "UVICORN"})
    assert chosen.replica_http == "uvicorn" and chosen.busy_poll_us == 0
    assert ServerSettings.from_args(chosen.to_args(), {REPLICA_HTTP_ENV: "uvicorn"}) == chosen
    with pytest.raises(SettingsError, match="TRITON_SERVE_REPLICA_HTTP must be one of own, uvicorn"):
        ServerSettings.from_args(repo, {REPLICA_HTTP_ENV: "h11"})
    with pytest.raises(SettingsError, match="busy_poll_us must be between 0 and 100000"):
        ServerSettings.from_args({**repo, "busy_poll_us": -1}, {})
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = server_args(parser.parse_args(["serve", "/m", "--busy-poll-us", "50"]))
    assert ServerSettings.from_args(args, {}).busy_poll_us == 50


def test_the_repository_stays_a_url() -> None:
    settings = ServerSettings.from_args({"model_repository": "s3://bucket/models"}, {})
    assert settings.model_repository == "s3://bucket/models" and isinstance(settings.model_repository, str)


def test_a_repository_named_twice_is_one_repository(tmp_path: Path) -> None:
    """Triton keeps its repositories as a set: the same folder twice holds no duplicate models."""
    repos = [str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "a")]
    settings = ServerSettings.from_args({"model_repository": repos}, {})
    assert settings.model_repositories == (str(tmp_path / "a"), str(tmp_path / "b"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "model_repository is required"),
        (
            {"model_repository": "/r", "model_control_mode": "sometimes"},
            "must be one of none, explicit, poll",
        ),
        ({"model_repository": "/r", "strict_readiness": "maybe"}, "strict_readiness must be true or false"),
        ({"model_repository": "/r", "http_port": "eighty"}, "http_port must be a int"),
        ({"model_repository": "/r", "deploy_timeout_s": 0}, "deploy_timeout_s must be positive"),
        (
            {"model_repository": "/r", "model_host_placement": "anywhere"},
            "model_host_placement must be pooled or dedicated, not 'anywhere'",
        ),
        (
            {"model_repository": "/r", "model_host_max_per_node": -1},
            "model_host_max_per_node must not be negative",
        ),
        (
            {"model_repository": "/r", "model_host_autoscaling": {"max_replicas": 2}},
            "model_host_autoscaling needs model_hosts above 0",
        ),
        (
            {"model_repository": "/r", "model_hosts": 3, "model_host_autoscaling": {"max_replicas": 2}},
            "model_host_autoscaling: max_replicas must be >= min_replicas (3), got 2",  # min: model_hosts
        ),
        (
            {"model_repository": "/r", "model_hosts": 1, "model_host_autoscaling": ["max_replicas"]},
            "model_host_autoscaling takes field=value, not 'max_replicas'",
        ),
        (
            {"model_repository": "/r", "model_controll_mode": "none"},
            "unknown server argument(s) ['model_controll_mode']",
        ),
    ],
)
def test_bad_arguments_say_what_is_wrong(args: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        ServerSettings.from_args(args, {})
    assert message in str(caught.value)


def test_cli_flags_are_the_same_arguments() -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    ns = parser.parse_args(
        ["serve", "/repo", "--http-port", "9000", "--load-model", "m", "--no-strict-readiness"]
    )
    settings = ServerSettings.from_args(server_args(ns), {})
    assert (settings.http_port, settings.load_models, settings.strict_readiness) == (9000, ("m",), False)
    ns = parser.parse_args(
        ["serve", "/repo", "--model-host-placement", "dedicated", "--model-host-max-per-node", "1"]
    )
    policy = ServerSettings.from_args(server_args(ns), {}).host_policy
    assert (policy.placement, policy.max_per_node) == ("dedicated", 1)
    flags = ["--model-hosts", "2", "--model-host-autoscaling", "max_replicas=4"]
    ns = parser.parse_args(["serve", "/repo", *flags, "--model-host-autoscaling", "upscale_delay_s=1.5"])
    settings = ServerSettings.from_args(server_args(ns), {})
    assert settings.host_policy.autoscaling == Autoscaling(
        min_replicas=2, max_replicas=4, upscale_delay_s=1.5
    )
    assert ServerSettings.from_args(settings.to_args(), {}) == settings  # read back as written
    flags = ["--model-hosts", "2", "--model-host-autoscaling", "max_replicas=4"]
    ns = parser.parse_args(["serve", "/repo", *flags, "--model-host-autoscaling", "upscale_delay_s=1.5"])
    settings = ServerSettings.from_args(server_args(ns), {})
    assert settings.host_policy.autoscaling == Autoscaling(
        min_replicas=2, max_replicas=4, upscale_delay_s=1.5
    )
    assert ServerSettings.from_args(settings.to_args(), {}) == settings  # read back as written


@pytest.mark.parametrize(
    ("flags", "strict"),
    [([], True), (["--strict-readiness=false"], False), (["--strict-readiness", "true"], True)],
)
def test_tritons_own_strict_readiness_flag_is_accepted(flags: list[str], strict: bool) -> None:
    """A Triton user's ``--strict-readiness=false`` works as typed (before: an unrecognized argument)."""
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    settings = ServerSettings.from_args(server_args(parser.parse_args(["serve", "/repo", *flags])), {})
    assert settings.strict_readiness is strict


def test_a_tritonserver_command_line_starts_as_it_is() -> None:
    """Flags as a Triton user's scripts pass them: those that map are applied, the others named."""
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    ns = parser.parse_args(
        [
            "serve",
            "--model-repository=/models",
            "--exit-timeout-secs=120",
            "--id=edge-7",
            "--strict-model-config=true",
            "--http-address=0.0.0.0",
            "--log-verbose=1",
            "--backend-config=python,shm-default-byte-size=5242880",
            "--backend-config=onnxruntime,enable-global-threadpool=1",
            "--pinned-memory-pool-byte-size=0",
            "--allow-http=true",
            "--grpc-use-ssl=false",
        ]
    )
    settings = ServerSettings.from_args(server_args(ns), {})
    assert (settings.exit_timeout_secs, settings.server_id, settings.auto_complete) == (
        120.0,
        "edge-7",
        False,
    )
    assert (settings.http_host, settings.log_verbose) == ("0.0.0.0", 1)
    assert ServerSettings.from_args(settings.to_args(), {}) == settings
    assert unapplied_flags(ns) == [
        "--backend-config=python,shm-default-byte-size=5242880,onnxruntime,enable-global-threadpool=1 "
        "has no effect here: " + NO_EFFECT["--backend-config"],
        "--pinned-memory-pool-byte-size=0 has no effect here: " + NO_EFFECT["--pinned-memory-pool-byte-size"],
    ]
    defaults = ServerSettings.from_args(server_args(parser.parse_args(["serve", "/m"])), {})
    assert (defaults.exit_timeout_secs, defaults.server_id, defaults.auto_complete) == (30.0, "triton", True)
    assert unapplied_flags(parser.parse_args(["serve", "/m"])) == []


# tritonserver 2.51's options (its --help), each with a value it accepts; --cache-config, which it
# refuses beside --response-cache-byte-size as this server does, is in the shared server's settings
TRITONSERVER_2_51_FLAGS = {
    "allow-cpu-metrics": "true", "allow-gpu-metrics": "true", "allow-grpc": "true", "allow-http": "true",
    "allow-metrics": "true", "allow-sagemaker": "false", "allow-vertex-ai": "false",
    "backend-config": "python,shm-default-byte-size=1048576", "backend-directory": "/opt/tritonserver/backends",
    "buffer-manager-thread-count": "0", "cache-directory": "/tmp/c",
    "cuda-memory-pool-byte-size": "0:67108864", "cuda-virtual-address-size": "0:1073741824",
    "disable-auto-complete-config": None, "enable-peer-access": "true", "exit-on-error": "false",
    "exit-timeout-secs": "30", "grpc-address": "0.0.0.0", "grpc-header-forward-pattern": "x-.*",
    "grpc-http2-max-ping-strikes": "2", "grpc-http2-max-pings-without-data": "2",
    "grpc-http2-min-recv-ping-interval-without-data": "300000", "grpc-infer-allocation-pool-size": "8",
    "grpc-infer-response-compression-level": "high", "grpc-keepalive-permit-without-calls": "false",
    "grpc-keepalive-time": "7200000", "grpc-keepalive-timeout": "20000", "grpc-max-connection-age": "0",
    "grpc-max-connection-age-grace": "0", "grpc-port": "8001", "grpc-restricted-protocol": "health:k=v",
    "grpc-root-cert": "/c", "grpc-server-cert": "/c", "grpc-server-key": "/k", "grpc-use-ssl": "false",
    "grpc-use-ssl-mutual": "false", "host-policy": "gpu_0,numa-node=0", "http-address": "0.0.0.0",
    "http-header-forward-pattern": "x-.*", "http-port": "8000", "http-restricted-api": "health:k=v",
    "http-thread-count": "8", "id": "triton", "load-model": "m", "log-error": "true", "log-file": "/tmp/l",
    "log-format": "ISO8601", "log-info": "true", "log-verbose": "1", "log-warning": "true",
    "metrics-address": "0.0.0.0", "metrics-config": "summary_latencies=true", "metrics-interval-ms": "2000",
    "metrics-port": "8002", "model-config-name": "h100", "model-control-mode": "explicit",
    "model-load-gpu-limit": "0:0.5", "model-load-retry-count": "1", "model-load-thread-count": "4",
    "model-namespacing": "false", "model-repository": "/models", "model-store": "/models2",
    "pinned-memory-pool-byte-size": "0", "rate-limit": "off", "rate-limit-resource": "R1:10",
    "repoagent-directory": "/opt/r", "repository-poll-secs": "5", "response-cache-byte-size": "1048576",
    "reuse-grpc-port": "false", "reuse-http-port": "false", "sagemaker-port": "8080",
    "sagemaker-safe-port-range": "8081-9000", "sagemaker-thread-count": "8", "strict-model-config": "false",
    "strict-readiness": "true", "trace-config": "rate=100", "trace-count": "-1", "trace-file": "/tmp/t.json",
    "trace-level": "TIMESTAMPS", "trace-log-frequency": "0", "trace-rate": "1000", "vertex-ai-default-model": "m",
    "vertex-ai-port": "8080", "vertex-ai-thread-count": "8",
}  # fmt: skip


def test_every_tritonserver_flag_is_taken() -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    argv = [f"--{k}" if v is None else f"--{k}={v}" for k, v in TRITONSERVER_2_51_FLAGS.items()]
    ns = parser.parse_args(["serve", *argv])
    settings = ServerSettings.from_args(server_args(ns), {})
    assert settings.model_repositories == ("/models", "/models2") and settings.grpc_compression == "gzip"
    # the older trace flags are --trace-config settings, before the --trace-config flags themselves
    assert settings.trace.flags == (
        "triton,file=/tmp/t.json", "level=TIMESTAMPS", "rate=1000", "count=-1", "triton,log-frequency=0",
        "rate=100",
    )  # fmt: skip
    assert settings.trace.rate == 100 and settings.trace.level == ("TIMESTAMPS",)
    named = {line.split("=", 1)[0] for line in unapplied_flags(ns)}
    # every flag given that has no effect is named at start (NO_EFFECT also has older releases' flags)
    assert named == {f for f in NO_EFFECT if f.removeprefix("--") in TRITONSERVER_2_51_FLAGS}
    assert len(named) == 37
    # Python-based backends are looked for where Triton looks (docs/python_backend.md)
    assert settings.backend_directory == "/opt/tritonserver/backends"
    # the rate limiter's flags are applied (docs/rate_limiter.md)
    assert settings.rate_limit == "off" and settings.rate_limit_resources == (ResourceLimit("R1", 10),)
    assert settings.model_namespacing is False
    namespaced = parser.parse_args(["serve", "--model-repository=/a", "--model-namespacing=true"])
    assert ServerSettings.from_args(server_args(namespaced), {}).model_namespacing is True


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--allow-http=false", "--allow-http=false is not supported: HTTP carries"),
        ("--grpc-use-ssl=1", "--grpc-use-ssl=1 is not supported: terminate TLS in front of HAProxy"),
        ("--allow-http=maybe", "--allow-http must be true or false, not 'maybe'"),
    ],
)
def test_a_tritonserver_flag_this_server_cannot_honour_stops_the_start(flag: str, message: str) -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    with pytest.raises(SettingsError, match=message):
        unapplied_flags(parser.parse_args(["serve", "/m", flag]))


async def test_the_server_metadata_carries_the_server_id() -> None:
    controller = ModelController(ServerSettings("/r"), _Deployer())
    assert (await ModelDataPlane(controller, Router()).server_metadata())["name"] == "triton"
    named = ModelDataPlane(controller, Router(), server_name="edge-7")
    assert (await named.server_metadata())["name"] == "edge-7"


class _Deployer:
    def __init__(self) -> None:
        self.deployed: list[str] = []

    def prepare(self, models: dict[str, ModelDescription]) -> None:
        pass

    async def deploy(self, model: ModelDescription) -> None:
        self.deployed.append(model.name)

    async def delete(self, name: str) -> None:
        pass

    def needs_gpu(self, model: ModelDescription) -> bool:
        return False

    async def running(self) -> dict[str, ModelDescription]:
        return dict(getattr(self, "already_running", {}))

    async def unserved(self) -> dict[str, str]:
        return {}

    async def unloaded(self) -> set[str]:
        return set()

    async def record_unloaded(self, name: str, unloaded: bool) -> None:
        pass


def _model(name: str) -> ModelDescription:
    spec = TensorSpec("x", "FP32", (4,))
    return ModelDescription(
        name=name, path=Path("/r") / name, platform="", backend="python", max_batch_size=0,
        inputs=(spec,), outputs=(spec,), versions=(1, 3),
    )  # fmt: skip


class _Remote:
    def __init__(self, model: ModelDescription) -> None:
        self.description = model

    def is_ready(self, version: str = "") -> bool:
        return True

    def metadata(self, version: str = "") -> dict[str, Any]:
        return {"name": self.description.name}

    def config(self, version: str = "") -> dict[str, Any]:
        return {}

    async def infer(self, request: Any) -> Any:
        raise NotImplementedError

    async def statistics(self, version: str = "") -> list[dict[str, Any]]:
        return [{"name": self.description.name}]


async def test_the_server_data_plane_is_the_one_data_plane_over_the_controller() -> None:
    controller = ModelController(ServerSettings("/r", "explicit"), _Deployer(), remote=_Remote)
    controller.entries = {}
    await controller._load(_model("up"))
    controller.entries["down"] = controller.entries["up"].__class__("down", ModelState.UNAVAILABLE, "broken")
    plane: DataPlane = ModelDataPlane(controller, Router())
    assert isinstance(plane, DataPlane)
    assert await plane.model_ready("up") and not await plane.model_ready("down")
    assert await plane.model_metadata("up") == {"name": "up"}
    assert await plane.model_statistics() == {"model_stats": [{"name": "up"}]}
    with pytest.raises(NotFound, match="Request for unknown model: .down. has no available versions"):
        await plane.model_metadata("down")
    with pytest.raises(NotFound, match="Request for unknown model: 'gone' is not found"):
        await plane.model_ready("gone")
    assert not await plane.ready()
    with pytest.raises(Unavailable, match="not allowed if polling is enabled"):
        await ModelDataPlane(ModelController(ServerSettings("/r"), _Deployer()), Router()).load_model(
            "up", {}
        )


async def test_server_and_models_are_ready_only_once_every_front_end_answers() -> None:
    controller = ModelController(ServerSettings("/r", "explicit"), _Deployer(), remote=_Remote)
    controller.entries = {}
    controller.started = True
    await controller._load(_model("up"))
    answering = [False]  # gRPC not taken up yet
    plane = ModelDataPlane(controller, Router(), front_ends_ready=lambda: answering[0])
    assert not await plane.ready() and not await plane.model_ready("up")
    answering[0] = True
    assert await plane.ready() and await plane.model_ready("up")


def test_tritons_delay_scheduler_variable_is_read_from_the_environment() -> None:
    from deployments.settings import SettingsError

    args = {"model_repository": "/models"}
    assert ServerSettings.from_args(args, {}).delay_scheduler == 0
    assert ServerSettings.from_args(args, {"TRITONSERVER_DELAY_SCHEDULER": "3"}).delay_scheduler == 3
    with pytest.raises(SettingsError, match="TRITONSERVER_DELAY_SCHEDULER must be a int"):
        ServerSettings.from_args(args, {"TRITONSERVER_DELAY_SCHEDULER": "many"})
