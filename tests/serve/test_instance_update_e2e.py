"""An ``instance_group`` count change on the shared server (EXPLICIT mode): the model's deployment is
scaled in place, as Triton adds or removes only the instances the new count asks for. Replicas that
should stay keep their identity (Serve's replica id and process), removed ones are gone when the load
answers, and requests sent meanwhile all succeed (``tests/serve/test_model_control_e2e.py``'s steady
client loop)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serve.test_model_control_e2e import FACTOR_PY, post, steady_load

pytestmark = pytest.mark.serve

MODEL = "iu_scaled"


def _write(repo: Path, count: int) -> None:
    (repo / MODEL / "1").mkdir(parents=True, exist_ok=True)
    model_py = repo / MODEL / "1" / "model.py"
    if not model_py.exists():  # the same file throughout: only the count changes
        model_py.write_text(FACTOR_PY.format(factor=1, init="pass"))
    (repo / MODEL / "config.pbtxt").write_text(
        f'name: "{MODEL}"\nbackend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]\n"
    )


def _replicas() -> dict[str, tuple[str, int]]:
    """The model's replicas Serve lists now, in any state: ``replica id -> (state, pid)``."""
    from deployments.serve import hooks
    from repository_loader.plan import model_app_name

    app = hooks.serve_details()["applications"][model_app_name(MODEL)]
    return {
        r["replica_id"]: (str(getattr(r["state"], "value", r["state"])), int(r.get("pid") or 0))
        for deployment in app["deployments"].values()
        for r in deployment["replicas"]
    }


def _load(url: str) -> None:
    status, body = post(url, f"/v2/repository/models/{MODEL}/load")
    assert status == 200, body


def test_a_count_change_adds_or_removes_only_those_replicas_and_loses_no_request(
    server_url: str, test_repository: Path
) -> None:
    _write(test_repository, 2)
    _load(server_url)
    first = _replicas()
    assert len(first) == 2 and {state for state, _ in first.values()} == {"RUNNING"}
    with steady_load(server_url, MODEL, clients=4) as load:
        _write(test_repository, 3)
        _load(server_url)
        grown = _replicas()
        assert len(grown) == 3 and {state for state, _ in grown.values()} == {"RUNNING"}
        assert all(grown[replica] == first[replica] for replica in first)  # the same replicas, same pids
        _write(test_repository, 1)
        _load(server_url)
        shrunk = _replicas()  # the removed replicas are gone (their requests drained) when the load answers
        assert len(shrunk) == 1 and set(shrunk) <= set(grown)
        (survivor,) = shrunk
        assert shrunk[survivor] == grown[survivor]
    # Every replica change makes Serve reload HAProxy: its old process closes the keep-alive
    # connections it holds idle (a client that sent on one just then reads "connection closed", no
    # answer, nothing ran), and for a moment the new one may have no server of the model up (503, try
    # again). Both are retryable and known (docs/operations.md); any other outcome fails the change.
    retryable = ("connection closed.", "[503] no replica of the model is available yet; try again")
    answered_wrong = [f for f in load.failures if f not in retryable]
    assert answered_wrong == [], answered_wrong[:5]
    assert len(load.failures) <= 8, load.failures  # at most one per client and change
    assert load.ok > 20
    client = httpclient.InferenceServerClient(server_url)
    try:
        assert client.get_model_config(MODEL)["instance_group"][0]["count"] == 1
    finally:
        client.close()
    assert post(server_url, f"/v2/repository/models/{MODEL}/unload")[0] == 200


SEQ_MODEL = "iu_sequences"


def _write_sequences(repo: Path, count: int) -> None:
    """The Python running sum (its state in the model, keyed by CORRID; it answers with its pid) with
    ``count`` instances."""
    from tests.serve.conftest import ACCUMULATOR_CONFIG, ACCUMULATOR_PY

    (repo / SEQ_MODEL / "1").mkdir(parents=True, exist_ok=True)
    model_py = repo / SEQ_MODEL / "1" / "model.py"
    if not model_py.exists():
        model_py.write_text(ACCUMULATOR_PY)
    config = ACCUMULATOR_CONFIG.replace('name: "seq_accumulator"', f'name: "{SEQ_MODEL}"')
    (repo / SEQ_MODEL / "config.pbtxt").write_text(config.replace("count: 2", f"count: {count}"))


