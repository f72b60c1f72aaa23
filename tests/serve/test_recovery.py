"""Issue 14, items 4 and 5: a replica killed under load, and a model that hangs.

One server of its own (tests/serve/standalone.py), started as ``make serve`` starts it, on the small
models of tests/serve/recovery_models.py.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deployments.serve import hooks, spare
from tests.serve import processes, recovery_models
from tests.serve.counts import metric
from tests.serve.recovery_load import kill_under_load, one_request
from tests.serve.standalone import Server, http

pytestmark = [pytest.mark.serve, pytest.mark.slow]

MODELS = ["add_one", "add_two_replicas", "hangs"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = recovery_models.build(tmp_path_factory.mktemp("recovery"))
    srv = Server(repo, args={"model_control_mode": "explicit", "load_model": MODELS})
    try:
        srv.wait_ready(MODELS)
        yield srv
    finally:
        srv.close()


def _success_count(server: Server, model: str) -> int:
    status, _, body = http(f"{server.url}/v2/models/{model}/stats")
    assert status == 200, body
    return int(json.loads(body)["model_stats"][0]["inference_stats"]["success"]["count"])


def test_a_killed_single_replica_answers_again_fast_every_failure_json(server: Server) -> None:
    model_spare = _spare_worker(server, spare.MODEL_PRELOAD)
    report = kill_under_load(server.url, "add_one", server.replica_pids, replicas=1, after_s=12)
    summary = report.summary()
    assert summary["failed_not_json"] == 0, summary  # before: plain-text 500s from HAProxy
    # the model answers again within the load's 12 s (how fast is measured, not asserted:
    # bench/results/recovery, 2.3-2.5 s here against 6.7 s before; on a loaded machine it took longer)
    assert summary["first_answer_after_kill_s"] is not None, summary
    server.wait_ready(["add_one"])
    assert server.replica_pids("add_one") == [model_spare]  # its replacement started in the spare


def test_statistics_are_cumulative_across_a_replica_restart(server: Server) -> None:
    for i in range(20):
        assert one_request(server.url, "add_one", float(i)).correct
    time.sleep(2.5)  # the replica's statistics push (every second) has carried them to the server
    before = _success_count(server, "add_one")
    assert before >= 20
    pid = server.replica_pids("add_one")[0]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while server.replica_pids("add_one") in ([], [pid]) and time.monotonic() < deadline:
        time.sleep(0.5)
    server.wait_ready(["add_one"])
    deadline = time.monotonic() + 30
    while not one_request(server.url, "add_one", 1.0).correct and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _success_count(server, "add_one") >= before + 1  # before: restarted at 0


def _pending(server: Server, model: str) -> float | None:
    """The model's ``nv_inference_pending_request_count`` in Triton's ``/metrics`` (None: no line)."""
    return metric(http(server.metrics_url)[2].decode(), "nv_inference_pending_request_count", model)


def _until(check: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)
    return True


def test_requests_pending_on_a_killed_replica_leave_the_pending_gauge(server: Server, tmp_path: Path) -> None:
    """Requests queued on a replica that is then killed no longer count as pending once the server
    has not heard from it for three heartbeats (15 s); its counters stay (the test above)."""
    marker = tmp_path / "held"
    held = recovery_models.infer_body(-1.0, hang_marker=str(marker))
    senders = [
        threading.Thread(target=http, args=(f"{server.url}/v2/models/add_one/infer", body), daemon=True)
        for body in (held, recovery_models.infer_body(1.0), recovery_models.infer_body(2.0))
    ]
    senders[0].start()
    assert _until(marker.exists, 30), "the first request never reached the model"
    for sender in senders[1:]:
        sender.start()
    assert _until(lambda: _pending(server, "add_one") == 2, 30), _pending(server, "add_one")
    time.sleep(2.5)  # the replica's push (every second) has carried its two pending requests
    pid = server.replica_pids("add_one")[0]
    os.kill(pid, signal.SIGKILL)
    assert _until(lambda: server.replica_pids("add_one") not in ([], [pid]), 60)
    server.wait_ready(["add_one"])
    assert _until(lambda: one_request(server.url, "add_one", 1.0).correct, 30)
    # before: the dead replica's last push (2 pending) stood in /metrics for good
    assert _until(lambda: _pending(server, "add_one") == 0, 40), _pending(server, "add_one")
    for sender in senders:
        sender.join(timeout=30)


def test_with_two_replicas_a_crash_loses_only_the_requests_sent_before_the_ingress_saw_it_gone(
    server: Server,
) -> None:
    assert len(server.replica_pids("add_two_replicas")) == 2
    report = kill_under_load(server.url, "add_two_replicas", server.replica_pids, replicas=2, after_s=8)
    summary = report.summary()
    print(summary)
    assert summary["failed_not_json"] == 0, summary
    # What fails was in flight on the dying replica, or sent to it by HAProxy before a failed
    # connection told it the replica was gone (a worker can lose more than one request: one answered
    # by a reset before the process is fully gone, then the next); nothing after that.
    assert summary["failed_after_ingress_saw_it_gone"] == 0, summary
    assert summary["answered_correctly"] > summary["sent"] - summary["answered_correctly"], summary
    server.wait_ready(["add_two_replicas"])


def test_a_hung_model_fails_the_request_at_its_execution_timeout_and_serves_again(server: Server) -> None:
    started = time.monotonic()
    status, content_type, body = http(
        f"{server.url}/v2/models/hangs/infer", recovery_models.infer_body(-1.0), timeout=60
    )
    elapsed = time.monotonic() - started
    assert status == 504, body
    assert "application/json" in content_type
    assert "execution_timeout_ms" in json.loads(body)["error"]
    assert elapsed < 5.0  # before: no limit, the request never returned
    # the hung instance is replaced: the model answers again
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if one_request(server.url, "hangs", 2.0, timeout=5).correct:
            break
        time.sleep(0.5)
    else:
        pytest.fail("the model did not serve again after its hung instance")


def test_a_request_timeout_is_honoured_while_it_waits_for_the_instance(
    server: Server, tmp_path: Path
) -> None:
    # a hung request holds the only instance until its execution timeout (1.5 s)
    marker = tmp_path / "hanging"

    def send_blocker() -> threading.Thread:
        thread = threading.Thread(
            target=http,
            args=(
                f"{server.url}/v2/models/hangs/infer",
                recovery_models.infer_body(-1.0, hang_marker=str(marker)),
            ),
            kwargs={"timeout": 60},
        )
        thread.start()
        return thread

    blocker = send_blocker()
    deadline = time.monotonic() + 60
    while not marker.exists():  # the blocker holds the instance from here on
        assert time.monotonic() < deadline, "the blocking request never reached the model"
        if not blocker.is_alive():  # answered without reaching the model (a replica still being replaced)
            blocker = send_blocker()
        time.sleep(0.01)
    started = time.monotonic()
    status, _, body = http(
        f"{server.url}/v2/models/hangs/infer", recovery_models.infer_body(1.0, timeout=200_000), timeout=60
    )
    elapsed = time.monotonic() - started
    blocker.join(60)
    assert status != 200, body
    assert "timeout" in json.loads(body)["error"].lower()
    assert elapsed < 1.2, elapsed  # 0.2 s of queueing allowed, not the blocker's 1.5 s
    server.wait_ready(["hangs"])
    deadline = time.monotonic() + 60
    while not one_request(server.url, "hangs", 2.0, timeout=5).correct and time.monotonic() < deadline:
        time.sleep(0.5)


def test_unloading_a_model_with_a_hung_request_is_prompt(server: Server) -> None:
    threading.Thread(
        target=http,
        args=(f"{server.url}/v2/models/hangs/infer", recovery_models.infer_body(-1.0)),
        kwargs={"timeout": 60},
        daemon=True,
    ).start()
    time.sleep(0.5)
    started = time.monotonic()
    status, _, body = http(f"{server.url}/v2/repository/models/hangs/unload", {}, timeout=60)
    assert status == 200, body
    assert time.monotonic() - started < 10.0  # before: 21 s


def _server_log(server: Server) -> str:
    """The tail of what the server printed and of the server replica's own logs (a failure's evidence)."""
    tails = [server.log.read_text(errors="replace")[-3000:]]
    for path in sorted(server.tmp.rglob("*ServeReplica*triton*server*.log"))[-2:]:
        tails.append(f"--- {path.name}\n" + path.read_text(errors="replace")[-3000:])
    return "\n".join(tails)


def _index(server: Server) -> dict[str, dict[str, str]]:
    status, _, body = http(f"{server.url}/v2/repository/index", {})
    assert status == 200, body
    return {row["name"]: row for row in json.loads(body)}


def _spare_worker(server: Server, preload: str = spare.SERVER_PRELOAD, timeout_s: float = 60.0) -> int:
    """The idle Ray worker this server keeps on its node for the next replica of the server application
    (``preload``: its setup hook, named in its environment) or of a model (deployments/serve/spare.py)."""
    deadline = time.monotonic() + timeout_s
    while not (found := processes.spare_workers(server.track(), preload)):
        assert time.monotonic() < deadline, f"the server keeps no spare worker for {preload}"
        time.sleep(0.2)
    (pid,) = found
    return pid


def test_a_restarted_server_application_keeps_the_models_the_api_loaded(server: Server) -> None:
    """The server application's replica killed: Serve starts a new one, which finds ``api_loaded`` (loaded
    through the repository API, not at start) still running and lists it READY, keeps a start model the
    API unloaded (``hangs``, by the test before) unloaded, and is ready again; unload then stops it."""
    assert http(f"{server.url}/v2/repository/models/api_loaded/load", {})[0] == 200
    assert one_request(server.url, "api_loaded", 2.0).correct
    before = {name: (row.get("state"), row.get("reason")) for name, row in _index(server).items()}
    (server_pid,) = [
        p for p in processes.alive(server.track()) if "ServeReplica:triton:" in processes.command(p)
    ]
    spare_pid = _spare_worker(server)
    model_pids = server.replica_pids("api_loaded")
    assert model_pids
    for pid in model_pids:  # models run with their own setup hook: the server's spare is its own
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert f"{hooks.SETUP_HOOK_ENV}={spare.MODEL_PRELOAD}\0".encode() in environ
    os.kill(server_pid, signal.SIGKILL)
    killed_at = time.monotonic()
    last: object = None
    hung = []  # before: Serve's proxy, the backend's backup, held them until the new replica ran
    # before: the first call after the kill, written on HAProxy's idle connection to the dead replica,
    # lost its connection with no answer (every call here starts after the kill: none was in flight)
    dropped = []
    while time.monotonic() < killed_at + 120:
        try:
            last = http(f"{server.url}/v2/health/ready", timeout=5)[0]
            if last == 200 and server_pid not in processes.alive(server.track()):
                break
        except OSError as exc:
            last = exc
            (hung if isinstance(exc, TimeoutError) else dropped).append(
                (time.monotonic() - killed_at, repr(exc))
            )
        time.sleep(0.2)
    print(f"ready again {time.monotonic() - killed_at:.1f}s after the kill")
    # the new replica started in the spare worker (before: a new process, its imports after it)
    assert [p for p in processes.alive(server.track()) if "ServeReplica:triton:" in processes.command(p)] == [
        spare_pid
    ]
    assert _spare_worker(server) != spare_pid  # and it keeps a spare of its own for the next one
    rows = _index(server)
    assert last == 200, (rows, _server_log(server))
    assert hung == [], hung  # a 503 (or 400, not ready) while it restarts, never a hang
    assert dropped == [], dropped
    assert rows["api_loaded"].get("state") == "READY", (rows, _server_log(server))
    assert rows["add_one"].get("state") == "READY", rows
    after = {name: (row.get("state"), row.get("reason")) for name, row in rows.items()}
    assert after == before, rows  # unloaded models (``hangs``) too
    assert one_request(server.url, "api_loaded", 3.0).correct
    assert http(f"{server.url}/v2/repository/models/api_loaded/unload", {})[0] == 200
    deadline = time.monotonic() + 60
    while server.replica_pids("api_loaded") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert server.replica_pids("api_loaded") == []  # before: unload answered 200 and the replica served on
    assert _index(server)["api_loaded"].get("state") == "UNAVAILABLE"


def test_a_model_whose_folder_went_away_and_whose_replica_died_is_not_listed_ready(
    server: Server, tmp_path: Path
) -> None:
    """Before: the new replica failed to load it and answered 503 for good while the index said READY
    and the server was ready. Now the replica's pushes carry its load error: UNAVAILABLE, not ready."""
    ready_before = http(f"{server.url}/v2/health/ready")[0]  # (an earlier test may have left a model down)
    assert http(f"{server.url}/v2/repository/models/doomed/load", {})[0] == 200
    assert one_request(server.url, "doomed", 1.0).correct
    folder = server.repo / "doomed"
    kept = tmp_path / "doomed"
    folder.rename(kept)
    try:
        (pid,) = server.replica_pids("doomed")
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 90
        while "failed to load it again" not in _index(server)["doomed"].get("reason", ""):
            if time.monotonic() > deadline:
                break  # (the restart itself reads "no running replica (1 starting)" for a moment)
            time.sleep(1)
        row = _index(server)["doomed"]
        assert row.get("state") == "UNAVAILABLE" and "failed to load it again" in row.get("reason", ""), row
        assert http(f"{server.url}/v2/health/ready")[0] != 200
    finally:
        kept.rename(folder)
        http(f"{server.url}/v2/repository/models/doomed/unload", {})
    assert _index(server)["doomed"].get("reason") == "unloaded"
    assert http(f"{server.url}/v2/health/ready")[0] == ready_before


