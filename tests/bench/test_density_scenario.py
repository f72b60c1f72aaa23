"""The density scenario's model repositories: Python, ONNX or both, as a Triton user writes them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from bench.scenarios import density
from bench.scenarios.common import make_repository, new_report
from repository_loader.plan import HostPolicy, pooled
from repository_loader.repository import load_repository


def test_the_onnx_identity_answers_its_input_and_is_pooled_on_a_host(tmp_path: Path) -> None:
    folder = density.onnx_identity(tmp_path / "templates" / "identity_onnx")
    session = onnxruntime.InferenceSession(str(folder / "1" / "model.onnx"))
    data = np.arange(32, dtype=np.float32).reshape(2, 16)
    (out,) = session.run(["OUTPUT0"], {"INPUT0": data})
    np.testing.assert_array_equal(out, data)
    repo = make_repository(tmp_path / "repo", [(folder, "m000", None)])
    state = load_repository(repo)
    model = state.models["m000"]
    assert not state.failed and model.backend == "onnxruntime"
    assert model.instance_groups == ()  # no instance_group, as most repositories have it
    assert pooled(model, HostPolicy(replicas=1))


def test_mixed_repositories_take_the_two_models_in_turn(tmp_path: Path) -> None:
    chosen = density.sources("mixed", 4, tmp_path)
    assert [name for _, name in chosen] == ["m000", "m001", "m002", "m003"]
    assert [source.name for source, _ in chosen] == ["identity_py", "identity_onnx"] * 2
    assert {source.name for source, _ in density.sources("python", 3, tmp_path)} == {"identity_py"}
    with pytest.raises(ValueError, match="BENCH_DENSITY_KIND must be one of python, onnx, mixed"):
        density.sources("tensorflow", 1, tmp_path)


def test_a_scenarios_command_carries_the_bench_variables_it_ran_with(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_DENSITY_KIND", "onnx")
    monkeypatch.setenv("BENCH_DENSITY_SERVERS", "this")
    monkeypatch.setattr("sys.argv", ["bench", "scenario", "density"])
    command = new_report("density").environment["command"]
    assert command.startswith(
        "BENCH_DENSITY_KIND=onnx BENCH_DENSITY_SERVERS=this python -m bench scenario density"
    )
