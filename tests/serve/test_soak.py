"""Issue 14 and 27: bounded soaks of mixed valid and invalid traffic, every request counted: one with a
replica kill, one with a kill of the server application and then of HAProxy.

The short form (``SOAK_SECONDS``, default 15 s of traffic for the replica kill) runs with the suite; a
longer run records its counts in ``SOAK_OUT`` (a folder): ``SOAK_SECONDS=120
SOAK_OUT=bench/results/soak .venv/bin/python -m pytest -q tests/serve/test_soak.py``.

Counted per request: sent, answered correctly (a valid request with the model's result, an invalid one
with a 4xx JSON error, the repository index), failed (a JSON error where an answer was due), refused
(the connection was refused: no proxy listened, nothing was sent), lost (no HTTP answer, or an answer
that is not Triton's JSON). Lost must be 0 outside the requests in flight on a killed replica (sent
before its process was gone, not answered before the kill).
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.serve import processes, recovery_models
from tests.serve.standalone import Server

pytestmark = [pytest.mark.serve, pytest.mark.slow]

MODELS = ["add_one", "add_two_replicas"]
REFUSED = -1  # the connection was refused (no proxy listened): the request never left the client

INVALID: list[tuple[str, bytes]] = [
    (
        "wrong datatype",
        json.dumps(
            {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "INT8", "data": [1] * 4}]}
        ).encode(),
    ),
    (
        "wrong shape",
        json.dumps(
            {"inputs": [{"name": "INPUT0", "shape": [1, 5], "datatype": "FP32", "data": [1] * 5}]}
        ).encode(),
    ),
    (
        "unknown input",
        json.dumps(
            {"inputs": [{"name": "NOPE", "shape": [1, 4], "datatype": "FP32", "data": [1] * 4}]}
        ).encode(),
    ),
    ("not json", b"{not json"),
    (
        "null data",
        json.dumps(
            {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [None] * 4}]}
        ).encode(),
    ),
    (
        "too few values",
        json.dumps(
            {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1]}]}
        ).encode(),
    ),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = recovery_models.build(tmp_path_factory.mktemp("soak"))
    srv = Server(repo, args={"model_control_mode": "explicit", "load_model": MODELS})
    try:
        srv.wait_ready(MODELS)
        yield srv
    finally:
        srv.close()


def _send(url: str, path: str, body: bytes, timeout: float = 30.0) -> tuple[int, Any, float, float]:
    """POST ``body`` to ``path``: ``(status, JSON or None, started, ended)``; status REFUSED or 0 without an answer."""
    request = urllib.request.Request(f"{url}{path}", data=body, headers={"Content-Type": "application/json"})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read()), started, time.monotonic()
    except urllib.error.HTTPError as error:
        raw = error.read()
        try:
            doc: Any = json.loads(raw)
        except ValueError:
            doc = None
        return error.code, doc, started, time.monotonic()
    except urllib.error.URLError as error:  # no HTTP answer; refused: nothing was sent
        refused = isinstance(error.reason, ConnectionRefusedError)
        return (REFUSED if refused else 0), None, started, time.monotonic()
    except (OSError, ValueError):
        return 0, None, started, time.monotonic()


def _traffic(
    url: str, rows: list[dict[str, Any]], stop: threading.Event, workers: int = 6
) -> list[threading.Thread]:
    """``workers`` threads sending valid and invalid inference requests (and, one in ten, the repository
    index) until ``stop``; each request's outcome goes to ``rows``."""
    lock = threading.Lock()

    def loop(worker: int) -> None:
        local = random.Random(worker)
        n = 0
        while not stop.is_set():
            model = MODELS[n % 2]
            n += 1
            draw = local.random()
            if draw < 0.1:
                kind, valid, value = "index", True, 0.0
                status, doc, started, ended = _send(url, "/v2/repository/index", b"{}")
            else:
                if draw < 0.4:
                    kind, body = local.choice(INVALID)
                    valid, value = False, 0.0
                else:
                    value = float(worker * 1_000_000 + n)
                    kind, body = "valid", json.dumps(recovery_models.infer_body(value)).encode()
                    valid = True
                status, doc, started, ended = _send(url, f"/v2/models/{model}/infer", body)
            is_json_error = isinstance(doc, dict) and isinstance(doc.get("error"), str)
            if kind == "index" and status == 200:
                outcome = "correct" if isinstance(doc, list) else "wrong"
            elif valid and status == 200:
                outcome = "correct" if doc["outputs"][0]["data"] == [value + 1] * 4 else "wrong"
            elif not valid and 400 <= status < 500 and is_json_error:
                outcome = "correct"
            elif status > 0 and is_json_error:
                outcome = "failed"
            elif status == REFUSED:
                outcome = "refused"
            else:
                outcome = "lost"
            with lock:
                rows.append(
                    {
                        "model": "index" if kind == "index" else model,
                        "kind": kind,
                        "status": status,
                        "outcome": outcome,
                        "started": started,
                        "ended": ended,
                    }
                )

    threads = [threading.Thread(target=loop, args=(w,), daemon=True) for w in range(workers)]
    for t in threads:
        t.start()
    return threads


