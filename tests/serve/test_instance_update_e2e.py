"""An ``instance_group`` count change on the shared server (EXPLICIT mode): the model's deployment is
scaled in place, as Triton adds or removes only the instances the new count asks for. Replicas that
should stay keep their identity (Serve's replica id and process), removed ones are gone when the load
answers, and requests sent meanwhile all succeed (``tests/serve/test_model_control_e2e.py``'s steady
client loop)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tritonclient.http as httpclient

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
