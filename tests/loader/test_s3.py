"""s3:// repositories against a real S3-compatible server (moto's server mode, in a subprocess).

The bundled example repository plus a model with a large ONNX file (tens of MB, uploaded in
parts) is uploaded once; each test reads it through the loader exactly as a user would, with
the credentials and region in the environment and the endpoint written as Triton writes it
(``s3://host:port/bucket/path``). The server refuses unsigned or wrongly signed requests.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from repository_loader import load_model, load_repository
from repository_loader.errors import ConfigError, NotFound
from repository_loader.model import ModelDescription
from repository_loader.storage import repository_snapshot

from .s3_server import S3Server, running_s3_server, upload_tree

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

PROJECT = Path(__file__).resolve().parents[2]
EXAMPLES = PROJECT / "examples" / "model_repository"
BUCKET = "triton-models"
BIG_ELEMENTS = 10_000_000  # FP32: a 40 MB model file


def _big_onnx(elements: int, seed: int) -> bytes:
    """An ONNX model adding a large constant to its input: ``y = x + w``, ``w`` of ``elements`` floats."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weights = np.random.default_rng(seed).random(elements, dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", elements])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", elements])],
        [numpy_helper.from_array(weights, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


@pytest.fixture(scope="module")
def local_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example repository plus ``big_onnx`` (no config: auto-completed from the file; version 1
    small, version 2 large, the default policy selecting only 2)."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    root = tmp_path_factory.mktemp("local") / "models"
    shutil.copytree(EXAMPLES, root, ignore=shutil.ignore_patterns("__pycache__", "README.md"))
    (root / "big_onnx" / "1").mkdir(parents=True)
    (root / "big_onnx" / "2").mkdir()
    (root / "big_onnx" / "1" / "model.onnx").write_bytes(_big_onnx(16, seed=1))
    (root / "big_onnx" / "2" / "model.onnx").write_bytes(_big_onnx(BIG_ELEMENTS, seed=2))
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, local_repo: Path) -> Iterator[S3Server]:
    with running_s3_server(tmp_path_factory.mktemp("moto")) as running:
        running.client().create_bucket(Bucket=BUCKET)
        upload_tree(running, local_repo, BUCKET, "models")
        yield running


@pytest.fixture
def aws_env(server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(key, raising=False)
    for key, value in server.env().items():
        monkeypatch.setenv(key, value)
    return server


def _url(server: S3Server, path: str = "models") -> str:
    return f"s3://{server.hostport}/{BUCKET}/{path}"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _without_path(model: ModelDescription) -> ModelDescription:
    return dataclasses.replace(model, path=Path("."))


def test_repository_from_s3_matches_the_local_one(
    aws_env: S3Server, local_repo: Path, tmp_path: Path
) -> None:
    local = load_repository(local_repo)
    remote = load_repository(_url(aws_env), cache_dir=tmp_path)
    assert remote.root == _url(aws_env)
    assert sorted(remote.models) == sorted(local.models) and "big_onnx" in remote.models
    assert sorted(remote.failed) == sorted(local.failed)
    for name, model in remote.models.items():
        assert _without_path(model) == _without_path(local.models[name]), name
        assert model.config_json == local.models[name].config_json, name
        assert model.path.is_relative_to(tmp_path) and model.path.name == name
        for version in model.versions:
            if not model.is_ensemble:
                original = local.models[name].model_file(version)
                assert _sha256(model.model_file(version)) == _sha256(original), (name, version)


def test_large_model_file_is_copied_whole_and_only_selected_versions(
    aws_env: S3Server, tmp_path: Path
) -> None:
    model = load_model(_url(aws_env), "big_onnx", cache_dir=tmp_path)
    assert model.versions == (2,)
    assert [t.name for t in model.inputs] == ["x"] and list(model.inputs[0].dims)[-1] == BIG_ELEMENTS
    copied = model.model_file(2)
    assert copied.stat().st_size > 40_000_000
    assert hashlib.sha256(copied.read_bytes()).digest() == hashlib.sha256(_big_onnx(BIG_ELEMENTS, 2)).digest()
    assert not (model.path / "1").exists()  # not selected by the version policy: not downloaded


def test_copy_is_reused_and_a_changed_file_gets_a_new_folder(aws_env: S3Server, tmp_path: Path) -> None:
    url = _url(aws_env, "reuse")
    upload_tree(aws_env, EXAMPLES / "identity_fp32", BUCKET, "reuse/identity_fp32")
    first = load_model(url, "identity_fp32", cache_dir=tmp_path)
    stamp = first.model_file(1).stat().st_mtime_ns
    again = load_model(url, "identity_fp32", cache_dir=tmp_path)
    assert again.path == first.path and again.model_file(1).stat().st_mtime_ns == stamp

    source = (EXAMPLES / "identity_fp32" / "1" / "model.py").read_text()
    aws_env.client().put_object(
        Bucket=BUCKET, Key="reuse/identity_fp32/1/model.py", Body=(source + "\n# edited\n").encode()
    )
    changed = load_model(url, "identity_fp32", cache_dir=tmp_path)
    assert changed.path != first.path and changed.model_file(1).read_text().endswith("# edited\n")
    assert first.model_file(1).read_text() == source  # a replica still running the old copy keeps it
    assert not list(tmp_path.rglob(".partial-*"))


def test_credentials_come_from_the_environment(
    aws_env: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(ConfigError, match="signature .* does not match.*credentials"):
        load_repository(_url(aws_env), cache_dir=tmp_path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWN")
    with pytest.raises(ConfigError, match="Access Key Id .* does not exist.*credentials"):
        load_repository(_url(aws_env), cache_dir=tmp_path)


def test_endpoint_from_the_environment(
    aws_env: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", aws_env.endpoint)
    model = load_model(f"s3://{BUCKET}/models", "add_sub", cache_dir=tmp_path, auto_complete=False)
    assert model.model_file(1).is_file()


def test_url_that_went_through_pathlib_still_names_the_bucket(aws_env: S3Server, tmp_path: Path) -> None:
    state = load_repository(Path(_url(aws_env)), cache_dir=tmp_path, auto_complete=False)
    assert state.root == _url(aws_env) and "identity_fp32" in state.models


def test_missing_repository_or_bucket(aws_env: S3Server, tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="does not exist"):
        load_repository(_url(aws_env, "nothing/here"), cache_dir=tmp_path)
    with pytest.raises(NotFound, match="does not exist"):
        load_repository(f"s3://{aws_env.hostport}/no-such-bucket/models", cache_dir=tmp_path)
    with pytest.raises(NotFound, match="not in the repository"):
        load_model(_url(aws_env), "nope", cache_dir=tmp_path)


def test_snapshot_shows_what_a_poller_compares(aws_env: S3Server, local_repo: Path) -> None:
    remote, local = repository_snapshot(_url(aws_env)), repository_snapshot(local_repo)
    assert {m: sorted(files) for m, files in remote.items()} == {
        m: sorted(files) for m, files in local.items()
    }
    aws_env.client().put_object(Bucket=BUCKET, Key="models/add_sub/7/model.py", Body=b"# new version\n")
    try:
        after = repository_snapshot(_url(aws_env))
    finally:
        aws_env.client().delete_object(Bucket=BUCKET, Key="models/add_sub/7/model.py")
    changed = sorted(m for m in after if after[m] != remote.get(m))
    assert changed == ["add_sub"] and "7/model.py" in after["add_sub"] and "7/" in after["add_sub"]


def _validate(repository: str, env: dict[str, str]) -> dict[str, object]:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "deployments",
            "validate",
            repository,
            "--json",
            "--cpus",
            "8",
            "--gpus",
            "0",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=PROJECT,
        timeout=120,
    )
    assert result.returncode in (0, 1), result.stderr
    assert "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    assert isinstance(report, dict)
    return report


def test_validate_command_reads_s3(aws_env: S3Server, local_repo: Path, tmp_path: Path) -> None:
    env = {**os.environ, "TRITON_AWS_MOUNT_DIRECTORY": str(tmp_path)}
    remote, local = _validate(_url(aws_env), env), _validate(str(local_repo), env)
    assert remote["repository"] == _url(aws_env)
    assert remote["ok"] == local["ok"]
    remote_models, local_models = remote["models"], local["models"]
    assert isinstance(remote_models, dict) and isinstance(local_models, dict)
    assert {m: r["state"] for m, r in remote_models.items()} == {
        m: r["state"] for m, r in local_models.items()
    }
    ready = [m for m, r in remote_models.items() if r["state"] == "READY"]
    assert "big_onnx" in ready
    assert all(remote_models[m]["plan"] == local_models[m]["plan"] for m in ready)
    assert any(tmp_path.iterdir())  # the copies went to Triton's mount-directory variable
