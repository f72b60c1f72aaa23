"""The bench client's event loop: uvloop where installed, asyncio's own otherwise."""

import asyncio
import importlib.util

import pytest

from bench import loadgen


async def _loop_type() -> str:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop()).__module__


@pytest.mark.skipif(importlib.util.find_spec("uvloop") is None, reason="uvloop is not installed")
def test_the_client_runs_on_uvloop_where_installed():
    assert loadgen.run_client(_loop_type()).startswith("uvloop")
    assert loadgen.client_loop_name() == "uvloop"


def test_without_uvloop_the_client_runs_on_asyncio(monkeypatch):
    monkeypatch.setattr(loadgen, "client_loop_factory", lambda: None)
    assert loadgen.run_client(_loop_type()).startswith("asyncio")
    assert loadgen.client_loop_name() == "asyncio"
