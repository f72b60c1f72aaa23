"""The triton-serve validate command: output, JSON, exit codes, and no tracebacks on bad input."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from deployments.cli import build_parser, main

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
    assert "FAIL  bad" in out and "'max_batch_size' must be non-negative value for bad" in out
    assert "OK    good  version 2" in out and "x4 on GPU(s) [0, 1]" in out


def test_json_output(mixed_repo: Path, capsys) -> None:
    assert main(["validate", str(mixed_repo), "--json", "--cpus", "4", "--gpus", "2"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    assert report["models"]["bad"]["state"] == "UNAVAILABLE"
    good = report["models"]["good"]
    assert good["state"] == "READY" and good["versions"] == [2]
    assert good["plan"][0]["num_replicas"] == 4 and good["plan"][0]["num_gpus_per_replica"] == 0.5


def test_each_instance_group_is_printed_as_its_own_deployment(repo: Path, write_model, capsys) -> None:
    groups = (
        "instance_group [ { name: 'c' kind: KIND_CPU count: 2 }, { name: 'g' kind: KIND_GPU gpus: [1] } ]"
    )
    write_model("m", TORCH_IO + groups, {"1/model.pt": b""})
    assert main(["validate", str(repo), "--cpus", "4", "--gpus", "2"]) == 0
    out = capsys.readouterr().out
    assert "      c: KIND_CPU x2 (ranks 0-1 of the model's 3), " in out and "route /v2/models/m," in out
    assert "      g: KIND_GPU x1 on GPU(s) [1] (ranks 2-2 of the model's 3), " in out
    assert "route /v2/-/instance-groups/model-m--group-1," in out
    assert main(["validate", str(repo), "--json", "--cpus", "4", "--gpus", "2"]) == 0
    plan = json.loads(capsys.readouterr().out)["models"]["m"]["plan"]
    assert [(e["group"], e["group_index"], e["rank_offset"], e["model_replicas"]) for e in plan] == [
        ("c", 0, 0, 3),
        ("g", 1, 2, 3),
    ]
    assert [e["num_gpus_per_replica"] for e in plan] == [0.0, 1.0]


def test_a_passive_group_is_printed_after_the_others_and_unranked(repo: Path, write_model, capsys) -> None:
    groups = "instance_group [ { name: 'p' kind: KIND_CPU count: 1 passive: true }, { name: 'c' kind: KIND_CPU count: 2 } ]"
    write_model("m", TORCH_IO + groups, {"1/model.pt": b""})
    assert main(["validate", str(repo), "--cpus", "4", "--gpus", "0"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("      ")]
    assert lines[0].startswith("      c: KIND_CPU x2, ") and "route /v2/models/m," in lines[0]
    assert lines[1].startswith("      p: KIND_CPU x1 (passive: loaded, takes no requests), ")
    assert "route /v2/-/instance-groups/model-m--passive-1," in lines[1]


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


def test_one_command_validates_and_serves() -> None:
    """``triton-serve`` (the script pyproject installs) is deployments.cli, with serve's subcommands."""
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '\ntriton-serve = "deployments.cli:main"\n' in pyproject
    parser = build_parser()
    assert parser.parse_args(["validate", "repo"]).func.__name__ == "run_validate"
    assert parser.parse_args(["serve", "repo"]).func.__module__ == "deployments.serve.cli"
    assert parser.parse_args(["ray-start"]).func.__module__ == "deployments.serve.cli"


def test_ray_start_passes_every_word_to_ray_start_options_first_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """``triton-serve ray-start --head --port=6379`` as the README prints it (argparse alone refused options
    before the remainder)."""
    from deployments import cli
    from deployments.serve import launch

    seen: list[list[str]] = []
    monkeypatch.setattr(launch, "main", lambda words: seen.append(list(words)) or 0)
    assert cli.main(["ray-start", "--head", "--port=6379", "--disable-usage-stats"]) == 0
    assert seen == [["ray-start", "--head", "--port=6379", "--disable-usage-stats"]]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deployments", *args],
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
    assert report["models"]["text_recognition"]["placement"]["hosted_group"] == "cpu"


