"""POLL mode on servers of their own, started as a user starts them (``serve run`` on a config file):
a local repository (with Triton's restricted API on), and an ``s3://`` repository on the local S3
server. Each change kind is picked up within ``repository_poll_secs`` while a steady client loop
on a model that keeps serving loses nothing."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml
from tritonclient.utils import InferenceServerException

from tests.loader.s3_server import running_s3_server, upload_tree
from tests.serve.standalone import Server
from tests.serve.test_model_control_e2e import config, get_status, infer, steady_load, write_model

pytestmark = pytest.mark.serve

RULE = "model-repository:admin-key=secret"
GRPC_RULE = "model-repository,health:admin-key=secret"  # the server's own readiness probe sends it too


def eventually(check: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except Exception as exc:  # not there yet
            last = exc
        time.sleep(0.25)
    raise AssertionError(f"not within {timeout_s}s: {last!r}")


def _bucket(s3: Any, bucket_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``bucket_copy`` uploaded as ``s3://<s3>/models/repo``; no AWS setting of this machine's leaks in."""
    s3.client().create_bucket(Bucket="models")
    upload_tree(s3, bucket_copy, "models", "repo")
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(key, raising=False)


def _grpc_port(server: Server) -> int:
    return int(yaml.safe_load(server.config.read_text())["applications"][0]["args"]["grpc_port"])


def test_poll_over_a_local_and_an_s3_repository_with_the_restricted_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, bucket_copy = tmp_path / "repo", tmp_path / "bucket"
    write_model(repo, "p_a")
    write_model(bucket_copy, "s3_a")
    with running_s3_server(tmp_path) as s3:
        _bucket(s3, bucket_copy, monkeypatch)
        for key, value in s3.env().items():  # the server reads its credentials from the environment
            monkeypatch.setenv(key, value)
        args = {
            "model_repository": [str(repo), f"s3://{s3.hostport}/models/repo"],  # Triton's endpoint form
            "model_control_mode": "poll",
            "repository_poll_secs": 1,
            "http_restricted_api": RULE,
            "grpc_restricted_api": GRPC_RULE,
        }
        server = Server(repo, args=args)
        try:
            server.wait_ready(["p_a", "s3_a"])
            _check_poll(server, repo, bucket_copy, lambda: upload_tree(s3, bucket_copy, "models", "repo"))
        finally:
            assert server.stop() == set()
            shutil.rmtree(server.tmp, ignore_errors=True)


def _check_poll(server: Server, repo: Path, bucket_copy: Path, upload: Callable[[], None]) -> None:
    url = server.url.removeprefix("http://")
    client = httpclient.InferenceServerClient(url)
    assert infer(client, "s3_a") == (1.0, "1")
    with steady_load(url, "p_a") as load:
        write_model(repo, "p_b")  # a new model folder
        eventually(lambda: get_status(url, "/v2/models/p_b/ready") == 200)
        write_model(repo, "p_a", (1, 2))  # a new version folder
        eventually(lambda: infer(client, "p_a") == (2.0, "2"))
        (repo / "p_b" / "config.pbtxt").write_text(config("p_b", max_batch=4))  # an edited config
        eventually(lambda: client.get_model_config("p_b")["max_batch_size"] == 4)
        write_model(repo, "p_a", (1, 2), factor=10)  # a changed model file
        eventually(lambda: infer(client, "p_a") == (20.0, "2"))
        shutil.rmtree(repo / "p_a" / "2")  # a removed version folder
        eventually(lambda: infer(client, "p_a") == (10.0, "1"))
        shutil.rmtree(repo / "p_b")  # a removed model folder
        eventually(lambda: get_status(url, "/v2/models/p_b/ready") != 200)
        write_model(bucket_copy, "s3_a", (1, 2))  # on the object store: a new version, a new model
        write_model(bucket_copy, "s3_b")
        upload()
        eventually(lambda: infer(client, "s3_a") == (2.0, "2"))
        eventually(lambda: get_status(url, "/v2/models/s3_b/ready") == 200)
    assert load.failures == [], load.failures[:5]
    assert load.ok > 50

    # the restricted API: the repository group needs the header, other groups do not
    with pytest.raises(InferenceServerException, match="restricted"):
        client.get_model_repository_index()
    rows = client.get_model_repository_index(headers={"admin-key": "secret"})
    assert sorted({m["name"] for m in rows}) == ["p_a", "s3_a", "s3_b"]
    assert client.is_server_live() and client.is_server_ready()
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{_grpc_port(server)}")
    with pytest.raises(InferenceServerException, match="restricted"):
        grpc.get_model_repository_index(headers={"admin-key": "secret"})  # gRPC: Triton's prefix
    admin = {"triton-grpc-protocol-admin-key": "secret"}
    index = grpc.get_model_repository_index(headers=admin)
    assert sorted({m.name for m in index.models}) == ["p_a", "s3_a", "s3_b"]
    assert grpc.is_model_ready("p_a", headers=admin)
    with pytest.raises(InferenceServerException, match="restricted"):
        grpc.is_server_live()  # health is restricted over gRPC (not over HTTP)
    assert grpc.is_server_live(headers=admin)
    grpc.close()

    # a name in two repositories is an error for that name; the others serve on
    write_model(bucket_copy, "p_a")
    upload()
    eventually(lambda: get_status(url, "/v2/models/p_a/ready") != 200)
    assert not client.is_server_ready() and client.is_model_ready("s3_a")
    client.close()


