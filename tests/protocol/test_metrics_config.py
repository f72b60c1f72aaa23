"""``--metrics-config``: the latency counters turned off, the latency summaries turned on with their
quantiles over every replica's recent durations (Ray-free)."""

from __future__ import annotations

import re

import pytest

from deployments.runtime import stats
from deployments.runtime.metrics import (
    CACHE_SUMMARIES,
    LATENCY_COUNTERS,
    SUMMARIES,
    merge_model_metrics,
    render_triton,
)
from deployments.runtime.stats import LatencyWindow, ModelStats
from deployments.settings import DEFAULT_QUANTILES, MetricsConfig, ServerSettings, SettingsError


def test_settings_are_read_as_triton_writes_them() -> None:
    config = MetricsConfig.parse(
        ("summary_latencies=true", "counter_latencies=false", "summary_quantiles=0.1:0.01,0.75:0.001")
    )
    assert config == MetricsConfig(False, True, ((0.1, 0.01), (0.75, 0.001)))
    assert MetricsConfig.parse(()) == MetricsConfig(True, False, DEFAULT_QUANTILES)
    assert MetricsConfig.parse(("future_setting=1",)).ignored == ("future_setting",)
    # a number is read as far as it goes, as tritonserver reads it (Triton's own qa writes "0.0.1")
    assert MetricsConfig.parse(("summary_quantiles=0.1:0.0.1",)).summary_quantiles == ((0.1, 0.0),)
    for bad in ("summary_latencies", "=true", "summary_latencies=", "a,b=c"):
        with pytest.raises(SettingsError, match="--metrics-config option format is <setting>=<value>"):
            MetricsConfig.parse((bad,))
    with pytest.raises(SettingsError, match="true or false"):
        MetricsConfig.parse(("summary_latencies=maybe",))
    with pytest.raises(SettingsError, match="summary_quantiles"):
        MetricsConfig.parse(("summary_quantiles=0.5",))
    with pytest.raises(SettingsError, match="summary_quantiles"):
        MetricsConfig.parse(("summary_quantiles=1.5:0.1",))


def test_the_settings_travel_through_the_applications_args() -> None:
    args = {"model_repository": "/models", "metrics_config": ["summary_latencies=true", "x=1"]}
    settings = ServerSettings.from_args(args)
    assert settings.metrics_config.summary_latencies
    assert ServerSettings.from_args(settings.to_args()).metrics_config == settings.metrics_config


def _replica(durations_us: list[float], cached: bool = False) -> dict:
    """One replica's metrics snapshot of model ``m`` version 1 that observed ``durations_us``."""
    stats.keep_latency_windows(True)
    try:
        model = ModelStats("m", "1")
    finally:
        stats.keep_latency_windows(False)
    assert model.window is not None
    for us in durations_us:
        model.record_batch(1, 1, [int(us * 100)], int(us * 200), int(us * 300), int(us * 400))
        model.record_request(True, int(us * 1000))
        if cached:
            model.record_cache(False, int(us * 500))
    return {
        "stats": [model.to_json()],
        "pending": {},
        "failures": {},
        "custom": [],
        "response_cache": cached,
        "samples": {"1": model.window.samples()},
    }


def _value(text: str, line: str) -> str:
    match = re.search(rf"^{re.escape(line)} (\S+)$", text, re.MULTILINE)
    assert match, line
    return match.group(1)


def test_summaries_count_every_request_and_take_quantiles_over_every_replica() -> None:
    merged = merge_model_metrics([_replica([float(v) for v in range(1, 51)]), _replica([100.0] * 50)])
    text = render_triton({"m": merged}, config=MetricsConfig(summary_latencies=True))
    labels = 'model="m",version="1"'
    assert "# TYPE nv_inference_request_summary_us summary" in text
    assert _value(text, f"nv_inference_request_summary_us_count{{{labels}}}") == "100"
    assert _value(text, f"nv_inference_request_summary_us_sum{{{labels}}}") == str(sum(range(1, 51)) + 5000)
    assert _value(text, f'nv_inference_request_summary_us{{{labels},quantile="0.5"}}') == "50"
    assert _value(text, f'nv_inference_request_summary_us{{{labels},quantile="0.9"}}') == "100"
    assert _value(text, f'nv_inference_compute_infer_summary_us{{{labels},quantile="0.5"}}') == "15"
    assert _value(text, f'nv_inference_queue_summary_us{{{labels},quantile="0.5"}}') == "5"
    assert [q for q, _ in DEFAULT_QUANTILES] == [0.5, 0.9, 0.95, 0.99, 0.999]
    assert text.count('nv_inference_queue_summary_us{model="m",version="1",quantile=') == 5
    assert "nv_cache_" not in text  # no cache: neither its counters nor its summaries
    for family in LATENCY_COUNTERS[:5]:
        assert f"# TYPE {family} counter" in text  # counter latencies stay on by default


def test_custom_quantiles_and_counters_off() -> None:
    config = MetricsConfig.parse(
        ("summary_latencies=true", "counter_latencies=false", "summary_quantiles=0.1:0.01,0.75:0.01")
    )
    text = render_triton({"m": merge_model_metrics([_replica([1.0, 2.0, 3.0, 4.0])])}, config=config)
    assert re.findall(r'quantile="([^"]+)"', text) == ["0.1", "0.75"] * len(SUMMARIES)
    for family in LATENCY_COUNTERS:
        assert family not in text
    assert "nv_inference_request_success" in text and "nv_inference_count" in text


def test_a_cached_model_has_cache_summaries_and_no_request_summary() -> None:
    text = render_triton(
        {"m": merge_model_metrics([_replica([10.0], cached=True)])},
        config=MetricsConfig(summary_latencies=True),
    )
    for family in CACHE_SUMMARIES:
        assert f"# TYPE {family} summary" in text
    assert "nv_inference_request_summary_us" not in text
    assert "nv_inference_queue_summary_us" in text


def test_no_summaries_by_default_and_nan_for_an_empty_window() -> None:
    assert ModelStats("m", "1").window is None  # nothing kept unless the summaries are on
    replica = _replica([])
    assert "summary" not in render_triton({"m": merge_model_metrics([replica])})
    text = render_triton({"m": merge_model_metrics([replica])}, config=MetricsConfig(summary_latencies=True))
    assert _value(text, 'nv_inference_request_summary_us{model="m",version="1",quantile="0.5"}') == "NaN"


def test_the_window_forgets_old_durations_and_a_snapshot_is_bounded() -> None:
    window = LatencyWindow(window_s=10.0)
    window.observe("success", 5_000, times=3000)
    assert len(window.samples(limit=100)["success"]) == 100
    assert window.samples(now=stats.time.monotonic() + 11.0) == {}
