"""Triton's logging extension without Ray: the checks of an update and their wording on each transport,
the server's log settings (an update applies at once, in order, and wakes whoever waits for a change),
and ``GET``/``POST /v2/logging`` on the HTTP front end, restricted API included."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from deployments.protocol.http import ServerHTTPApp
from deployments.protocol.log_settings import LogBoard, changes_from_grpc, changes_from_json
from deployments.protocol.proto import grpc_service_pb2 as pb
from deployments.settings import LogSettings, RestrictedApi
from repository_loader.errors import InvalidArgument, Unsupported
from tests.protocol.fakes import FakeDataPlane, all_models
from tests.protocol.test_http_app import call

DEFAULTS = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}


def test_an_http_update_names_tritons_settings_and_ignores_others() -> None:
    changes = changes_from_json(
        {"log_info": False, "log_verbose_level": 3, "log_format": "ISO8601", "log_error": None, "other": 1}
    )
    assert changes == {"info": False, "verbose_level": 3, "format": "ISO8601"}
    assert LogSettings().changed(**changes).to_json() == {
        **DEFAULTS,
        "log_info": False,
        "log_verbose_level": 3,
        "log_format": "ISO8601",
    }


@pytest.mark.parametrize(
    ("document", "error", "message"),
    [
        (
            {"log_file": "other.log"},
            Unsupported,
            "log file location can not be updated through network protocol",
        ),
        ({"log_info": "true"}, InvalidArgument, "attempt to access JSON non-boolean as boolean"),
        ({"log_error": 1}, InvalidArgument, "attempt to access JSON non-boolean as boolean"),
        (
            {"log_verbose_level": -1},
            InvalidArgument,
            "attempt to access JSON non-unsigned-integer as unsigned-integer",
        ),
        (
            {"log_verbose_level": True},
            InvalidArgument,
            "attempt to access JSON non-unsigned-integer as unsigned-integer",
        ),
        ({"log_verbose_level": 2**31}, InvalidArgument, "log_verbose_level must be at most 2147483647"),
        ({"log_format": 1}, InvalidArgument, "attempt to access JSON non-string as string"),
        ({"log_format": "json"}, InvalidArgument, "invalid argument for --log_format, got: json"),
        # Triton's order: the file first, then info, warning, error, verbose level, format
        ({"log_format": "json", "log_info": 0}, InvalidArgument, "non-boolean as boolean"),
    ],
)
def test_a_bad_http_value_is_refused_with_tritons_words(document, error, message) -> None:
    with pytest.raises(error, match=message):
        changes_from_json(document)


def _grpc_settings(**values: object) -> dict[str, pb.LogSettingsRequest.SettingValue]:
    request = pb.LogSettingsRequest()
    for name, value in values.items():
        choice = {bool: "bool_param", int: "uint32_param", str: "string_param"}[type(value)]
        setattr(request.settings[name], choice, value)
    return dict(request.settings)


@pytest.mark.parametrize(
    ("values", "error", "message"),
    [
        ({"log_file": ""}, Unsupported, "log file location can not be updated through network protocol"),
        ({"log_info": 1}, InvalidArgument, "expect boolean for 'log_info'"),
        ({"log_warning": "false"}, InvalidArgument, "expect boolean for 'log_warning'"),
        ({"log_verbose_level": True}, InvalidArgument, "expect int32 for 'log_verbose_level'"),
        ({"log_format": 1}, InvalidArgument, "expect string for 'log_format'"),
        ({"log_format": "json"}, InvalidArgument, "invalid argument for log_format, got: json"),
    ],
)
def test_a_bad_grpc_value_is_refused_with_tritons_words(values, error, message) -> None:
    with pytest.raises(error, match=message):
        changes_from_grpc(_grpc_settings(**values))


def test_a_grpc_update_reads_each_settings_value() -> None:
    changes = changes_from_grpc(_grpc_settings(log_warning=False, log_verbose_level=2, log_format="default"))
    assert changes == {"warning": False, "verbose_level": 2, "format": "default"}


def test_the_board_applies_an_update_once_and_wakes_the_waiters() -> None:
    applied: list[LogSettings] = []
    recorded: list[LogSettings] = []

    async def scenario() -> None:
        board = LogBoard(LogSettings(), applied.append, recorded.append)
        start = board.current
        assert await board.wait(None, 0.01) == start  # a first call: at once
        assert await board.wait(start, 0.01) is None  # nothing changed within the time
        waiter = asyncio.create_task(board.wait(start, 30.0))
        await asyncio.sleep(0)
        now = await board.update({"verbose_level": 1})
        assert await waiter == now == LogSettings(verbose_level=1)
        assert await board.update({"verbose_level": 1}) == now  # the same again: nothing to apply
        assert applied == recorded == [now]

    asyncio.run(scenario())


def test_the_http_routes_read_and_change_the_settings(tmp_path: Path) -> None:
    dataplane = FakeDataPlane(all_models(tmp_path))
    app = ServerHTTPApp(dataplane)

    async def scenario() -> None:
        read = await call(app, "GET", "/v2/logging")
        assert read is not None and read.status == 200 and read.json() == DEFAULTS
        changed = await call(app, "POST", "/v2/logging", b'{"log_warning": false, "log_verbose_level": 1}')
        assert changed is not None and changed.status == 200
        assert changed.json() == {**DEFAULTS, "log_warning": False, "log_verbose_level": 1}
        refused = await call(app, "POST", "/v2/logging", b'{"log_error": false, "log_format": "json"}')
        assert refused is not None and refused.status == 400
        assert refused.json() == {"error": "invalid argument for --log_format, got: json"}
        fixed = await call(app, "POST", "/v2/logging", b'{"log_file": "elsewhere.log"}')
        assert fixed is not None and fixed.status == 501
        again = await call(app, "GET", "/v2/logging")  # a refused update changed nothing
        assert again is not None and again.json() == {
            **DEFAULTS,
            "log_warning": False,
            "log_verbose_level": 1,
        }
        wrong = await call(app, "PUT", "/v2/logging")
        assert wrong is not None and wrong.status == 405

    asyncio.run(scenario())
    assert "logging" in asyncio.run(dataplane.server_metadata())["extensions"]


def test_the_logging_group_of_the_restricted_api_needs_its_header(tmp_path: Path) -> None:
    app = ServerHTTPApp(FakeDataPlane(all_models(tmp_path)))
    app.restricted = (RestrictedApi.parse("logging:admin-key=s3cret"),)

    async def scenario() -> None:
        for method in ("GET", "POST"):
            refused = await call(app, method, "/v2/logging", b"{}")
            assert refused is not None and refused.status == 403
            assert refused.json() == {"error": "This API is restricted, expecting header 'admin-key'"}
        allowed = await call(app, "POST", "/v2/logging", b"{}", headers={"admin-key": "s3cret"})
        assert allowed is not None and allowed.status == 200 and allowed.json() == DEFAULTS

    asyncio.run(scenario())


def test_an_update_from_another_thread_wakes_a_waiter_on_its_loop() -> None:
    """A replica's gRPC server may answer on a thread of its own: its update still wakes the long
    polls waiting on the deployment's loop."""

    async def scenario() -> LogSettings | None:
        board = LogBoard(LogSettings())
        waiter = asyncio.create_task(board.wait(LogSettings(), 30.0))
        await asyncio.sleep(0)
        other = threading.Thread(target=lambda: asyncio.run(board.update({"error": False})))
        other.start()
        try:
            return await asyncio.wait_for(waiter, 10.0)
        finally:
            other.join()

    assert asyncio.run(scenario()) == LogSettings(error=False)