def test_a_sequence_models_count_change_keeps_its_replicas_and_their_live_sequences(
    server_url: str, test_repository: Path
) -> None:
    """Triton adds or removes only the instances a new count asks for, and sequences on instances that
    stay go on (L0_model_update's sequence tests). 2 -> 4: every live sequence goes on where it lives,
    whichever replica a request lands on, and new ones spread over all four; 4 -> 2: Serve removes two
    replicas and renumbers the others, whose live sequences go on; a sequence of a removed replica
    fails cleanly (its state is gone), never with a wrong sum; new sequences run on the two."""
    client = httpclient.InferenceServerClient(server_url)
    sums: dict[int, int] = {}
    where: dict[int, int] = {}

    def step(cid: int, value: int, start: bool = False, end: bool = False) -> int:
        data = httpclient.InferInput("IN", [1, 1], "INT32")
        data.set_data_from_numpy(np.array([[value]], dtype=np.int32))
        result = client.infer(SEQ_MODEL, [data], sequence_id=cid, sequence_start=start, sequence_end=end)
        sums[cid] = (0 if start else sums[cid]) + value
        assert int(result.as_numpy("OUT")[0, 0]) == sums[cid], cid
        pid = int(result.as_numpy("PID")[0, 0])
        assert where.setdefault(cid, pid) == pid, f"sequence {cid} moved from {where[cid]} to {pid}"
        return pid

    try:
        _write_sequences(test_repository, 2)
        assert post(server_url, f"/v2/repository/models/{SEQ_MODEL}/load")[0] == 200
        first = _replicas_of(SEQ_MODEL)
        assert len(first) == 2
        old = list(range(1, 9))
        for cid in old:
            step(cid, cid, start=True)
        assert len({where[c] for c in old}) == 2  # consecutive IDs take the replicas in turn

        _write_sequences(test_repository, 4)
        assert post(server_url, f"/v2/repository/models/{SEQ_MODEL}/load")[0] == 200
        grown = _replicas_of(SEQ_MODEL)
        assert len(grown) == 4 and all(grown[r] == first[r] for r in first)  # same replicas, same pids
        for _ in range(3):  # HAProxy spreads them: some land on a new replica, some on the other old one
            for cid in old:
                step(cid, 1)
        new = list(range(101, 109))
        for cid in new:
            step(cid, 2, start=True)
        assert len({where[c] for c in new}) == 4
        for cid in old + new:
            step(cid, 3, end=True)

        live = list(range(201, 209))
        for cid in live:
            step(cid, cid, start=True)
        _write_sequences(test_repository, 2)
        assert post(server_url, f"/v2/repository/models/{SEQ_MODEL}/load")[0] == 200
        shrunk = _replicas_of(SEQ_MODEL)
        assert len(shrunk) == 2 and all(shrunk[r] == grown[r] for r in shrunk)
        kept = {pid for _, pid in shrunk.values()}
        went_on = 0
        for cid in live:
            if where[cid] in kept:
                step(cid, 1, end=True)
                went_on += 1
            else:
                with pytest.raises(InferenceServerException) as lost:
                    step(cid, 1, end=True)
                assert lost.value.status() in ("400", "503"), lost.value
        assert 0 < went_on < len(live)
        later = list(range(301, 305))
        for cid in later:
            step(cid, 1, start=True)
            step(cid, 1, end=True)
        assert {where[c] for c in later} == kept
    finally:
        client.close()
        assert post(server_url, f"/v2/repository/models/{SEQ_MODEL}/unload")[0] == 200


def _replicas_of(model: str) -> dict[str, tuple[str, int]]:
    """Model ``model``'s replicas Serve lists now: ``replica id -> (state, pid)``, every one RUNNING."""
    from deployments.serve import hooks
    from repository_loader.plan import model_app_name

    app = hooks.serve_details()["applications"][model_app_name(model)]
    found = {
        r["replica_id"]: (str(getattr(r["state"], "value", r["state"])), int(r.get("pid") or 0))
        for deployment in app["deployments"].values()
        for r in deployment["replicas"]
    }
    assert {state for state, _ in found.values()} == {"RUNNING"}, found
    return found