def _ensemble(repo: Path, name: str, step: str) -> None:
    """An ensemble of one step with its step model's tensors (``INPUT0`` / ``OUTPUT0``)."""
    (repo / name / "1").mkdir(parents=True)
    tensors = config(name).split("\n")[3:5]
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 8\n' + "\n".join(tensors) + "\n"
        f'ensemble_scheduling {{ step [ {{ model_name: "{step}" model_version: -1 '
        'input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "OUTPUT0" } } ] }\n'
    )


def test_triton_serve_serves_an_s3_repository_with_poll_and_model_namespacing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``triton-serve serve s3://host:port/bucket/path --model-repository <local> --model-control-mode poll
    --model-namespacing=true``, as a user types it: a model in both repositories is a model in each,
    the local ensemble runs the local copy, the plain name is ambiguous until one copy leaves."""
    from bench.scenarios.common import free_port, start_this_server

    bucket_copy, local = tmp_path / "bucket", tmp_path / "local"
    write_model(bucket_copy, "s3_cli")
    write_model(bucket_copy, "dup")
    write_model(local, "dup", factor=10)
    _ensemble(local, "pipe", "dup")
    with running_s3_server(tmp_path) as s3:
        _bucket(s3, bucket_copy, monkeypatch)
        args = ["--model-control-mode", "poll", "--repository-poll-secs", "1"]
        args += ["--model-repository", str(local), "--model-namespacing=true"]
        handle = start_this_server(
            f"s3://{s3.hostport}/models/repo",  # type: ignore[arg-type]
            free_port(),
            grpc_port=free_port(),
            env=s3.env(),
            extra_args=args,
            log_path=tmp_path / "server.log",
        )
        with handle:  # ready: its repository loaded from the object store
            client = httpclient.InferenceServerClient(handle.url)
            assert infer(client, "s3_cli") == (1.0, "1")
            assert infer(client, "pipe") == (10.0, "1")  # the ensemble's own repository's copy
            with pytest.raises(
                InferenceServerException, match="identifiers of model 'dup'.*ambiguity"
            ) as err:
                infer(client, "dup")
            assert err.value.status() == "400"
            names = [m["name"] for m in client.get_model_repository_index()]
            assert sorted(names) == ["dup", "dup", "pipe", "s3_cli"]
            write_model(bucket_copy, "s3_cli", (1, 2))  # a new version on the object store
            upload_tree(s3, bucket_copy, "models", "repo")
            eventually(lambda: infer(client, "s3_cli") == (2.0, "2"))
            shutil.rmtree(local / "dup")  # one copy left: the name is the object store's model
            eventually(lambda: infer(client, "dup") == (1.0, "1"))
            eventually(lambda: infer(client, "pipe") == (1.0, "1"))
            client.close()
    # a SIGTERM stops it as Ctrl-C does: before, Ray's failure-signal handler printed a stack trace
    log = (tmp_path / "server.log").read_text(errors="replace")
    assert handle.process.returncode == 0 and "shutting down" in log, log[-2000:]
    assert "SIGTERM received" not in log, log[-2000:]
