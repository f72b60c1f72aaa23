"""Sequence routing without Ray running: the group a sequence's call goes to, and a replica refusing a
sequence it does not own."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from deployments.inference import InferRequest
from deployments.serve.handles import GroupPicker
from deployments.serve.sequence_routing import SequenceRouter, owner_rank
from repository_loader.errors import Unavailable


def _request(cid: int | str) -> InferRequest:
    return InferRequest("m", {"IN": np.zeros((1, 1), np.int32)}, correlation_id=cid)


def test_a_sequence_call_goes_to_the_group_holding_its_owner() -> None:
    picker = GroupPicker()
    apps = (("g0", 2), ("g1", 1))  # ranks 0-1 in g0, rank 2 in g1
    for cid in range(1, 40):
        expected = "g0" if owner_rank(cid, 3) < 2 else "g1"
        assert picker.pick(apps, cid) == expected
    assert {picker.pick(apps, cid) for cid in range(1, 40)} == {"g0", "g1"}
    assert picker.pick(apps) == "g0"  # no sequence: least loaded, first on a tie


def _router(rank: int, world: int) -> SequenceRouter:
    async def nothing(*_: Any) -> Any:
        return {}

    return SequenceRouter("m", "model-m", rank, world, "id", "actor", nothing, nothing)


def test_a_replica_refuses_a_sequence_it_does_not_own() -> None:
    mine = next(c for c in range(1, 100) if owner_rank(c, 2) == 0)
    other = next(c for c in range(1, 100) if owner_rank(c, 2) == 1)
    router = _router(0, 2)
    router.refuse_elsewhere(_request(mine))
    router.refuse_elsewhere(_request(0))  # not a sequence
    with pytest.raises(Unavailable, match=f"sequence {other} to model 'm'.*rank 1"):
        router.refuse_elsewhere(_request(other))
