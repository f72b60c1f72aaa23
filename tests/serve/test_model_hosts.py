"""Model hosts end to end (docs/hosts.md): pooled models in one shared host replica beside a model with
a deployment of its own, loaded on their first request, evicted under the host's memory budget with
no failed request, unloaded and loaded again through the repository API; real ``tritonclient`` HTTP
and gRPC through HAProxy. One server of its own for the module (tests/serve/standalone.py)."""

from __future__ import annotations

import http.client as http_client
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serve import processes
from tests.serve.counts import successes
from tests.serve.standalone import Server, http

MIB = 2**20
POOLED = [f"pooled_{i}" for i in range(4)]
DEDICATED = "dedicated_0"
ENSEMBLE = "pooled_chain"  # pooled_0 then pooled_1: pooled with them, all on the host
CRASHER = "pooled_crasher"  # ends its process on X = -1 (the last test)
MODEL_MIB = 40  # each pooled model holds this much while loaded
BUDGET_MIB = 100  # the host's models together: two fit, not three

MODEL_PY = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.add = float(config["parameters"]["ADD"]["string_value"])
        size = int(config["parameters"]["MIB"]["string_value"]) * 1048576
        self.block = bytearray(size)
        for i in range(0, size, 4096):
            self.block[i] = 1
        self.family = pb_utils.MetricFamily(
            name="pooled_calls_total", description="Requests a model ran", kind=pb_utils.MetricFamily.COUNTER
        )
        self.calls = self.family.Metric(labels={"model": args["model_name"]})

    def execute(self, requests):
        out = []
        for request in requests:
            self.calls.increment(1)
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if self.add == 0 and float(x[0]) == -1.0:  # the crasher: the whole host process ends
                import os

                os._exit(1)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", (x + self.add).astype(np.float32))]))
        return out
"""


def _config(name: str, add: int, mib: int, placement: str = "") -> str:
    extra = (
        f'parameters {{ key: "ray.placement" value: {{ string_value: "{placement}" }} }}\n'
        if placement
        else ""
    )
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        f'parameters {{ key: "ADD" value: {{ string_value: "{add}" }} }}\n'
        f'parameters {{ key: "MIB" value: {{ string_value: "{mib}" }} }}\n'
        f"{extra}"
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
    )


CHAIN = f"""
name: "{ENSEMBLE}"
platform: "ensemble"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
ensemble_scheduling {{ step [
  {{ model_name: "{POOLED[0]}" model_version: -1 input_map {{ key: "X" value: "X" }} output_map {{ key: "Y" value: "mid" }} }},
  {{ model_name: "{POOLED[1]}" model_version: -1 input_map {{ key: "X" value: "mid" }} output_map {{ key: "Y" value: "Y" }} }}
] }}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("hosts") / "repo"
    models = [(name, i + 1, MODEL_MIB, "") for i, name in enumerate(POOLED)]
    models.append((DEDICATED, 100, 1, "dedicated"))
    models.append((CRASHER, 0, 1, ""))
    for name, add, mib, placement in models:
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(MODEL_PY)
        (repo / name / "config.pbtxt").write_text(_config(name, add, mib, placement))
    (repo / ENSEMBLE / "1").mkdir(parents=True)
    (repo / ENSEMBLE / "config.pbtxt").write_text(CHAIN)
    srv = Server(
        repo,
        args={
            "model_control_mode": "explicit",
            "load_model": ["*"],
            "model_hosts": 1,
            "model_host_cpus": 0.2,
            "model_host_memory_bytes": BUDGET_MIB * MIB,
        },
    )
    try:
        srv.wait_ready([*POOLED, DEDICATED, CRASHER, ENSEMBLE])
        deadline = time.monotonic() + 120  # and the server itself: gRPC answers too
        while http(f"{srv.url}/v2/health/ready", timeout=5)[0] != 200:
            assert time.monotonic() < deadline, "the server never said ready"
            time.sleep(0.5)
        yield srv
    finally:
        srv.close()


def _http(server: Server) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.url.removeprefix("http://"))


