"""Model control end to end on the shared server (EXPLICIT mode): load, unload, reload with overrides,
zero lost requests across a reload, a failed reload keeping the old version, version policy changes,
ensembles with ``unload_dependents``, warmup before ready, and the repository API's refusals.

Each model here is written into the shared repository by its test (the server loaded ``*`` at start,
so these are new to it). A steady client loop runs where a test claims something keeps serving."""

from __future__ import annotations

import concurrent.futures
import json
import os
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.serve.counts import successes

pytestmark = pytest.mark.serve

FACTOR_PY = textwrap.dedent(
    """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    FACTOR = {factor}

    class TritonPythonModel:
        def initialize(self, args):
            self.version = int(args["model_version"])
            {init}

        def execute(self, requests):
            out = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                y = (x * FACTOR * self.version).astype(np.float32)
                out.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", y)]))
            return out
    """
)

WARMUP_PY = textwrap.dedent(
    """
    import time
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.log = {log!r}

        def execute(self, requests):
            with open(self.log, "a") as f:
                for request in requests:
                    f.write(f"{{time.time()}}\\n")
            return [
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())
                    ]
                )
                for r in requests
            ]
    """
)


def config(name: str, extra: str = "", max_batch: int = 8) -> str:
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch}\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n" + extra
    )


def write_model(
    repo: Path,
    name: str,
    versions: tuple[int, ...] = (1,),
    factor: int = 1,
    extra: str = "",
    init: str = "pass",
) -> None:
    for v in versions:
        (repo / name / str(v)).mkdir(parents=True, exist_ok=True)
        (repo / name / str(v) / "model.py").write_text(FACTOR_PY.format(factor=factor, init=init))
    (repo / name / "config.pbtxt").write_text(config(name, extra))


