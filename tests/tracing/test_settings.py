"""Triton's trace settings: the flags the server starts with, a model's setting over the global one,
clearing with null, and Triton's refusals and wording (as Triton's L0_trace tests expect them)."""

from __future__ import annotations

import pytest

from deployments.settings import ServerSettings, SettingsError
from deployments.tracing import TraceSettings, parse_trace_config, read_changes
from repository_loader.errors import InvalidArgument, Unsupported

STARTED = ["triton,file=global_unittest.log", "level=TIMESTAMPS", "rate=1"]


def _settings(flags: list[str] = STARTED) -> TraceSettings:
    return TraceSettings(parse_trace_config(flags))


def test_a_model_follows_the_global_setting_until_it_has_its_own() -> None:
    settings = _settings()
    expected = {
        "trace_level": ["TIMESTAMPS"],
        "trace_rate": "1",
        "trace_count": "-1",
        "log_frequency": "0",
        "trace_file": "global_unittest.log",
        "trace_mode": "triton",
    }
    assert settings.document() == expected and settings.document("simple") == expected
    settings.update(None, read_changes({"trace_level": ["TIMESTAMPS", "TENSORS"]}))
    assert settings.document("simple")["trace_level"] == ["TIMESTAMPS", "TENSORS"]


def test_clearing_returns_a_model_to_the_global_value_and_the_global_to_the_flags() -> None:
    settings = _settings()
    settings.update("simple", read_changes({"trace_rate": "12", "log_frequency": "34"}))
    settings.update(None, read_changes({"trace_rate": "56", "trace_count": "78", "trace_level": ["OFF"]}))
    cleared = settings.update(None, read_changes({"trace_rate": None, "trace_count": None}))
    assert (cleared["trace_rate"], cleared["trace_count"], cleared["trace_level"]) == ("1", "-1", ["OFF"])
    model = settings.document("simple")
    assert (model["trace_rate"], model["log_frequency"], model["trace_level"]) == ("12", "34", ["OFF"])
    model = settings.update("simple", read_changes({"trace_rate": None, "trace_level": None}))
    assert (model["trace_rate"], model["log_frequency"]) == ("1", "34")


def test_reading_changes_again_leaves_them_as_they_are() -> None:
    """A replica's front end reads a request, the server application reads the result again."""
    changes = read_changes({"trace_level": ["TENSORS", "TIMESTAMPS"], "trace_rate": "5", "trace_count": None})
    assert read_changes(changes) == changes


def test_each_change_raises_the_version_and_a_read_does_not() -> None:
    settings = _settings()
    before = settings.state.version
    settings.update(None, {})
    assert settings.state.version == before
    settings.update("m", read_changes({"trace_rate": "3"}))
    assert settings.state.version == before + 1


def test_the_count_is_used_up_where_it_is_set() -> None:
    settings = _settings()
    settings.update(None, read_changes({"trace_count": "2"}))
    assert settings.take("simple") and settings.take("other") and not settings.take("simple")
    assert settings.document("simple")["trace_count"] == "0"
    settings.update("own", read_changes({"trace_count": "1"}))
    assert settings.take("own") and not settings.take("own")
    assert settings.document()["trace_count"] == "0"


@pytest.mark.parametrize(
    ("asked", "error", "message"),
    [
        (
            {"trace_file": "model.log"},
            Unsupported,
            "trace file location can not be updated through network protocol",
        ),
        (
            {"trace_level": ["OFF", "TIMESTAMPS"]},
            InvalidArgument,
            "Expect only one trace level 'OFF' is specified",
        ),
        ({"trace_rate": "often"}, InvalidArgument, "Unable to parse 'trace_rate', got: often"),
        (
            {"trace_count": "-2"},
            InvalidArgument,
            "Unable to parse 'trace_count'. Expecting value >= -1, got:-2",
        ),
        (
            {"log_frequency": "10000000000"},
            InvalidArgument,
            "Unable to parse 'log_frequency', value is out of range [ 0, 4294967295 ], got: 10000000000",
        ),
        (
            {"trace_count": "10000000000"},
            InvalidArgument,
            "Unable to parse 'trace_count', value is out of range [ -1, 2147483647 ], got: 10000000000",
        ),
    ],
)
def test_refusals_keep_tritons_wording(asked: dict, error: type, message: str) -> None:
    with pytest.raises(error) as raised:
        read_changes(asked)
    assert raised.value.message == message


def test_opentelemetry_mode_lists_its_options_instead_of_the_file() -> None:
    settings = _settings(["mode=opentelemetry", "opentelemetry,url=localhost:4318/v1/traces", "rate=0"])
    document = settings.document("bls_simple")
    assert document["trace_mode"] == "opentelemetry" and document["url"] == "localhost:4318/v1/traces"
    assert (
        document["bsp_max_export_batch_size"],
        document["bsp_schedule_delay"],
        document["bsp_max_queue_size"],
    ) == (
        "512",
        "5000",
        "2048",
    )
    assert "trace_file" not in document and "log_frequency" not in document


def test_trace_config_flags_reach_the_server_settings_and_back() -> None:
    flags = ["mode=opentelemetry", "opentelemetry,url=http://h:4318/v1/traces", "level=TIMESTAMPS", "count=5"]
    settings = ServerSettings.from_args({"model_repository": "/r", "trace_config": flags})
    assert (
        settings.trace.opentelemetry and settings.trace.level == ("TIMESTAMPS",) and settings.trace.count == 5
    )
    assert ServerSettings.from_args(settings.to_args()).trace == settings.trace
    resource = parse_trace_config(["opentelemetry,resource=service.name=test_triton"]).resource
    assert dict(resource)["service.name"] == "test_triton"


@pytest.mark.parametrize("flag", ["level=LOUD", "rate=-1", "mode=files", "jaeger,url=x", "count"])
def test_a_bad_trace_config_flag_fails_the_start(flag: str) -> None:
    with pytest.raises(SettingsError, match="--trace-config"):
        ServerSettings.from_args({"model_repository": "/r", "trace_config": [flag]})
