"""A steady load on one model of the multi-node cluster, with an account of every request."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tools.netns_cluster import ClusterState, NodeSpec

Ask = Callable[[httpclient.InferenceServerClient], str]  # one request; returns who answered


def where_ask(model: str, delay_ms: int) -> Ask:
    """A request to a model of ``tests/cluster/conftest.WHERE_PY``: answers ``"<app> <replica>"``."""

    def ask(client: httpclient.InferenceServerClient) -> str:
        tensor = httpclient.InferInput("DELAY_MS", [1], "INT32")
        tensor.set_data_from_numpy(np.array([delay_ms], np.int32))
        app, replica = (
            bytes(s).decode() for s in client.infer(model, [tensor]).as_numpy("WHERE").reshape(-1)
        )
        return f"{app} {replica}"

    return ask


@dataclass
class Failure:
    at: float  # time.monotonic()
    status: str  # the HTTP status tritonclient reports ("" where none: a connection error)
    message: str


@dataclass
class Load:
    """``clients`` threads sending ``ask`` through the ingress of ``nodes`` in turn until stopped."""

    cluster: ClusterState
    ask: Ask
    nodes: Sequence[NodeSpec]
    clients: int = 2
    sent: int = 0
    answered: Counter[str] = field(default_factory=Counter)
    failures: list[Failure] = field(default_factory=list)
    last_answer_at: float = 0.0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(self.clients)
        ]

    def _run(self, index: int) -> None:
        node = self.nodes[index % len(self.nodes)]
        client = httpclient.InferenceServerClient(self.cluster.ingress(node), network_timeout=30.0)
        while not self._stop.is_set():
            try:
                who = self.ask(client)
            except Exception as exc:
                status = str(exc.status() or "") if isinstance(exc, InferenceServerException) else ""
                with self._lock:
                    self.sent += 1
                    self.failures.append(Failure(time.monotonic(), status, repr(exc)[:300]))
                time.sleep(0.05)  # a refused request comes back at once: do not spin
            else:
                with self._lock:
                    self.sent += 1
                    self.answered[who] += 1
                    self.last_answer_at = time.monotonic()

    def start(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def __enter__(self) -> Load:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def failed(self) -> int:
        return len(self.failures)

    def answered_since(self, moment: float) -> bool:
        return self.last_answer_at > moment

    def account(self, since: float) -> dict[str, Any]:
        """Requests sent, answered and failed, the failures' statuses, and when the last failure came
        (seconds after ``since``)."""
        with self._lock:
            statuses = Counter(f.status or "no status" for f in self.failures)
            last = max((f.at for f in self.failures), default=None)
            return {
                "sent": self.sent,
                "answered": sum(self.answered.values()),
                "failed": len(self.failures),
                "failed_by_status": dict(statuses),
                "last_failure_after_s": None if last is None else round(last - since, 2),
                "example_failures": sorted({f.message for f in self.failures})[:3],
            }


def wait_until(what: str, check: Callable[[], Any], timeout_s: float) -> float:
    """Seconds until ``check`` holds (checked every half second); fails after ``timeout_s``."""
    start = time.monotonic()
    while True:
        try:
            if check():
                return time.monotonic() - start
        except Exception:  # not there yet (a node's ingress restarting)
            pass
        assert time.monotonic() - start < timeout_s, f"not within {timeout_s:.0f}s: {what}"
        time.sleep(0.5)
