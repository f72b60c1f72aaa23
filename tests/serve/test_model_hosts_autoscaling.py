"""Model hosts autoscaled by Serve on the requests inside them (``model_host_autoscaling``,
docs/hosts.md): under load a second host replica starts and takes its share of the pooled models
(HAProxy's consistent hash moves some to it, where they load on their next request); without load
the hosts shrink back to one, and every model keeps answering. Real ``tritonclient`` over HTTP. One
server of its own for the module (tests/serve/standalone.py)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.serve import processes
from tests.serve.counts import successes
from tests.serve.standalone import Server

POOLED = [f"pooled_{i}" for i in range(16)]
DELAY_MS = 150  # each request's work: a few clients keep the host busy

# answers with the host replica it runs in, after DELAY_MS
MODEL_PY = """
import time

import numpy as np
from ray import serve
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.replica = serve.get_replica_context().replica_id.unique_id.encode()

    def execute(self, requests):
        out = []
        for request in requests:
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()
            time.sleep(float(delay.reshape(-1)[0]) / 1000.0)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("WHERE", np.array([self.replica], dtype=np.object_))]))
        return out
"""


def _config(name: str) -> str:
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "DELAY_MS" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "WHERE" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("hosts_autoscaling") / "repo"
    for name in POOLED:
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(MODEL_PY)
        (repo / name / "config.pbtxt").write_text(_config(name))
    srv = Server(
        repo,
        args={
            "model_hosts": 1,
            "model_host_cpus": 0.1,
            "model_host_autoscaling": {
                "max_replicas": 2,
                "target_ongoing_requests": 1,
                "upscale_delay_s": 1,
                "downscale_delay_s": 4,
                "metrics_interval_s": 0.5,
                "look_back_period_s": 2,
            },
        },
    )
    try:
        srv.wait_ready(POOLED)
        yield srv
    finally:
        srv.close()


def _where(client: httpclient.InferenceServerClient, model: str, delay_ms: int = 0) -> str:
    tensor = httpclient.InferInput("DELAY_MS", [1], "INT32")
    tensor.set_data_from_numpy(np.array([delay_ms], np.int32))
    return bytes(client.infer(model, [tensor]).as_numpy("WHERE").reshape(-1)[0]).decode()


def _host_pids(server: Server) -> list[int]:
    return sorted(
        p for p in processes.alive(server.track()) if "ServeReplica:triton-hosts:" in processes.command(p)
    )


def _until(what: str, check: object, timeout_s: float) -> float:
    start = time.monotonic()
    while not check():  # type: ignore[operator]
        assert time.monotonic() - start < timeout_s, f"not within {timeout_s:.0f}s: {what}"
        time.sleep(0.5)
    return time.monotonic() - start


def test_hosts_grow_under_load_share_the_models_and_shrink_after(server: Server) -> None:
    url = server.url.removeprefix("http://")
    answered: Counter[str] = Counter()
    per_model: Counter[str] = Counter()
    failures: list[str] = []
    stop = threading.Event()

    def client_loop(index: int) -> None:
        client = httpclient.InferenceServerClient(url, network_timeout=60.0)
        turn = index
        while not stop.is_set():
            model = POOLED[turn % len(POOLED)]
            turn += 1
            try:
                answered[_where(client, model, DELAY_MS)] += 1
                per_model[model] += 1
            except Exception as exc:  # counted: the test fails on any
                failures.append(f"{model}: {exc!r}"[:200])
        client.close()  # here, in its own thread: a client left to the collector closes in another

    assert len(_host_pids(server)) == 1
    threads = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(4)]
    for thread in threads:
        thread.start()
    try:
        up_s = _until("a second host replica answers", lambda: len(answered) >= 2, 120)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    print(f"host autoscaling: two replicas answering after {up_s:.1f}s of load; answers {dict(answered)}")
    assert failures == [], failures[:3]
    assert len(_host_pids(server)) == 2
    client = httpclient.InferenceServerClient(url, network_timeout=60.0)
    # a model's statistics count its requests on every host replica that ran them, whichever answers
    _until(
        "each model's statistics count every request it answered",
        lambda: all(successes(client, model) == per_model[model] for model in POOLED),
        15,
    )
    # HAProxy's hash spreads the models: each replica holds some of them, and a model stays on one
    homes = {model: _where(client, model) for model in POOLED}
    assert len(set(homes.values())) == 2, homes
    assert all(_where(client, model) == home for model, home in homes.items())
    down_s = _until("the hosts shrink back to one replica", lambda: len(_host_pids(server)) == 1, 120)
    print(f"host autoscaling: back to one replica {down_s:.1f}s after the load stopped")
    # the models of the replica that went load again on the one left
    assert len({_where(client, model) for model in POOLED}) == 1
    client.close()
