"""The test servers' port picks: several for one server are different ports, none of those taken."""

from __future__ import annotations

import random
import socket

import pytest

from tests.serve.standalone import TEST_PORTS, free_ports


def test_ports_picked_together_differ_and_avoid_the_taken_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    # each pick tries the ports in the same order: picks made apart would all be the first free one
    order = list(range(21000, 21200))
    monkeypatch.setattr(random, "sample", lambda population, k: order[:k])
    ports = free_ports(4, {21000})
    assert len(set(ports)) == 4 and 21000 not in ports
    assert all(port in TEST_PORTS for port in ports)


def test_a_bound_port_is_not_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        bound = held.getsockname()[1]
        monkeypatch.setattr(random, "sample", lambda population, k: [bound])
        with pytest.raises(RuntimeError, match="no free port"):
            free_ports(1)