def test_a_killed_haproxy_is_back_soon_and_never_answers_404_for_a_loaded_model(server: Server) -> None:
    """Serve checks each proxy every 2 s (the request-path variables; 10 s by default), so HAProxy killed
    with ``kill -9`` is started again after three failed checks; until the server application's backend
    is in its new configuration a ``/v2`` path answers 503, not 404."""
    assert one_request(server.url, "add_one", 1.0).correct
    haproxies = [
        p for p in processes.alive(server.track()) if processes.command(p).split(" ")[0].endswith("haproxy")
    ]
    assert haproxies, "no HAProxy among the server's processes"
    for pid in haproxies:
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    outcomes = []
    while time.monotonic() - killed < 90:
        outcome = one_request(server.url, "add_one", 2.0, timeout=5)
        outcomes.append(outcome)
        if outcome.correct:
            break
        time.sleep(0.2)
    back_after = outcomes[-1].ended - killed
    print(f"answered again {back_after:.1f} s after HAProxy was killed; {len(outcomes)} tries")
    assert outcomes[-1].correct, [o.status for o in outcomes][-10:]
    statuses = {o.status for o in outcomes[:-1]}
    assert statuses <= {0, 503}, statuses  # refused while no HAProxy runs, then Triton's 503, never 404
    assert all(o.json_error for o in outcomes[:-1] if o.status == 503)