def _infer_http(client: httpclient.InferenceServerClient, model: str, x: float = 1.0) -> float:
    inp = httpclient.InferInput("X", [1], "FP32")
    inp.set_data_from_numpy(np.array([x], dtype=np.float32))
    return float(client.infer(model, [inp]).as_numpy("Y")[0])


def _host_pids(server: Server) -> list[int]:
    return sorted(
        p for p in processes.alive(server.track()) if "ServeReplica:triton-hosts:" in processes.command(p)
    )


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def test_pooled_models_share_one_host_replica_beside_a_dedicated_one(server: Server) -> None:
    client = _http(server)
    index = {row["name"]: row["state"] for row in client.get_model_repository_index()}
    assert all(index[name] == "READY" for name in [*POOLED, DEDICATED])
    for i, name in enumerate(POOLED):
        assert client.is_model_ready(name)
        assert client.get_model_metadata(name)["name"] == name
        assert _infer_http(client, name) == 1.0 + i + 1
    assert _infer_http(client, DEDICATED) == 101.0
    # one host process for every pooled model; the dedicated model has its own replica, they none
    assert len(_host_pids(server)) == 1
    assert len(server.replica_pids(DEDICATED)) == 1
    assert all(server.replica_pids(name) == [] for name in POOLED)


def test_grpc_reaches_pooled_models(server: Server) -> None:
    grpc_port = server.config.read_text().split("grpc_port: ")[1].split()[0]
    with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
        assert client.is_model_ready(POOLED[1])
        inp = grpcclient.InferInput("X", [1], "FP32")
        inp.set_data_from_numpy(np.array([5.0], dtype=np.float32))
        assert float(client.infer(POOLED[1], [inp]).as_numpy("Y")[0]) == 7.0
        assert float(client.infer(DEDICATED, [inp]).as_numpy("Y")[0]) == 105.0


def test_walking_more_models_than_the_budget_evicts_and_fails_nothing(server: Server) -> None:
    """Four 40 MiB models through a 100 MiB budget, twice over: every answer right, and the host's memory
    never grows by the four models' 160 MiB (evicted models' memory is handed back)."""
    client = _http(server)
    (pid,) = _host_pids(server)
    for name in POOLED:  # every model resident once, whatever the earlier tests left
        _infer_http(client, name)
    start = _rss(pid)
    highest = start
    for _ in range(2):
        for i, name in enumerate(POOLED):
            assert _infer_http(client, name, x=2.0) == 2.0 + i + 1
            highest = max(highest, _rss(pid))
    assert highest - start < 2 * MODEL_MIB * MIB, f"host grew by {(highest - start) / MIB:.0f} MiB"
    stats = client.get_inference_statistics(POOLED[0])["model_stats"][0]
    deadline = time.monotonic() + 15  # the host pushes its statistics every second
    while int(stats["inference_stats"]["success"]["count"]) < 3 and time.monotonic() < deadline:
        time.sleep(0.5)
        stats = client.get_inference_statistics(POOLED[0])["model_stats"][0]
    assert int(stats["inference_stats"]["success"]["count"]) >= 3  # cumulative over its evictions


def test_metrics_count_the_hosts_loads_and_evictions(server: Server) -> None:
    """After the walk above (or on its own: each model called once loads it), ``/metrics`` holds the
    model host families, summed over host replicas (pushed every second), and the custom metric
    families the pooled models made in the host's process."""
    client = _http(server)
    for name in POOLED:
        _infer_http(client, name)
    port = server.config.read_text().split("metrics_port: ")[1].split()[0]
    deadline = time.monotonic() + 20
    while True:
        text = http(f"http://127.0.0.1:{port}/metrics", timeout=10)[2].decode()
        values = {
            line.split(" ")[0]: float(line.split(" ")[1])
            for line in text.splitlines()
            if line.startswith(("nv_model_host_", "pooled_calls_total"))
        }
        loads = [values.get(f'nv_model_host_load_total{{model="{name}"}}', 0) for name in POOLED]
        evictions = sum(values.get(f'nv_model_host_eviction_total{{model="{name}"}}', 0) for name in POOLED)
        # a model's custom families go with it when it is evicted (finalized), as in Triton
        resident_now = [n for n in POOLED if values.get(f'nv_model_host_resident{{model="{n}"}}', 0) >= 1]
        calls = [values.get(f'pooled_calls_total{{model="{name}"}}', 0) for name in resident_now]
        counted = all(n >= 1 for n in loads) and evictions >= 1 and calls and all(n >= 1 for n in calls)
        if counted or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert all(n >= 1 for n in loads), loads
    assert calls and all(n >= 1 for n in calls), calls  # the resident models' own family, from the host
    assert "# TYPE pooled_calls_total counter" in text
    assert evictions >= 1  # four 40 MiB models never fit a 100 MiB budget together
    resident = sum(values.get(f'nv_model_host_resident{{model="{name}"}}', 0) for name in POOLED)
    assert 1 <= resident <= 2


