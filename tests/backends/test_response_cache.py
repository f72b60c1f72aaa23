"""Triton's response cache through the model runtime: hits skip the model, statistics and metrics count them."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from deployments.inference import InferRequest, InferResponse, RequestedOutput
from deployments.runtime import response_cache
from deployments.runtime.metrics import merge_model_metrics, render_triton
from deployments.runtime.model import ModelRuntime
from deployments.runtime.response_cache import ResponseCache
from deployments.settings import ServerSettings, SettingsError, cache_size
from tests.backends.helpers import describe, request, spec

MODELS = Path(__file__).parent / "python_models"


@pytest.fixture
def process_cache() -> Iterator[ResponseCache]:
    cache = response_cache.configure(4096)
    assert cache is not None
    yield cache
    response_cache.configure(None)


async def _counting(tmp_path: Path, cache_enabled: bool = True) -> ModelRuntime:
    (tmp_path / "counting").mkdir(parents=True)
    shutil.copytree(MODELS / "counting" / "1", tmp_path / "counting" / "1")
    model = describe(
        "counting",
        tmp_path / "counting",
        "python",
        [spec("X", "FP32", [-1])],
        [spec("Y", "FP32", [-1]), spec("CALLS", "INT32", [-1])],
        max_batch_size=4,
    )
    runtime = ModelRuntime(replace(model, response_cache=cache_enabled))
    await runtime.load()
    return runtime


def _x(*values: float) -> np.ndarray:
    return np.array([values], dtype=np.float32)


async def test_a_repeated_request_is_answered_from_the_cache(tmp_path: Path, process_cache) -> None:
    runtime = await _counting(tmp_path)
    try:
        first = await runtime.infer(request("counting", X=_x(1, 2)))
        again = await runtime.infer(request("counting", X=_x(1, 2)))
        other = await runtime.infer(request("counting", X=_x(1, 3)))
        assert first.error is None and again.error is None
        np.testing.assert_array_equal(again.outputs["Y"], _x(2, 4))
        assert int(first.outputs["CALLS"][0, 0]) == 1
        assert int(again.outputs["CALLS"][0, 0]) == 1  # not executed again
        assert int(other.outputs["CALLS"][0, 0]) == 2
        assert again.model_name == "counting" and again.model_version == "1"
        assert not again.outputs["Y"].flags.writeable  # nobody changes what later requests read

        (stats,) = runtime.statistics()
        durations = stats["inference_stats"]
        assert durations["cache_hit"]["count"] == 1 and durations["cache_miss"]["count"] == 2
        assert durations["success"]["count"] == 3
        assert stats["inference_count"] == 2 and stats["execution_count"] == 2  # hits are not inferences

        text = render_triton({"counting": merge_model_metrics([runtime.metrics_snapshot()])})
        assert 'nv_cache_num_hits_per_model{model="counting",version="1"} 1' in text
        assert 'nv_cache_num_misses_per_model{model="counting",version="1"} 2' in text
        assert "# TYPE nv_cache_hit_duration_per_model counter" in text
    finally:
        await runtime.close()


async def test_key_covers_shape_type_and_requested_outputs(tmp_path: Path, process_cache) -> None:
    runtime = await _counting(tmp_path)
    try:
        await runtime.infer(request("counting", X=_x(1, 2)))
        reshaped = await runtime.infer(request("counting", X=np.array([[1], [2]], np.float32)))
        assert int(reshaped.outputs["CALLS"][0, 0]) == 2
        only_y = await runtime.infer(request("counting", outputs=["Y"], X=_x(1, 2)))
        assert list(only_y.outputs) == ["Y"]
        both = await runtime.infer(request("counting", X=_x(1, 2)))
        assert set(both.outputs) == {"Y", "CALLS"} and int(both.outputs["CALLS"][0, 0]) == 1
    finally:
        await runtime.close()
    assert ResponseCache.key(request("m", X=_x(1)), "m", 1) != ResponseCache.key(
        request("m", X=_x(1)), "m", 2
    )
    as_int = request("m", X=np.array([[1]], np.int32).view(np.float32))
    assert ResponseCache.key(as_int, "m", 1) != ResponseCache.key(
        request("m", X=np.array([[1]], np.int32)), "m", 1
    )


async def test_failures_are_not_cached_and_models_without_the_flag_never_are(
    tmp_path: Path, process_cache
) -> None:
    runtime = await _counting(tmp_path / "a")
    plain = await _counting(tmp_path / "b", cache_enabled=False)
    try:
        bad = await runtime.infer(InferRequest("counting", {"X": _x(1)}, [RequestedOutput("NOPE")]))
        assert bad.error is not None and len(process_cache) == 0
        for _ in range(2):
            response = await plain.infer(request("counting", X=_x(5)))
        assert int(response.outputs["CALLS"][0, 0]) == 2
        assert plain.statistics()[0]["inference_stats"]["cache_miss"]["count"] == 0
        assert "nv_cache" not in render_triton({"counting": merge_model_metrics([plain.metrics_snapshot()])})
    finally:
        await runtime.close()
        await plain.close()


def _answer(n: int) -> InferResponse:
    return InferResponse(outputs={"Y": np.zeros(n, np.uint8)})


def test_least_recently_used_entries_make_room() -> None:
    probe = ResponseCache(size=10_000)
    assert probe.put(b"p", _answer(40))
    entry = probe.used  # 40 bytes of data, the copy's header and the output's name
    cache = ResponseCache(size=2 * entry + entry // 2)
    assert cache.put(b"a", _answer(40)) and cache.put(b"b", _answer(40))
    assert cache.get(b"a") is not None  # a is now the most recent
    assert cache.put(b"c", _answer(40))
    assert cache.get(b"b") is None and cache.get(b"a") is not None and cache.used == 2 * entry
    assert not cache.put(b"huge", _answer(cache.size)) and cache.get(b"huge") is None
    words = InferResponse(outputs={"S": np.array([b"x" * 10], dtype=np.object_)})
    assert cache.put(b"w", words) and cache.used <= cache.size


def test_an_entry_counts_the_memory_it_holds_not_only_its_data(caplog: pytest.LogCaptureFixture) -> None:
    """L0_response_cache's insertion failure: two (1, 16) FP32 outputs are 128 bytes of data, but kept
    they hold more than a 200-byte cache; the response is not kept, and the log says so."""
    two = InferResponse(outputs={n: np.ones((1, 16), np.float32) for n in ("OUTPUT0", "OUTPUT1")})
    small = ResponseCache(size=200)
    with caplog.at_level("ERROR", logger="deployments.runtime.response_cache"):
        assert not small.put(b"k", two)
    assert small.get(b"k") is None and small.used == 0 and len(small) == 0
    assert "Failed to insert key" in caplog.text
    roomy = ResponseCache(size=10_840)  # the size the suite's other tests run with
    assert roomy.put(b"k", two) and roomy.get(b"k") is not None and 200 < roomy.used < 1000


@pytest.mark.parametrize(
    ("config", "byte_size", "expected"),
    [
        ((), None, None),
        (("local,size=1048576",), None, 1048576),
        ((), 8192, 8192),
        (("local,size=8192", "local,size=4096"), None, 4096),
    ],
)
def test_cache_flags_as_triton_reads_them(config: tuple[str, ...], byte_size: int | None, expected) -> None:
    assert cache_size(config, byte_size) == expected


@pytest.mark.parametrize(
    ("config", "byte_size", "message"),
    [
        (("local,size=1",), 5, "Incompatible flags --response-cache-byte-size and --cache-config"),
        (("local,size=8192", "redis,key=value"), None, "multiple cache configurations"),
        (("size=10",), None, "No cache specified"),
        (("local,size",), None, "option format is '<cache name>,<setting>=<value>'"),
        (("redis,host=localhost",), None, "cache 'redis' is not available"),
        (("local,size=big",), None, "needs size=<bytes>"),
        (("local,size=0",), None, "must be positive"),
    ],
)
def test_cache_flag_errors(config: tuple[str, ...], byte_size: int | None, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        cache_size(config, byte_size)


def test_cache_setting_round_trips_through_args() -> None:
    settings = ServerSettings.from_args({"model_repository": "/r", "cache_config": "local,size=4096"}, {})
    assert settings.response_cache_bytes == 4096
    assert ServerSettings.from_args(settings.to_args(), {}) == settings
    older = ServerSettings.from_args({"model_repository": "/r", "response_cache_byte_size": 512}, {})
    assert older.response_cache_bytes == 512