def _counts(rows: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        **extra,
        "sent": len(rows),
        "answered_correctly": sum(r["outcome"] == "correct" for r in rows),
        "failed": sum(r["outcome"] == "failed" for r in rows),
        "refused": sum(r["outcome"] == "refused" for r in rows),
        "lost": sum(r["outcome"] == "lost" for r in rows),
        "wrong_answers": sum(r["outcome"] == "wrong" for r in rows),
        "failed_by_status": _by_status([r for r in rows if r["outcome"] != "correct"]),
    }


def _record(counts: dict[str, Any], name: str) -> None:
    print(json.dumps(counts))
    out = os.environ.get("SOAK_OUT")
    if out:
        seconds = os.environ.get("SOAK_SECONDS", "15")
        command = (
            f"SOAK_SECONDS={seconds} SOAK_OUT={out} .venv/bin/python -m pytest -q tests/serve/test_soak.py"
        )
        path = Path(out) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"command": command, **counts}, indent=2) + "\n")


def test_soak_mixed_traffic_with_a_replica_kill(server: Server) -> None:
    seconds = float(os.environ.get("SOAK_SECONDS", "15"))
    rng = random.Random(14)
    rows: list[dict[str, Any]] = []
    stop = threading.Event()
    threads = _traffic(server.url, rows, stop)
    time.sleep(seconds / 3)
    victim_model = rng.choice(MODELS)
    pid = server.replica_pids(victim_model)[0]
    kill_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    died_at = processes.wait_gone(pid)
    time.sleep(seconds * 2 / 3)
    stop.set()
    for t in threads:
        t.join(60)

    in_flight = [
        r for r in rows if r["model"] == victim_model and r["started"] < died_at and r["ended"] >= kill_at
    ]
    counts = _counts(rows, seconds=seconds, killed_model=victim_model)
    counts["in_flight_at_kill"] = len(in_flight)
    counts["lost_outside_in_flight"] = sum(r["outcome"] == "lost" and r not in in_flight for r in rows)
    _record(counts, "soak.json")
    assert counts["refused"] == 0, counts
    assert counts["wrong_answers"] == 0, counts
    assert counts["lost_outside_in_flight"] == 0, counts
    assert counts["answered_correctly"] > counts["sent"] * 0.5, counts


def _by_status(rows: list[dict[str, Any]]) -> dict[str, int]:
    found: dict[str, int] = {}
    for r in rows:
        key = f"{r['kind']}:{r['status']}"
        found[key] = found.get(key, 0) + 1
    return found


