"""perf_analyzer command lines, load splitting and variant model configs (nothing is started)."""

import pytest

from bench.__main__ import parse_levels
from bench.loadgen import split_level
from bench.peers import perf_analyzer_cmd
from bench.scenarios.batching import CONFIGS
from bench.scenarios.common import EXAMPLES, make_repository, read_config
from bench.scenarios.overhead import ratios


def test_perf_analyzer_command_line():
    cmd = perf_analyzer_cmd(
        "crnn", "localhost:8000", [2, 4, 6], batch_size=2, csv_path="/t/x.csv", shapes=["IMAGE:32,100"]
    )
    joined = " ".join(cmd)
    assert "--concurrency-range 2:6:2" in joined
    assert "-b 2" in joined and "--shape IMAGE:32,100" in joined and "-f /t/x.csv" in joined
    rate = perf_analyzer_cmd("m", "h:1", request_rate=[100.0])
    assert "--request-rate-range" in rate and "100:100" in rate
    with pytest.raises(ValueError):
        perf_analyzer_cmd("m", "h:1", [1, 2, 8])


def test_levels_and_split():
    assert parse_levels("2:16:2") == [2, 4, 6, 8, 10, 12, 14, 16]
    assert parse_levels("1,8,32") == [1, 8, 32]
    assert split_level(5, 2) == [3, 2]
    assert split_level(1, 2) == [1]
    assert split_level(100.5, 2) == [50.25, 50.25]


def test_ratios_only_where_both_have_the_level():
    assert ratios({1.0: 50.0, 2.0: 90.0}, {1.0: 100.0, 4.0: 1.0}) == {"1": 0.5}


@pytest.mark.skipif(not (EXAMPLES / "crnn").exists(), reason="example CRNN model not present")
def test_batching_variants_rewrite_the_example_config(tmp_path):
    models = [(EXAMPLES / "crnn", f"crnn_{i}", edit) for i, (_, edit, _) in enumerate(CONFIGS)]
    repo = make_repository(tmp_path / "repo", models)
    configs = [read_config(repo / f"crnn_{i}" / "config.pbtxt") for i in range(4)]
    assert [c.name for c in configs] == ["crnn_0", "crnn_1", "crnn_2", "crnn_3"]
    assert not configs[0].HasField("dynamic_batching")
    assert all(c.HasField("dynamic_batching") for c in configs[1:])
    assert [c.instance_group[0].count for c in configs] == [1, 1, 2, 2]
    assert configs[3].dynamic_batching.max_queue_delay_microseconds == 10
    assert (repo / "crnn_0" / "1" / "model.onnx").exists()


@pytest.mark.skipif(not (EXAMPLES / "crnn").exists(), reason="example CRNN model not present")
def test_the_configuration_without_dynamic_batching_is_served_without_it(tmp_path):
    from repository_loader.repository import load_repository

    label, edit, server_args = CONFIGS[0]
    repo = make_repository(tmp_path / "repo", [(EXAMPLES / "crnn", "crnn", edit)])
    served = load_repository(str(repo), auto_complete="--disable-auto-complete-config" not in server_args)
    completed = load_repository(str(repo), auto_complete=True)
    assert served.models["crnn"].dynamic_batching is None, label
    assert completed.models["crnn"].dynamic_batching is not None  # why the option is needed
