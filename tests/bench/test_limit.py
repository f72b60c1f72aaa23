"""The limit scenario's arithmetic: the direct throughput over the batch sizes the server formed."""

from __future__ import annotations

import pytest

from bench.scenarios.limit import bracketed, over_mix


def test_the_direct_limit_weighs_each_batch_size_by_its_executions_and_brackets_the_run():
    before = {2: (0.001, 0.002), 8: (0.002, 0.004)}
    after = {8: (0.004, 0.006), 6: (0.003, 0.003)}
    both = bracketed(before, after)
    assert both == {2: (0.001, 0.002), 8: pytest.approx((0.003, 0.005)), 6: (0.003, 0.003)}
    mix = over_mix(both, {2: 10, 8: 5})  # 60 rows in 10 x 1 ms + 5 x 3 ms = 25 ms
    assert mix["infer_per_s"] == pytest.approx(60 / 0.025)
    assert mix["cpu_ms_per_row"] == pytest.approx(1000 * (10 * 0.002 + 5 * 0.005) / 60)
    assert mix["seconds_per_batch"] == {"2": 0.001, "8": pytest.approx(0.003)}
