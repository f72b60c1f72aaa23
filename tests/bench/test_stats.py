"""Percentiles, the stability rule and window merging, on synthetic samples."""

import math

import numpy as np
import pytest

from bench.stats import WindowStats, is_stable, percentile, summarize, window_from_samples


def _window(start: float, n: int, latency_us: float, rows: int = 1) -> WindowStats:
    return WindowStats(start, start + 1.0, np.full(n, latency_us), 0, rows)


def test_percentile_is_nearest_rank_like_numpy_inverted_cdf():
    rng = np.random.default_rng(1)
    values = rng.exponential(500.0, size=997)
    for q in (1, 50, 90, 95, 99, 100):
        assert percentile(values, q) == pytest.approx(np.percentile(values, q, method="inverted_cdf"))


def test_percentile_small_sets_and_errors():
    assert percentile([10, 20, 30, 40], 50) == 20
    assert percentile([10, 20, 30, 40], 51) == 30
    assert percentile([7], 99) == 7
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1, 2], 101)


def test_stable_when_last_three_windows_agree_within_tolerance():
    windows = [_window(0, 500, 900), _window(1, 1000, 500), _window(2, 1040, 510), _window(3, 980, 495)]
    assert is_stable(windows, count=3, tolerance=0.10)
    assert not is_stable(windows[:3], count=3, tolerance=0.10)  # the first window is far off


def test_unstable_on_throughput_or_latency_spread_or_too_few_windows():
    assert not is_stable([_window(0, 1000, 500), _window(1, 1000, 500)], count=3)
    spread_rate = [_window(0, 1000, 500), _window(1, 1300, 500), _window(2, 1000, 500)]
    assert not is_stable(spread_rate, tolerance=0.10)
    assert is_stable(spread_rate, tolerance=0.20)
    spread_latency = [_window(0, 1000, 500), _window(1, 1000, 650), _window(2, 1000, 500)]
    assert not is_stable(spread_latency, tolerance=0.10)
    assert not is_stable([_window(0, 0, 1), _window(1, 0, 1), _window(2, 0, 1)])


def test_window_cut_by_end_time_and_rates():
    ends = np.array([0.1, 0.5, 0.99, 1.0, 1.5])
    lat = np.array([100.0, 200.0, 300.0, 400.0, 500.0])
    w = window_from_samples(0.0, 1.0, ends, lat, errors=2, rows_per_request=2)
    assert w.count == 3
    assert w.requests_per_s == pytest.approx(3.0)
    assert w.infer_per_s == pytest.approx(6.0)
    assert w.latency_avg_us == pytest.approx(200.0)
    assert w.errors == 2


def test_summarize_merges_samples_and_time():
    a = WindowStats(0.0, 1.0, np.array([100.0, 300.0]), 1, 2)
    b = WindowStats(1.0, 3.0, np.array([200.0, 400.0, 600.0, 800.0]), 0, 2)
    s = summarize([a, b])
    assert s.requests == 6
    assert s.errors == 1
    assert s.duration_s == pytest.approx(3.0)
    assert s.requests_per_s == pytest.approx(2.0)
    assert s.infer_per_s == pytest.approx(4.0)
    assert s.latency_avg_us == pytest.approx(400.0)
    assert s.percentiles_us[50] == 300.0
    assert s.percentiles_us[99] == 800.0
    with pytest.raises(ValueError):
        summarize([])
