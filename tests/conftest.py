"""Test order: the modules that use the session's shared Ray Serve instance (``server_url``,
tests/serve/conftest.py) run last, so that the servers and clusters other tests start for themselves
(``serve run`` subprocesses, the multi-node cluster) start on a machine the shared instance's replicas
do not load. Within each part the order is the collection order.

The test process uses gRPC clients and also starts subprocesses (servers, tools). gRPC's fork
handlers run at each fork while its threads serve a call, and once aborted the whole test process in
a blocking call (``Fatal Python error: Aborted`` in ``grpc/_channel.py``); nothing here forks a
process that goes on using gRPC, so they are turned off before gRPC is imported."""

from __future__ import annotations

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    shared = {item.path for item in items if "server_url" in getattr(item, "fixturenames", ())}
    items[:] = sorted(items, key=lambda item: item.path in shared)