def post(url: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body or {}).encode()
    request = urllib.request.Request(f"http://{url}{path}", data=data, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else {}
    except urllib.error.HTTPError as error:
        raw = error.read()
        return error.code, json.loads(raw) if raw else {}


def get_status(url: str, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://{url}{path}", timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def index(url: str) -> dict[str, list[dict[str, Any]]]:
    rows: dict[str, list[dict[str, Any]]] = {}
    for row in post(url, "/v2/repository/index")[1]:  # type: ignore[union-attr]
        rows.setdefault(row["name"], []).append(row)
    return rows


def infer(client: httpclient.InferenceServerClient, model: str, version: str = "") -> tuple[float, str]:
    """``(OUTPUT0[0] for an input of ones, the answering version)``."""
    x = np.ones((1, 4), dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer(model, [inp], model_version=version)
    return float(result.as_numpy("OUTPUT0")[0, 0]), str(result.get_response()["model_version"])


@dataclass
class Load:
    """A steady, bounded client loop on one model: what it saw."""

    ok: int = 0
    failures: list[str] = field(default_factory=list)
    values: list[tuple[float, float]] = field(default_factory=list)  # (time, OUTPUT0[0])


@contextmanager
def steady_load(url: str, model: str, clients: int = 2, max_s: float = 300.0) -> Iterator[Load]:
    load = Load()
    stop = threading.Event()
    deadline = time.monotonic() + max_s

    def loop() -> None:
        client = httpclient.InferenceServerClient(url, network_timeout=60)
        try:
            while not stop.is_set() and time.monotonic() < deadline:
                try:
                    value, _ = infer(client, model)
                    load.ok += 1
                    load.values.append((time.monotonic(), value))
                except Exception as exc:
                    load.failures.append(str(exc)[:200])
                time.sleep(0.005)
        finally:
            client.close()

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        yield load
        time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join(60)


@pytest.fixture(scope="module")
def client(server_url: str) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(server_url)
    yield c
    c.close()


def test_unknown_invalid_and_uploading_loads_record_nothing(server_url: str, test_repository: Path) -> None:
    before = index(server_url)
    ready = get_status(server_url, "/v2/health/ready")
    status, body = post(server_url, "/v2/repository/models/doesnotexist/load")
    assert status == 400 and "failed to poll from model repository" in body["error"]
    assert str(test_repository) not in body["error"]
    status, body = post(server_url, "/v2/repository/models/" + "x" * 300 + "/load")  # over 255
    assert status == 400 and "invalid model name" in body["error"] and len(body["error"]) < 300
    files = {"config": json.dumps({"backend": "python"}), "file:1/model.py": "cHJpbnQoKQ=="}
    status, body = post(server_url, "/v2/repository/models/uploaded/load", {"parameters": files})
    assert status == 400 and "allow_model_file_upload" in body["error"]
    assert index(server_url) == before and get_status(server_url, "/v2/health/ready") == ready


def test_explicit_load_override_and_unload_while_others_keep_serving(
    server_url: str, test_repository: Path, client: httpclient.InferenceServerClient
) -> None:
    write_model(test_repository, "mc_explicit")
    assert "state" not in index(server_url)["mc_explicit"][0]  # in the repository, never loaded
    with steady_load(server_url, "multi_version") as load:
        assert post(server_url, "/v2/repository/models/mc_explicit/load")[0] == 200
        assert infer(client, "mc_explicit") == (1.0, "1")
        override = {
            "name": "mc_explicit",
            "backend": "python",
            "max_batch_size": 2,
            "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        }
        status, _ = post(
            server_url,
            "/v2/repository/models/mc_explicit/load",
            {"parameters": {"config": json.dumps(override)}},
        )
        assert status == 200
        assert client.get_model_config("mc_explicit")["max_batch_size"] == 2
        assert post(server_url, "/v2/repository/models/mc_explicit/unload")[0] == 200
        assert not client.is_model_ready("mc_explicit")
        assert index(server_url)["mc_explicit"][0]["state"] == "UNAVAILABLE"
        assert index(server_url)["mc_explicit"][0]["reason"] == "unloaded"
    assert load.failures == [] and load.ok > 0


def test_reload_under_load_loses_nothing_and_a_failed_reload_keeps_the_old_version(
    server_url: str, test_repository: Path, client: httpclient.InferenceServerClient
) -> None:
    repo = test_repository
    write_model(repo, "mc_reload")
    assert post(server_url, "/v2/repository/models/mc_reload/load")[0] == 200
    with steady_load(server_url, "mc_reload", clients=4) as load:
        # a new version (latest policy: 2 replaces 1)
        write_model(repo, "mc_reload", (1, 2))
        assert post(server_url, "/v2/repository/models/mc_reload/load")[0] == 200
        moved = time.monotonic()
        assert infer(client, "mc_reload") == (2.0, "2")
        # a changed model file
        write_model(repo, "mc_reload", (1, 2), factor=10)  # another size: no stale bytecode
        assert post(server_url, "/v2/repository/models/mc_reload/load")[0] == 200
        assert infer(client, "mc_reload") == (20.0, "2")
        # a new version whose initialize() fails: the reload fails, version 2 keeps serving
        write_model(repo, "mc_reload", (3,), init='raise RuntimeError("weights file is corrupt")')
        status, body = post(server_url, "/v2/repository/models/mc_reload/load")
        assert status == 400 and "weights file is corrupt" in body["error"]
        assert str(repo) not in body["error"]
        assert infer(client, "mc_reload") == (20.0, "2")
        assert index(server_url)["mc_reload"][0]["state"] == "READY"
        time.sleep(max(0.0, moved + 3.0 - time.monotonic()))  # answers well after the move, read below
    assert load.failures == [], load.failures[:5]
    assert load.ok > 50
    late = [v for t, v in load.values if t > moved + 2.0]
    assert late and set(late) <= {2.0, 20.0}


def test_version_policy_changes_apply_live(server_url: str, test_repository: Path) -> None:
    repo = test_repository
    write_model(repo, "mc_versions", (1, 2))
    assert post(server_url, "/v2/repository/models/mc_versions/load")[0] == 200
    assert get_status(server_url, "/v2/models/mc_versions/versions/1/ready") == 400
    with steady_load(server_url, "mc_versions") as load:
        write_model(repo, "mc_versions", (1, 2), extra="version_policy: { all { } }\n")
        assert post(server_url, "/v2/repository/models/mc_versions/load")[0] == 200
        assert get_status(server_url, "/v2/models/mc_versions/versions/1/ready") == 200
        assert get_status(server_url, "/v2/models/mc_versions/versions/2/ready") == 200
        write_model(repo, "mc_versions", (1, 2), extra="version_policy: { specific { versions: [ 1 ] } }\n")
        assert post(server_url, "/v2/repository/models/mc_versions/load")[0] == 200
        assert get_status(server_url, "/v2/models/mc_versions/versions/1/ready") == 200
        assert get_status(server_url, "/v2/models/mc_versions/versions/2/ready") == 400
    assert load.failures == [] and load.ok > 0
    rows = index(server_url)["mc_versions"]
    assert [(r["version"], r["state"]) for r in rows] == [("1", "READY")]


def test_a_reload_loads_again_only_the_versions_whose_files_changed(
    server_url: str, test_repository: Path, tmp_path: Path
) -> None:
    """Triton's reload: a version whose files did not change serves on as loaded (its ``initialize``
    does not run again), a changed or new one loads, and a file beside the versions loads them all."""
    log = tmp_path / "initialized.log"
    init = f"open({str(log)!r}, 'a').write(f'init {{self.version}}\\n')"
    folder = test_repository / "mc_kept"
    write_model(test_repository, "mc_kept", (1, 2, 3), init=init)

    def load(versions: str) -> None:
        (folder / "config.pbtxt").write_text(
            config("mc_kept", f"version_policy: {{ specific {{ versions: [ {versions} ] }} }}\n")
        )
        assert post(server_url, "/v2/repository/models/mc_kept/load")[0] == 200

    def initialized() -> dict[str, int]:
        lines = log.read_text().split() if log.exists() else []
        return {v: lines.count(v) for v in ("1", "2", "3")}

    try:
        load("1, 2")
        assert initialized() == {"1": 1, "2": 1, "3": 0}
        later = time.time() + 10
        os.utime(folder / "2" / "model.py", (later, later))  # version 2's file changed
        load("1, 2, 3")
        assert initialized() == {"1": 1, "2": 2, "3": 1}
        for version in ("1", "2", "3"):
            assert get_status(server_url, f"/v2/models/mc_kept/versions/{version}/ready") == 200
        (folder / "dependency.py").write_text("SHARED = 1\n")  # beside the versions: all load again
        load("1, 2, 3")
        assert initialized() == {"1": 2, "2": 3, "3": 2}
    finally:
        post(server_url, "/v2/repository/models/mc_kept/unload")


def test_an_ensemble_loads_its_steps_and_unload_dependents_unloads_them(
    server_url: str, test_repository: Path, client: httpclient.InferenceServerClient
) -> None:
    repo = test_repository
    write_model(repo, "mc_step", factor=3)
    (repo / "mc_ensemble" / "1").mkdir(parents=True)
    (repo / "mc_ensemble" / "config.pbtxt").write_text(
        'name: "mc_ensemble"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'ensemble_scheduling { step [ { model_name: "mc_step" model_version: -1 '
        'input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } } ] }\n'
    )
    assert post(server_url, "/v2/repository/models/mc_ensemble/load")[0] == 200
    assert client.is_model_ready("mc_step") and client.is_model_ready("mc_ensemble")
    inp = httpclient.InferInput("IN", [1, 4], "FP32")
    inp.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    assert float(client.infer("mc_ensemble", [inp]).as_numpy("OUT")[0, 0]) == 3.0
    assert post(server_url, "/v2/repository/models/mc_ensemble/unload")[0] == 200
    assert client.is_model_ready("mc_step") and not client.is_model_ready("mc_ensemble")
    assert post(server_url, "/v2/repository/models/mc_ensemble/load")[0] == 200
    body = {"parameters": {"unload_dependents": True}}
    assert post(server_url, "/v2/repository/models/mc_ensemble/unload", body)[0] == 200
    assert not client.is_model_ready("mc_step") and not client.is_model_ready("mc_ensemble")


def test_warmup_requests_reach_the_model_before_it_reports_ready(
    server_url: str, test_repository: Path, client: httpclient.InferenceServerClient, tmp_path: Path
) -> None:
    log = tmp_path / "executed.log"
    folder = test_repository / "mc_warmup"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(WARMUP_PY.format(log=str(log)))
    warmup = (
        'model_warmup [ { name: "ones" batch_size: 1 count: 2 '
        'inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 4 ] random_data: true } } } ]\n'
    )
    (folder / "config.pbtxt").write_text(config("mc_warmup", warmup))
    assert post(server_url, "/v2/repository/models/mc_warmup/load")[0] == 200
    ready_at = time.time()
    assert client.is_model_ready("mc_warmup")
    times = [float(t) for t in log.read_text().split()]
    assert len(times) == 2 and all(t < ready_at for t in times)  # the sample's two warmup requests
    post(server_url, "/v2/repository/models/mc_warmup/unload")


def test_a_load_no_node_can_place_fails_soon_and_model_control_goes_on(
    server_url: str, test_repository: Path, client: httpclient.InferenceServerClient
) -> None:
    """Every free CPU taken (an actor holds them): the load fails once Serve says no node can take its
    replica (10 s) and ``placement_timeout_s`` (5 s here) passed, naming what was asked for, instead of
    holding model control for ``deploy_timeout_s``; with the CPUs back, the same load succeeds."""
    import ray

    write_model(test_repository, "mc_unplaced")
    write_model(test_repository, "mc_idle")  # in the repository, never loaded
    free = ray.available_resources().get("CPU", 0.0)

    @ray.remote
    class Holder:
        def ping(self) -> bool:
            return True

    holder = Holder.options(num_cpus=free).remote() if free > 0 else None
    try:
        if holder is not None:
            ray.get(holder.ping.remote(), timeout=60)
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(post, server_url, "/v2/repository/models/mc_unplaced/load")
            time.sleep(1.0)  # the load is under way, waiting for a node
            # model control answers for another model meanwhile (one lock per model)
            assert post(server_url, "/v2/repository/models/mc_idle/unload")[0] == 200
            assert not pending.done()
            status, body = pending.result(timeout=150)
        took = time.monotonic() - started
        assert status == 400, body
        assert "no node has the resources its replicas need" in body["error"], body
        assert "Resources required for each replica" in body["error"]
        assert took < 120, took
        row = index(server_url)["mc_unplaced"][0]
        assert row["state"] == "UNAVAILABLE" and "no node has the resources" in row["reason"]
        assert client.is_model_ready("multi_version")
    finally:
        if holder is not None:
            ray.kill(holder)
    try:
        assert post(server_url, "/v2/repository/models/mc_unplaced/load")[0] == 200
        assert infer(client, "mc_unplaced") == (1.0, "1")
    finally:
        post(server_url, "/v2/repository/models/mc_unplaced/unload")


BATCH_WHO_PY = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        seen = np.array([[len(requests), os.getpid(), 0, 0]], dtype=np.float32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", seen)]) for _ in requests]
"""


def test_a_batched_models_concurrent_requests_meet_in_one_replicas_batch(
    server_url: str, test_repository: Path, client: httpclient.InferenceServerClient
) -> None:
    """Two replicas, dynamic batching with a preferred batch of 2 and a 3 s queue delay: two requests
    sent together are answered by one batch of 2 in one replica (HAProxy fills one replica's batcher
    first, as Triton's one queue per model does), not by a batch of 1 in each after the delay."""
    name = "mc_batched"
    (test_repository / name / "1").mkdir(parents=True, exist_ok=True)
    (test_repository / name / "1" / "model.py").write_text(BATCH_WHO_PY)
    batching = "dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 3000000 }\n"
    text = config(name, batching).replace("count: 1", "count: 2")
    (test_repository / name / "config.pbtxt").write_text(text)
    assert post(server_url, f"/v2/repository/models/{name}/load")[0] == 200

    def pair() -> list[tuple[int, int]]:
        """(batch size, pid) that each of two requests sent together (a client each) saw."""
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            return list(pool.map(lambda _: _seen(server_url, name), range(2)))

    try:
        # HAProxy takes the model's routes when Serve reloads it, a moment after the load returns
        for _ in range(10):
            if pair()[0][0] == 2:
                break
        else:
            raise AssertionError("two requests sent together were never batched")
        for _ in range(3):
            first, second = pair()
            assert first == second and first[0] == 2, (first, second)
    finally:
        post(server_url, f"/v2/repository/models/{name}/unload")


def _seen(url: str, model: str) -> tuple[int, int]:
    client = httpclient.InferenceServerClient(url)
    try:
        inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        out = client.infer(model, [inp]).as_numpy("OUTPUT0")
    finally:
        client.close()
    return int(out[0, 0]), int(out[0, 1])


def _until_successes(client: httpclient.InferenceServerClient, model: str, count: int) -> None:
    """Until the statistics count ``count`` successes of ``model`` (replicas push theirs within seconds)."""
    deadline = time.monotonic() + 15
    while successes(client, model) != count:
        assert time.monotonic() < deadline, successes(client, model)
        time.sleep(0.2)


def test_a_model_loaded_again_after_an_unload_counts_from_zero(
    server_url: str, test_repository: Path, client: httpclient.InferenceServerClient
) -> None:
    # as Triton's (L0_lifecycle test_dynamic_model_load_unload): its old replicas' counts, and any
    # push they send while they stop, went with them
    write_model(test_repository, "mc_counts")
    assert post(server_url, "/v2/repository/models/mc_counts/load")[0] == 200
    for _ in range(3):
        infer(client, "mc_counts")
    _until_successes(client, "mc_counts", 3)
    assert post(server_url, "/v2/repository/models/mc_counts/unload")[0] == 200
    assert post(server_url, "/v2/repository/models/mc_counts/load")[0] == 200
    for _ in range(4):  # a few push intervals: still nothing counted
        assert successes(client, "mc_counts") == 0
        time.sleep(0.5)
    infer(client, "mc_counts")
    _until_successes(client, "mc_counts", 1)
    assert post(server_url, "/v2/repository/models/mc_counts/unload")[0] == 200
