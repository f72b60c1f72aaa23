"""Closed-loop load on one model with a replica killed (``kill -9``) in the middle; every request's fate.

Used by tests/serve/test_recovery.py and test_soak.py, and by ``python -m tests.serve.recovery_load``,
which records the time to recover and the requests lost in bench/results/recovery/.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.serve import processes
from tests.serve.recovery_models import infer_body

INGRESS_NOTICE_S = 1.0


@dataclass
class Outcome:
    started: float
    ended: float
    status: int  # 0: no HTTP answer at all (connection reset / refused)
    json_error: bool = False
    correct: bool = False


@dataclass
class KillReport:
    model: str
    replicas: int
    workers: int
    killed_pid: int
    kill_at: float
    died_at: float  # when the process was gone (a request sent before then may have reached it)
    outcomes: list[Outcome] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        after = [o for o in self.outcomes if o.started >= self.kill_at]
        failures = [o for o in self.outcomes if not o.correct]
        first_ok_after = min((o.ended for o in after if o.correct), default=None)
        last_failure = max((o.ended for o in failures), default=None)
        in_flight = [o for o in self.outcomes if o.started < self.died_at and o.ended >= self.kill_at]
        return {
            "model": self.model,
            "replicas": self.replicas,
            "workers": self.workers,
            "sent": len(self.outcomes),
            "answered_correctly": sum(o.correct for o in self.outcomes),
            "failed_with_json_error": sum(1 for o in failures if o.status and o.json_error),
            "failed_not_json": sum(1 for o in failures if o.status and not o.json_error),
            "lost_no_answer": sum(1 for o in failures if not o.status),
            "in_flight_at_kill": len(in_flight),
            "failed_outside_in_flight": sum(1 for o in failures if o not in in_flight),
            # HAProxy learns of the death from a failed connection: a request sent just after it on a
            # connection HAProxy kept open to the dead replica fails too (it is not replayed, as it may
            # have run); later ones must not
            "failed_after_ingress_saw_it_gone": sum(
                1 for o in failures if o.started >= self.died_at + INGRESS_NOTICE_S
            ),
            "first_answer_after_kill_s": None
            if first_ok_after is None
            else round(first_ok_after - self.kill_at, 2),
            "last_failure_after_kill_s": None
            if last_failure is None
            else round(last_failure - self.kill_at, 2),
        }


def one_request(url: str, model: str, value: float, timeout: float = 30.0) -> Outcome:
    body = json.dumps(infer_body(value)).encode()
    request = urllib.request.Request(
        f"{url}/v2/models/{model}/infer", data=body, headers={"Content-Type": "application/json"}
    )
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data = json.loads(response.read())
            out = data["outputs"][0]["data"]
            return Outcome(started, time.monotonic(), response.status, correct=out == [value + 1] * 4)
    except urllib.error.HTTPError as error:
        raw = error.read()
        try:
            is_json = "error" in json.loads(raw)
        except ValueError:
            is_json = False
        return Outcome(started, time.monotonic(), error.code, json_error=is_json)
    except OSError:
        return Outcome(started, time.monotonic(), 0)


def kill_under_load(
    url: str,
    model: str,
    replica_pids: Any,
    *,
    replicas: int,
    workers: int = 6,
    before_s: float = 3.0,
    after_s: float = 15.0,
) -> KillReport:
    """Load ``model`` with ``workers`` closed loops; ``kill -9`` its first replica after ``before_s``."""
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    stop = threading.Event()

    def loop(worker: int) -> None:
        n = 0
        while not stop.is_set():
            outcome = one_request(url, model, float(worker * 100_000 + n))
            n += 1
            with lock:
                outcomes.append(outcome)

    threads = [threading.Thread(target=loop, args=(w,), daemon=True) for w in range(workers)]
    for t in threads:
        t.start()
    time.sleep(before_s)
    pid = replica_pids(model)[0]
    kill_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    died_at = processes.wait_gone(pid)
    time.sleep(after_s)
    stop.set()
    for t in threads:
        t.join(60)
    return KillReport(model, replicas, workers, pid, kill_at, died_at, outcomes)


MODELS = (("add_one", 1), ("add_two_replicas", 2))


def kill_each(
    url: str, replica_pids: Any, wait_ready: Callable[[str], None], after_s: float, settle_s: float = 0.0
) -> list[dict[str, Any]]:
    """Each recovery model's first replica killed under load, one after the other: their summaries."""
    results = []
    for model, replicas in MODELS:
        wait_ready(model)
        time.sleep(settle_s)  # a replica that has run a while (its node's spare worker started)
        report = kill_under_load(url, model, replica_pids, replicas=replicas, after_s=after_s)
        results.append(report.summary())
        print(json.dumps(results[-1]), flush=True)
        wait_ready(model)
        time.sleep(3)
    return results


def _serve_this_tree(repo: Path, after_s: float, settle_s: float = 0.0) -> list[dict[str, Any]]:
    from tests.serve.standalone import Server

    server = Server(repo, args={"model_control_mode": "explicit", "load_model": [m for m, _ in MODELS]})
    try:
        return kill_each(server.url, server.replica_pids, lambda m: server.wait_ready([m]), after_s, settle_s)
    finally:
        server.close()


def _serve_revision(repo: Path, revision: str, after_s: float, settle_s: float = 0.0) -> list[dict[str, Any]]:
    """The same load on the server of an earlier revision (a worktree under bench/.work/), started as
    the ``revisions`` bench scenario starts one; its replicas found among its descendants."""
    from bench.scenarios.common import free_port, start_this_server, work_dir
    from bench.scenarios.revisions import base_worktree

    work = work_dir("recovery")
    _, tree = base_worktree(revision, work)
    handle = start_this_server(repo, free_port(), log_path=work / "base.log", tree=tree)

    def replica_pids(model: str) -> list[int]:
        tag = f"ServeReplica:model-{model}:"
        return sorted(p for p in processes.descendants(handle.process.pid) if tag in processes.command(p))

    def wait_ready(model: str) -> None:
        deadline = time.monotonic() + 120
        while not one_request(f"http://{handle.url}", model, 1.0, timeout=5).correct:
            if time.monotonic() > deadline:
                raise RuntimeError(f"model '{model}' of {revision} did not answer")
            time.sleep(0.5)

    with handle:
        return kill_each(f"http://{handle.url}", replica_pids, wait_ready, after_s, settle_s)


def main() -> None:
    """Start a server on the recovery models, kill each model's replica under load, write the results."""
    import tempfile

    from tests.serve import recovery_models

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results/recovery/after.json")
    parser.add_argument("--after-s", type=float, default=15.0)
    parser.add_argument("--revision", default="", help="measure the server of this git revision instead")
    parser.add_argument("--settle-s", type=float, default=0.0, help="pause before each model's kill")
    args = parser.parse_args()
    repo = recovery_models.build(Path(tempfile.mkdtemp(prefix="trs-repo-")))
    if args.revision:
        results = _serve_revision(repo, args.revision, args.after_s, args.settle_s)
    else:
        results = _serve_this_tree(repo, args.after_s, args.settle_s)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    revision = f" --revision {args.revision}" if args.revision else ""
    if args.settle_s:
        revision += f" --settle-s {args.settle_s:g}"
    command = (
        "flock /tmp/triton-serve-tests.lock .venv/bin/python -m tests.serve.recovery_load "
        f"--out {args.out}{revision}"
    )
    out.write_text(json.dumps({"command": command, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