def test_unload_and_load_of_a_pooled_model(server: Server) -> None:
    client = _http(server)
    name = POOLED[3]
    assert _infer_http(client, name) == 5.0
    client.unload_model(name)
    index = {row["name"]: row.get("state") for row in client.get_model_repository_index()}
    assert index[name] == "UNAVAILABLE"
    deadline = time.monotonic() + 10  # hosts follow the pool every 2 s
    while time.monotonic() < deadline:
        try:
            _infer_http(client, name)
        except Exception as exc:  # the unloaded model is refused
            assert "unknown model" in str(exc) or "not" in str(exc)
            break
        time.sleep(0.5)
    else:
        pytest.fail("an unloaded pooled model still answered")
    client.load_model(name)
    time.sleep(2.5)  # past the hosts' pushes: none brings back what was counted before the unload
    assert successes(client, name) == 0  # loaded again, it counts from zero, as in Triton
    assert _infer_http(client, name) == 5.0
    deadline = time.monotonic() + 10
    while successes(client, name) != 1 and time.monotonic() < deadline:
        time.sleep(0.25)
    assert successes(client, name) == 1


def test_an_ensemble_of_pooled_models_is_pooled_with_them(server: Server) -> None:
    """The ensemble and its steps run in the one host process (no replica of its own); it adds both
    steps' constants (1, then 2), and the steps' statistics count the ensemble's calls."""
    client = _http(server)
    assert client.is_model_ready(ENSEMBLE)
    before = successes(client, POOLED[0])
    for x in (1.0, 5.0):
        assert _infer_http(client, ENSEMBLE, x=x) == x + 1 + 2
    assert all(server.replica_pids(name) == [] for name in [ENSEMBLE, *POOLED[:2]])
    assert len(_host_pids(server)) == 1
    deadline = time.monotonic() + 15  # the host pushes its statistics every second
    while successes(client, POOLED[0]) < before + 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert successes(client, POOLED[0]) >= before + 2
    assert successes(client, ENSEMBLE) >= 2


def test_a_model_that_ends_its_host_fails_only_its_own_request(server: Server) -> None:
    """The host process ends with the crashing request; the dedicated model answers throughout, and
    the pooled models answer again, loaded anew, once Serve has started the host again."""
    client = _http(server)
    assert _infer_http(client, CRASHER, x=3.0) == 3.0
    (before,) = _host_pids(server)
    # in flight on the process that ended: HAProxy closes the connection, or answers its 503 JSON
    with pytest.raises((InferenceServerException, http_client.HTTPException)) as crashed:
        _infer_http(client, CRASHER, x=-1.0)
    if isinstance(crashed.value, InferenceServerException):
        assert "try again" in str(crashed.value), crashed.value
    assert _infer_http(client, DEDICATED) == 101.0  # another model's own replica: untouched
    deadline = time.monotonic() + 120
    answered: dict[str, float] = {}
    while len(answered) < 2 and time.monotonic() < deadline:
        for name in (POOLED[2], CRASHER):
            if name not in answered:
                try:
                    answered[name] = _infer_http(client, name, x=1.0)
                except Exception:  # the host is starting again: 503 until then
                    time.sleep(0.5)
    assert answered == {POOLED[2]: 4.0, CRASHER: 1.0}
    assert before not in _host_pids(server)
    assert client.get_model_repository_index()  # the server application is unaffected
    index = {row["name"]: row.get("state") for row in client.get_model_repository_index()}
    assert index[CRASHER] == "READY" and index[DEDICATED] == "READY"
