"""Server-side breakdown from two statistics snapshots."""

import pytest

from bench.server_stats import breakdowns, parse_snapshot


def _stats(success: int, queue_ns: int, infer_ns: int, batches: dict[int, int], version: str = "1") -> dict:
    cn = lambda c, ns: {"count": c, "ns": ns}  # noqa: E731
    executions = sum(batches.values())
    return {
        "name": "m",
        "version": version,
        "inference_count": sum(b * n for b, n in batches.items()),
        "execution_count": executions,
        "inference_stats": {
            "success": cn(success, 0),
            "fail": cn(0, 0),
            "queue": cn(success, queue_ns),
            "compute_input": cn(success, success * 1000),
            "compute_infer": cn(success, infer_ns),
            "compute_output": cn(success, success * 2000),
        },
        "batch_stats": [{"batch_size": b, "compute_infer": cn(n, 0)} for b, n in batches.items()],
    }


def test_breakdown_is_the_difference_averaged_per_request():
    before = parse_snapshot({"model_stats": [_stats(10, 10_000, 50_000, {1: 10})]})
    after = parse_snapshot({"model_stats": [_stats(30, 70_000, 250_000, {1: 10, 2: 5, 4: 2})]})
    b = breakdowns(before, after)["m"]
    assert b.success_count == 20
    assert b.queue_us == pytest.approx(3.0)
    assert b.compute_input_us == pytest.approx(1.0)
    assert b.compute_infer_us == pytest.approx(10.0)
    assert b.compute_output_us == pytest.approx(2.0)
    assert b.batch_sizes == {2: 5, 4: 2}
    assert b.execution_count == 7
    assert b.avg_batch_size == pytest.approx(18 / 7)
    assert b.to_dict()["batch_sizes"] == {"2": 5, "4": 2}


def test_versions_add_up_and_idle_models_are_left_out():
    snap = parse_snapshot({"model_stats": [_stats(5, 0, 0, {1: 5}), _stats(7, 0, 0, {1: 7}, "2")]})
    assert snap["m"].success_count == 12
    assert snap["m"].batch_executions == {1: 12}
    assert breakdowns(snap, snap) == {}
    assert set(breakdowns({}, snap)) == {"m"}
