"""Issue 14: a bounded soak, mixed valid and invalid traffic plus a replica kill, every request counted.

The short form (``SOAK_SECONDS``, default 15 s of traffic) runs with the suite; a longer run records its
counts: ``SOAK_SECONDS=180 SOAK_OUT=bench/results/soak/soak.json flock /tmp/triton-serve-tests.lock
.venv/bin/python -m pytest -q tests/serve/test_soak.py``.

Counted per request: sent, answered correctly (a valid request with the model's result, an invalid one
with a 4xx JSON error), failed (a JSON error where an answer was due), lost (no HTTP answer, or an
answer that is not Triton's JSON). Lost must be 0 outside the requests in flight on the killed replica (sent before its process was gone,
not answered before the kill).
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


def _send(url: str, model: str, body: bytes, timeout: float = 30.0) -> tuple[int, Any, float, float]:
    request = urllib.request.Request(
        f"{url}/v2/models/{model}/infer", data=body, headers={"Content-Type": "application/json"}
    )
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
    except (OSError, ValueError):
        return 0, None, started, time.monotonic()


def test_soak_mixed_traffic_with_a_replica_kill(server: Server) -> None:
    seconds = float(os.environ.get("SOAK_SECONDS", "15"))
    workers = 6
    rng = random.Random(14)
    rows: list[dict[str, Any]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def loop(worker: int) -> None:
        local = random.Random(worker)
        n = 0
        while not stop.is_set():
            model = MODELS[n % 2]
            n += 1
            if local.random() < 0.3:
                kind, body = local.choice(INVALID)
                valid, value = False, 0.0
            else:
                value = float(worker * 1_000_000 + n)
                kind, body = "valid", json.dumps(recovery_models.infer_body(value)).encode()
                valid = True
            status, doc, started, ended = _send(server.url, model, body)
            is_json_error = isinstance(doc, dict) and isinstance(doc.get("error"), str)
            if valid and status == 200:
                outcome = "correct" if doc["outputs"][0]["data"] == [value + 1] * 4 else "wrong"
            elif not valid and 400 <= status < 500 and is_json_error:
                outcome = "correct"
            elif status and is_json_error:
                outcome = "failed"
            else:
                outcome = "lost"
            with lock:
                rows.append(
                    {
                        "model": model,
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
    counts = {
        "seconds": seconds,
        "killed_model": victim_model,
        "sent": len(rows),
        "answered_correctly": sum(r["outcome"] == "correct" for r in rows),
        "failed": sum(r["outcome"] == "failed" for r in rows),
        "lost": sum(r["outcome"] == "lost" for r in rows),
        "wrong_answers": sum(r["outcome"] == "wrong" for r in rows),
        "in_flight_at_kill": len(in_flight),
        "lost_outside_in_flight": sum(r["outcome"] == "lost" and r not in in_flight for r in rows),
        "failed_by_status": _by_status([r for r in rows if r["outcome"] != "correct"]),
    }
    print(json.dumps(counts))
    out = os.environ.get("SOAK_OUT")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(counts, indent=2) + "\n")
    assert counts["wrong_answers"] == 0, counts
    assert counts["lost_outside_in_flight"] == 0, counts
    assert counts["answered_correctly"] > counts["sent"] * 0.5, counts


def _by_status(rows: list[dict[str, Any]]) -> dict[str, int]:
    found: dict[str, int] = {}
    for r in rows:
        key = f"{r['kind']}:{r['status']}"
        found[key] = found.get(key, 0) + 1
    return found
