"""The server's spare worker (deployments/serve/spare.py, preload.py), without Ray; end to end in test_recovery.py."""

from __future__ import annotations

import asyncio
import logging

import pytest

from deployments.serve import hooks, preload, spare


def test_what_the_server_starts_runs_without_its_setup_hook() -> None:
    own = {"env_vars": {"A": "1", hooks.SETUP_HOOK_ENV: spare.PRELOAD}, "working_dir": "/w"}
    assert spare.without_setup_hook(own) == {"env_vars": {"A": "1"}, "working_dir": "/w"}
    assert spare.without_setup_hook(spare.SERVER_RUNTIME_ENV) == {}
    assert own["env_vars"][hooks.SETUP_HOOK_ENV] == spare.PRELOAD  # the server's own is left as it was


def test_a_deployment_keeps_options_it_names_and_gets_none_outside_the_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(spare, "child_runtime_env", lambda: {"env_vars": {"A": "1"}})
    assert spare.with_child_runtime_env({"num_cpus": 1}) == {
        "num_cpus": 1,
        "runtime_env": {"env_vars": {"A": "1"}},
    }
    named = {"num_cpus": 1, "runtime_env": {"pip": ["x"]}}
    assert spare.with_child_runtime_env(named) == named
    monkeypatch.setattr(spare, "child_runtime_env", lambda: None)
    assert spare.with_child_runtime_env({"num_cpus": 1}) == {"num_cpus": 1}


def test_a_failing_preload_is_logged_not_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def fail() -> None:
        raise ImportError("no module")

    monkeypatch.setattr(hooks, "import_replica_actor", fail)
    with caplog.at_level(logging.WARNING, logger=preload.__name__):
        preload.preload()  # Ray would end the worker on a raise, and the server could never start
    assert "could not import" in caplog.text


def test_the_spare_is_asked_for_after_the_delay_and_a_refusal_only_warns(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    asked: list[tuple[int, int]] = []
    monkeypatch.setattr(hooks, "prestart_workers", lambda count, keep: asked.append((count, keep)))
    asyncio.run(spare.keep_spare(0.0))
    assert asked == [(1, spare.KEEP_ALIVE_S)]

    def refuse(count: int, keep: int) -> None:
        raise ConnectionError("raylet gone")

    monkeypatch.setattr(hooks, "prestart_workers", refuse)
    with caplog.at_level(logging.WARNING, logger=spare.__name__):
        asyncio.run(spare.keep_spare(0.0))
    assert "raylet gone" in caplog.text
