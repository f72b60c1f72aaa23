"""The hand-off experiment runs end to end (on CPU here; the same code on a GPU)."""

from __future__ import annotations

import json

import pytest

from bench.gpu_pipeline import Settings, main, run_benchmark


@pytest.mark.parametrize("engine", ["onnxruntime", "torch"])
def test_both_modes_agree_and_are_timed(engine: str) -> None:
    s = Settings(
        device="cpu", engine=engine, batch=4, features=32, hidden=64, classes=20, iterations=6, warmup=1
    )
    result = run_benchmark(s)
    assert result["engine"] == engine and result["device"] == "cpu"
    assert result["results_match"] is True
    for mode in ("host_round_trip", "dlpack"):
        stats = result["modes"][mode]
        assert stats["iterations"] == 6
        assert stats["latency_p50_ms"] <= stats["latency_p99_ms"]
        assert stats["throughput_infer_per_s"] == pytest.approx(4 * stats["requests_per_s"])


def test_cli_writes_json(tmp_path, capsys) -> None:
    out = tmp_path / "result.json"
    main(
        [
            "--device",
            "cpu",
            "--batch",
            "2",
            "--features",
            "8",
            "--hidden",
            "8",
            "--classes",
            "6",
            "--iterations",
            "3",
            "--warmup",
            "1",
            "--rounds",
            "1",
            "--out",
            str(out),
        ]
    )
    written = json.loads(out.read_text())
    assert written == json.loads(capsys.readouterr().out)
    assert set(written["modes"]) == {"host_round_trip", "dlpack"}
