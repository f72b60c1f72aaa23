"""The pooled scenario's notes: the pooled model's throughput over the dedicated one's, per level."""

from __future__ import annotations

from bench.scenarios import pooled as scenario
from tests.bench.runs import run_of


def test_the_ratio_sums_both_rounds_of_each_model() -> None:
    runs = [
        run_of(f"{scenario.POOLED} (round 1)", {1: 900.0, 8: 2000.0}),
        run_of(f"{scenario.OWN} (round 1)", {1: 1000.0, 8: 2000.0}),
        run_of(f"{scenario.OWN} (round 2)", {1: 1000.0}),
        run_of(f"{scenario.POOLED} (round 2)", {1: 1100.0}),
    ]
    assert scenario.ratios(runs) == {"pooled_over_dedicated:1": 1.0, "pooled_over_dedicated:8": 1.0}


def test_the_dedicated_copy_asks_for_its_own_deployment() -> None:
    from repository_loader.plan import PLACEMENT_PARAMETER
    from repository_loader.proto import model_config_pb2

    config = model_config_pb2.ModelConfig()
    scenario._dedicated(config)
    assert config.parameters[PLACEMENT_PARAMETER].string_value == "dedicated"