def _ensemble(steps: list[tuple[str, str, str]], parameters: dict[str, str] | None = None) -> str:
    """An ensemble over models with input x and output y: steps are (model, reads, writes)."""
    step_text = ",\n".join(
        f'{{ model_name: "{m}" model_version: -1 input_map {{ key: "x" value: "{src}" }} '
        f'output_map {{ key: "y" value: "{dst}" }} }}'
        for m, src, dst in steps
    )
    params = "".join(
        f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'
        for k, v in (parameters or {}).items()
    )
    return f"""
        platform: "ensemble"
        max_batch_size: 8
        input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        ensemble_scheduling {{ step [ {step_text} ] }}
        {params}
    """


@pytest.fixture
def chain_repo(repo: Path, write_model) -> Path:
    """a -> b on the CPU, c on a GPU; ensembles over them are added by each test."""
    for name in ("a", "b"):
        write_model(name, TORCH_IO + "instance_group [ { kind: KIND_CPU } ]", {"1/model.pt": b""})
    write_model("c", TORCH_IO + "instance_group [ { kind: KIND_GPU } ]", {"1/model.pt": b""})
    return repo


def test_ensemble_placement_is_printed_under_its_plan(chain_repo: Path, write_model, capsys) -> None:
    write_model("e", _ensemble([("a", "IN", "mid"), ("b", "mid", "OUT")]), {"1/": b""})
    assert main(["validate", str(chain_repo), "--cpus", "4", "--gpus", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    first = lines.index("OK    e  version 1  [ensemble, max_batch_size 8]")
    assert lines[first + 1].startswith("      ensemble: ensemble x1")
    assert lines[first + 2 : first + 6] == [
        "      ensemble 'e': placement colocate",
        "        group 'cpu' on cpu: a v1, b v1",
        "        the ensemble's replica hosts group 'cpu': every step runs in it",
        "        a -> b: 'mid' in process (DLPack, zero copy)",
    ]


def test_ensemble_placement_in_json(chain_repo: Path, write_model, capsys) -> None:
    write_model("e", _ensemble([("a", "IN", "mid"), ("c", "mid", "OUT")]), {"1/": b""})
    write_model(
        "apart", _ensemble([("a", "IN", "mid"), ("b", "mid", "OUT")], {"placement": "separate"}), {"1/": b""}
    )
    assert main(["validate", str(chain_repo), "--json", "--cpus", "4", "--gpus", "1"]) == 0
    models = json.loads(capsys.readouterr().out)["models"]
    placement = models["e"]["placement"]
    assert placement["mode"] == "colocate" and placement["hosted_group"] is None
    assert [(g["name"], g["hosted"]) for g in placement["groups"]] == [("cpu", False), ("gpu", False)]
    assert placement["edges"] == [{"tensor": "mid", "producer": "a", "consumer": "c", "route": "http"}]
    assert models["apart"]["placement"]["hosted_group"] is None
    assert {g["name"] for g in models["apart"]["placement"]["groups"]} == {"a", "b"}
    assert "placement" not in models["a"]


def test_bad_placement_parameters_fail_that_ensemble_alone(chain_repo: Path, write_model, capsys) -> None:
    write_model("spread", _ensemble([("a", "IN", "OUT")], {"placement": "spread"}), {"1/": b""})
    write_model("ghost", _ensemble([("a", "IN", "OUT")], {"placement.z": "g"}), {"1/": b""})
    write_model("fine", _ensemble([("a", "IN", "mid"), ("b", "mid", "OUT")]), {"1/": b""})
    assert main(["validate", str(chain_repo), "--cpus", "4", "--gpus", "1"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  spread" in out and "FAIL  ghost" in out and "OK    fine  version 1" in out
    assert (
        "in ensemble 'spread', parameter 'placement' is 'spread'; expected one of colocate, separate" in out
    )
    assert "in ensemble 'ghost', parameter 'placement.z' names model 'z', which is not a step" in out
    assert "4 model(s) OK, 2 failed" in out
    assert main(["validate", str(chain_repo), "--json", "--cpus", "4", "--gpus", "1"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    assert (
        report["models"]["ghost"]["state"] == "UNAVAILABLE" and "placement" not in report["models"]["ghost"]
    )
    assert report["models"]["fine"]["state"] == "READY"
