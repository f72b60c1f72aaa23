"""The triton-serve validate command: output, JSON, exit codes, and no tracebacks on bad input."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from repository_loader.cli import build_parser, main

from .conftest import TORCH_IO


@pytest.fixture
def mixed_repo(repo: Path, write_model) -> Path:
    write_model(
        "good",
        TORCH_IO + "instance_group [ { kind: KIND_GPU count: 2 } ]",
        {"1/model.pt": b"", "2/model.pt": b""},
    )
    write_model("bad", TORCH_IO.replace("max_batch_size: 8", "max_batch_size: -1"), {"1/model.pt": b""})
    return repo


def test_all_ok_exits_zero_and_prints_the_plan(repo: Path, write_model, capsys) -> None:
    write_model("m", TORCH_IO + "version_policy { all { } }", {"1/model.pt": b"", "2/model.pt": b""})
    assert main(["validate", str(repo), "--cpus", "2", "--gpus", "0"]) == 0
    out = capsys.readouterr().out
    assert "OK    m  version 1" in out and "OK    m  version 2" in out
    assert "route /v2/models/m" in out and "KIND_CPU" in out


def test_failures_exit_non_zero_and_list_every_error(mixed_repo: Path, capsys) -> None:
    assert main(["validate", str(mixed_repo), "--cpus", "4", "--gpus", "2"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  bad" in out and "max_batch_size: must be >= 0, got -1" in out
    assert "OK    good  version 2" in out and "x4 on GPU(s) [0, 1]" in out


def test_json_output(mixed_repo: Path, capsys) -> None:
    assert main(["validate", str(mixed_repo), "--json", "--cpus", "4", "--gpus", "2"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    assert report["models"]["bad"]["state"] == "UNAVAILABLE"
    good = report["models"]["good"]
    assert good["state"] == "READY" and good["versions"] == [2]
    assert good["plan"][0]["num_replicas"] == 4 and good["plan"][0]["num_gpus_per_replica"] == 0.5


def test_plan_problem_fails_validation(repo: Path, write_model, capsys) -> None:
    write_model("m", TORCH_IO + "instance_group [ { kind: KIND_GPU } ]", {"1/model.pt": b""})
    assert main(["validate", str(repo), "--gpus", "0"]) == 1
    assert "the cluster has none" in capsys.readouterr().out


def test_switches_reach_the_loader(repo: Path, write_model, capsys) -> None:
    write_model(
        "m",
        TORCH_IO,
        {"1/model.pt": b"", "configs/big.pbtxt": TORCH_IO.replace("max_batch_size: 8", "max_batch_size: 64")},
    )
    write_model("bare", None, {"1/model.pt": b""})
    main(["validate", str(repo), "--model-config-name", "big", "--disable-auto-complete-config", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["models"]["m"]["plan"][0]["batching"]["max_batch_size"] == 64
    assert "auto-complete is disabled" in report["models"]["bare"]["errors"][0]


def test_missing_repository(tmp_path: Path, capsys) -> None:
    assert main(["validate", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err


def test_parser_has_room_for_more_commands() -> None:
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args([])


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "repository_loader", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )


def test_bad_input_never_shows_a_traceback(repo: Path, write_model, tmp_path: Path) -> None:
    write_model(
        "syntax", 'backend: "pytorch"\nmax_batch_size: 8\ninput [ { name: "x" \n', {"1/model.pt": b""}
    )
    write_model("notonnx", None, {"1/model.onnx": b"\x00garbage"})
    write_model("binary", None, {"config.pbtxt": b"\xff\xfe", "1/model.pt": b""})
    result = _run("validate", str(repo), "--cpus", "2", "--gpus", "0")
    assert result.returncode == 1
    assert "Traceback" not in result.stdout + result.stderr
    assert re.search(r"syntax/config\.pbtxt:\d+:\d+: syntax error", result.stdout)  # file, line and column
    assert "is not a valid ONNX model" in result.stdout
    assert "not UTF-8" in result.stdout
    missing = _run("validate", str(tmp_path / "missing"))
    assert (
        missing.returncode == 2 and "Traceback" not in missing.stderr and "does not exist" in missing.stderr
    )


EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "model_repository"


@pytest.mark.skipif(not EXAMPLES.is_dir(), reason="the example repository is not present")
def test_example_repository_validates(pb_utils_importable, capsys) -> None:
    assert main(["validate", str(EXAMPLES), "--cpus", "2", "--gpus", "0", "--json"]) == 0, (
        capsys.readouterr().out
    )
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["models"]
    assert report["total_cpus"] <= 2
