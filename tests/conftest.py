"""Test order: the modules that use the session's shared Ray Serve instance (``server_url``,
tests/serve/conftest.py) run last, so that the servers and clusters other tests start for themselves
(``serve run`` subprocesses, the multi-node cluster) start on a machine the shared instance's replicas
do not load. Within each part the order is the collection order."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    shared = {item.path for item in items if "server_url" in getattr(item, "fixturenames", ())}
    items[:] = sorted(items, key=lambda item: item.path in shared)
