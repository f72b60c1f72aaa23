"""The served GPU-ensemble benchmark's repository: what ``validate`` says the server will do with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu_served import Settings, write_repository
from deployments.cli import main


def test_the_colocated_ensemble_runs_its_gpu_steps_in_process_and_the_separate_one_does_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_repository(tmp_path, Settings(rows=2, cols=3))
    assert main(["validate", str(tmp_path), "--json", "--cpus", "4", "--gpus", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    models = report["models"]
    assert models["chain_colocated"]["plan"][0]["num_gpus_per_replica"] > 0
    assert models["chain_separate"]["plan"][0]["num_gpus_per_replica"] == 0
    placements = {name: m["placement"] for name, m in models.items() if m.get("placement")}
    assert placements["chain_colocated"]["hosted_group"] == "gpu"
    assert [e["route"] for e in placements["chain_colocated"]["edges"]] == ["in_process"]
    assert placements["chain_separate"]["hosted_group"] is None