def test_soak_mixed_traffic_through_a_server_application_kill_and_an_haproxy_kill(server: Server) -> None:
    """The server application's replica killed, then (once ``/v2`` answers again) HAProxy killed, under
    the same traffic plus repository-index calls. Inference keeps answering through the server
    application's restart; the index answers 503 with Triton's JSON meanwhile. While no HAProxy
    listens, connections are refused (nothing was sent: a client may retry); nothing accepted is lost,
    and nothing is answered wrongly (never a 404 for a loaded model)."""
    rows: list[dict[str, Any]] = []
    stop = threading.Event()
    threads = _traffic(server.url, rows, stop)
    time.sleep(2)
    (app_pid,) = [
        p for p in processes.alive(server.track()) if "ServeReplica:triton:" in processes.command(p)
    ]
    server_killed = time.monotonic()
    os.kill(app_pid, signal.SIGKILL)
    server_back = _until_index_answers(server, rows, after=server_killed)
    # The two faults apart: a request that started just before the index answered again may still wait
    # for the CPU when HAProxy goes, and would count against the server application's restart.
    time.sleep(2)
    haproxies = [
        p for p in processes.alive(server.track()) if processes.command(p).split(" ")[0].endswith("haproxy")
    ]
    assert haproxies, "no HAProxy among the server's processes"
    haproxy_killed = time.monotonic()
    for pid in haproxies:
        os.kill(pid, signal.SIGKILL)
    haproxy_back = _until_index_answers(server, rows, after=haproxy_killed)
    time.sleep(2)
    stop.set()
    for t in threads:
        t.join(60)

    counts = _counts(
        rows,
        server_application_back_after_s=round(server_back - server_killed, 1),
        haproxy_back_after_s=round(haproxy_back - haproxy_killed, 1),
    )
    during_restart = [r for r in rows if server_killed <= r["started"] < server_back and r["kind"] != "index"]
    counts["inference_during_server_restart"] = len(during_restart)
    failed_during_restart = [
        {k: (round(v - server_killed, 3) if k in ("started", "ended") else v) for k, v in r.items()}
        for r in during_restart
        if r["outcome"] != "correct"
    ]
    counts["inference_failed_during_server_restart"] = len(failed_during_restart)

    def in_flight(r: dict[str, Any]) -> bool:  # on a process as it was killed (it took up to 0.5 s to go)
        return any(r["started"] < k + 0.5 and r["ended"] >= k for k in (server_killed, haproxy_killed))

    counts["lost_outside_in_flight"] = sum(r["outcome"] == "lost" and not in_flight(r) for r in rows)
    # HAProxy's restart, as the clients saw it: from the kill until the first index call that started
    # after it and was answered. A request's start is taken before it connects, and threads wait their
    # turn for the CPU, so a request that started a moment before either end may connect on the other
    # side of it: half a second either way, as for the requests in flight above.
    refused_outside = [
        round(r["started"] - haproxy_killed, 3)
        for r in rows
        if r["outcome"] == "refused" and not haproxy_killed - 0.5 <= r["started"] < haproxy_back + 0.5
    ]
    counts["refused_outside_haproxy_restart"] = len(refused_outside)
    _record(counts, "soak_control_plane.json")
    assert counts["wrong_answers"] == 0 and counts["lost_outside_in_flight"] == 0, counts
    assert refused_outside == [], (refused_outside, counts)  # seconds after the HAProxy kill
    assert all(
        r["status"] in (200, 503)
        for r in rows
        if r["kind"] == "index" and r["outcome"] not in ("refused", "lost")
    ), counts
    assert not [r for r in rows if r["status"] == 404 and r["kind"] == "valid"], counts
    assert during_restart and not failed_during_restart, (failed_during_restart, counts)


def _until_index_answers(
    server: Server, rows: list[dict[str, Any]], after: float, timeout_s: float = 120
) -> float:
    """When the traffic's repository-index calls started answering 200 again after ``after``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        answered = [
            r["started"]
            for r in list(rows)
            if r["kind"] == "index" and r["status"] == 200 and r["started"] > after + 0.5
        ]
        if answered:
            return min(answered)
        time.sleep(0.2)
    raise AssertionError(f"the repository index did not answer again within {timeout_s:.0f} s")
