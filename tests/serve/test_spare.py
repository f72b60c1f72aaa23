"""Spare workers (deployments/serve/spare.py, preload.py), without Ray; end to end in test_recovery.py."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from deployments.serve import hooks, preload, spare


def _ray_env(monkeypatch: pytest.MonkeyPatch, runtime_env: dict[str, object]) -> None:
    import ray

    class Context:
        def __init__(self) -> None:
            self.runtime_env = runtime_env

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get_runtime_context", Context)


def test_the_server_starts_models_with_their_hook_and_the_rest_with_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    own = {"env_vars": {"A": "1", hooks.SETUP_HOOK_ENV: spare.SERVER_PRELOAD}, "working_dir": "/w"}
    _ray_env(monkeypatch, own)
    assert spare.child_runtime_env(None) == {"env_vars": {"A": "1"}, "working_dir": "/w"}
    assert spare.child_runtime_env(spare.MODEL_PRELOAD) == {
        "env_vars": {"A": "1", hooks.SETUP_HOOK_ENV: spare.MODEL_PRELOAD},
        "working_dir": "/w",
    }
    assert own["env_vars"][hooks.SETUP_HOOK_ENV] == spare.SERVER_PRELOAD  # the server's own is left as it was
    assert spare.with_model_runtime_env({"num_cpus": 1})["runtime_env"]["env_vars"][hooks.SETUP_HOOK_ENV] == (
        spare.MODEL_PRELOAD
    )
    named = {"num_cpus": 1, "runtime_env": {"pip": ["x"]}}
    assert spare.with_model_runtime_env(named) == named
    assert spare.without_setup_hook(spare.SERVER_RUNTIME_ENV) == {}


def test_outside_the_server_replica_the_defaults_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    _ray_env(monkeypatch, {"env_vars": {hooks.SETUP_HOOK_ENV: spare.MODEL_PRELOAD}})  # a model's replica
    assert spare.child_runtime_env(None) is None
    assert spare.with_model_runtime_env({"num_cpus": 1}) == {"num_cpus": 1}
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    assert spare.child_runtime_env(spare.MODEL_PRELOAD) is None


def _process(proc: Path, pid: int, title: str, environ: dict[str, str]) -> None:
    (proc / str(pid)).mkdir()
    (proc / str(pid) / "cmdline").write_bytes(title.encode() + b"\0--flag\0")
    (proc / str(pid) / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in environ.items()))


def test_spares_are_the_workers_of_one_setup_hook_and_raylet_that_run_nothing(tmp_path: Path) -> None:
    hook, raylet = hooks.SETUP_HOOK_ENV, spare.RAYLET_PID_ENV
    _process(tmp_path, 10, hooks.IDLE_WORKER_TITLE, {hook: spare.MODEL_PRELOAD, raylet: "7"})
    _process(tmp_path, 11, hooks.IDLE_WORKER_TITLE, {hook: spare.SERVER_PRELOAD, raylet: "7"})
    _process(
        tmp_path, 12, "ray::ServeReplica:model-a:model", {hook: spare.MODEL_PRELOAD, raylet: "7"}
    )  # taken
    _process(tmp_path, 13, hooks.IDLE_WORKER_TITLE, {raylet: "7"})  # Ray's own idle worker
    _process(tmp_path, 14, hooks.IDLE_WORKER_TITLE, {hook: spare.MODEL_PRELOAD + "x", raylet: "7"})
    _process(tmp_path, 15, hooks.IDLE_WORKER_TITLE, {hook: spare.MODEL_PRELOAD, raylet: "8"})  # another node
    _process(tmp_path, 16, "/venv/bin/python", {hook: spare.MODEL_PRELOAD, raylet: "7"})  # still starting
    _process(tmp_path, 17, hooks.IDLE_WORKER_TITLE, {hook: spare.MODEL_PRELOAD, raylet: "77"})
    (tmp_path / "self").mkdir()
    assert sorted(spare.spares(spare.MODEL_PRELOAD, "7", tmp_path)) == [10, 16]
    assert spare.spares(spare.SERVER_PRELOAD, "7", tmp_path) == [11]


def test_a_node_is_topped_up_to_one_spare_and_waits_to_see_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(hooks, "session_dir", lambda: str(tmp_path))
    running: list[int] = []
    asked: list[tuple[int, int]] = []

    def prestart(count: int, keep: int) -> None:
        asked.append((count, keep))
        running.extend(range(count))

    monkeypatch.setattr(hooks, "prestart_workers", prestart)
    monkeypatch.setattr(spare, "spares", lambda preload, raylet: list(running))
    assert spare.top_up(spare.MODEL_PRELOAD) == 1
    assert spare.top_up(spare.MODEL_PRELOAD) == 0  # the next replica of the node counts it
    assert asked == [(1, spare.KEEP_ALIVE_S)]
    assert (tmp_path / spare.LOCK_NAME).exists()


def test_a_failing_preload_is_logged_not_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def fail() -> None:
        raise ImportError("no module")

    monkeypatch.setattr(hooks, "import_replica_actor", fail)
    with caplog.at_level(logging.WARNING, logger=preload.__name__):
        preload.server()  # Ray would end the worker on a raise, and no replica could start
        preload.model()
    assert caplog.text.count("could not import") == 2


def test_the_spare_is_kept_after_the_delay_and_a_refusal_only_warns(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(hooks.SETUP_HOOK_ENV, spare.MODEL_PRELOAD)
    topped: list[str] = []
    monkeypatch.setattr(spare, "top_up", lambda preload: topped.append(preload) or 1)
    asyncio.run(spare.keep_spare(0.0))
    assert topped == [spare.MODEL_PRELOAD]

    def refuse(preload: str) -> int:
        raise ConnectionError("raylet gone")

    monkeypatch.setattr(spare, "top_up", refuse)
    with caplog.at_level(logging.WARNING, logger=spare.__name__):
        asyncio.run(spare.keep_spare(0.0))
    assert "raylet gone" in caplog.text
    monkeypatch.delenv(hooks.SETUP_HOOK_ENV)
    monkeypatch.setattr(spare, "top_up", lambda preload: pytest.fail("no hook, no spare"))
    asyncio.run(spare.keep_spare(0.0))
