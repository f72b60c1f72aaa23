"""Model density: a repository of many small Python models, served by tritonserver and by this server
with model hosts (docs/hosts.md), one after the other on the same repository in one run.

For each server: the seconds from its start until ``/v2/health/ready`` answers 200 and every model is
listed READY, the memory of all its processes then (the sum of their proportional set sizes, PSS, so
shared pages count once), and, for every model in turn, the latency of its first request (a cold start
on a model host) and of a second one (warm), the memory after that walk, and again once the server
has idled ``SETTLE_S`` (what it keeps beside its models: this server's spare workers). ``BENCH_DENSITY_MODELS``
sets the number of models (default 60; 20 with ``--quick``), ``BENCH_DENSITY_HOSTS`` the host replicas
(default 1), ``BENCH_DENSITY_SERVERS`` which servers run (``tritonserver,this``; a repository of a
thousand Python models would start a thousand stub processes in tritonserver), and
``BENCH_DENSITY_KIND`` which models: ``python`` (the default), ``onnx`` (an ONNX Runtime identity
model of the same inputs and outputs, written here with ``onnx``, as a Triton user writes one: no
``instance_group``) or ``mixed`` (the two in turn). The results go to ``bench/results/density/``
(``density-<N>.json`` beside ``results.json`` where N is not 60 or the kind is not ``python``:
``density-<kind>-<N>.json``). The notes hold this server's figures over tritonserver's.

tritonserver's wheel here has only its Python backend, so the ONNX half of the density comparison
(issue: 60 small ONNX models) runs on this server alone (``BENCH_DENSITY_SERVERS=this``).
"""

from __future__ import annotations

import os
import statistics
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.cpu_split import take_snapshot
from bench.peers import PeerSetupError, ServerHandle, start_tritonserver
from bench.results import Report, write_json
from bench.scenarios.common import (
    BENCH_MODELS,
    RESULTS,
    free_port,
    log,
    make_repository,
    new_report,
    save_report,
    start_this_server,
    work_dir,
)

NAME = "density"
MODEL = "identity_py"
PEER = "tritonserver"
THIS = "this server (model hosts)"


def pss_bytes(root: int) -> int:
    """The summed PSS of process ``root`` and every process below it."""
    total = 0
    for pid in take_snapshot().descendants({root}):
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:  # it ended, or is not ours to read
            continue
        for line in text.splitlines():
            if line.startswith("Pss:"):
                total += int(line.split()[1]) * 1024
                break
    return total


def _index_ready(url: str, names: list[str]) -> bool:
    import json

    try:
        with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=5) as resp:
            if resp.status != 200:
                return False
        request = urllib.request.Request(f"http://{url}/v2/repository/index", data=b"{}", method="POST")
        with urllib.request.urlopen(request, timeout=10) as resp:
            rows = json.loads(resp.read())
    except OSError:
        return False
    ready = {row["name"] for row in rows if row.get("state") == "READY"}
    return set(names) <= ready


KINDS = ("python", "onnx", "mixed")


def onnx_identity(dest: Path) -> Path:
    """An ONNX Runtime model folder at ``dest`` with ``identity_py``'s inputs and outputs (``INPUT0`` to
    ``OUTPUT0``, FP32 [16], batched), its config without ``instance_group`` as most repositories have
    it (Triton's default then: two CPU instances; pooled on a model host)."""
    import onnx
    from onnx import TensorProto, helper

    (dest / "1").mkdir(parents=True, exist_ok=True)
    tensor_in = helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [None, 16])
    tensor_out = helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [None, 16])
    node = helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])
    graph = helper.make_graph([node], "identity", [tensor_in], [tensor_out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(dest / "1" / "model.onnx"))
    (dest / "config.pbtxt").write_text(
        f'name: "{dest.name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 64\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
    )
    return dest


def sources(kind: str, count: int, work: Path) -> list[tuple[Path, str]]:
    """The model folder each of the ``count`` models is copied from, and its name."""
    if kind not in KINDS:
        raise ValueError(f"BENCH_DENSITY_KIND must be one of {', '.join(KINDS)}, not {kind!r}")
    python = BENCH_MODELS / MODEL
    onnx_model = onnx_identity(work / "templates" / "identity_onnx") if kind != "python" else python
    picked = {"python": [python], "onnx": [onnx_model], "mixed": [python, onnx_model]}[kind]
    return [(picked[i % len(picked)], f"m{i:03d}") for i in range(count)]


def _infer_ms(client: Any, name: str) -> float:
    import tritonclient.http as httpclient

    data = np.ones((1, 16), dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    start = time.perf_counter()
    client.infer(name, [inp])
    return (time.perf_counter() - start) * 1000


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median": statistics.median(ordered),
        "p90": ordered[int(0.9 * (len(ordered) - 1))],
        "max": ordered[-1],
    }


SETTLE_S = 15.0  # idle after the walk before the last memory reading


def measure_server(start: Callable[[], ServerHandle], names: list[str]) -> dict[str, Any]:
    """Start one server, time its readiness, read its memory, walk every model cold then warm, idle."""
    import tritonclient.http as httpclient

    began = time.monotonic()
    handle = start()
    with handle:
        deadline = time.monotonic() + 900
        while not _index_ready(handle.url, names):
            if time.monotonic() > deadline:
                raise TimeoutError("not every model became READY")
            time.sleep(0.5)
        ready_s = time.monotonic() - began
        time.sleep(2)  # let start-up work settle before memory is read
        pss_ready = pss_bytes(handle.process.pid)
        processes = len(take_snapshot().descendants({handle.process.pid}))
        client = httpclient.InferenceServerClient(handle.url)
        first = [_infer_ms(client, name) for name in names]
        warm = [_infer_ms(client, name) for name in names]
        pss_walked = pss_bytes(handle.process.pid)
        # and once idle: what the server keeps beside its models (this server: its spare workers,
        # started a few seconds after the replicas, docs/recovery.md)
        time.sleep(SETTLE_S)
        pss_settled = pss_bytes(handle.process.pid)
        processes_settled = len(take_snapshot().descendants({handle.process.pid}))
    return {
        "ready_s": ready_s,
        "pss_ready_bytes": pss_ready,
        "pss_after_walk_bytes": pss_walked,
        "pss_ready_gb": pss_ready / 1e9,
        "pss_after_walk_gb": pss_walked / 1e9,
        "pss_settled_bytes": pss_settled,
        "pss_settled_gb": pss_settled / 1e9,
        "processes": processes,
        "processes_settled": processes_settled,
        "first_request_ms": _summary(first),
        "warm_request_ms": _summary(warm),
    }


def run(quick: bool = False) -> Report:
    """Run the scenario and save it under ``bench/results/density/``."""
    work = work_dir(NAME)
    count = int(os.environ.get("BENCH_DENSITY_MODELS", "20" if quick else "60"))
    hosts = int(os.environ.get("BENCH_DENSITY_HOSTS", "1"))
    kind = os.environ.get("BENCH_DENSITY_KIND", "python")
    models = sources(kind, count, work)
    names = [name for _, name in models]
    repo = make_repository(work / "repo", [(source, name, None) for source, name in models])
    model = MODEL if kind == "python" else f"{kind}: {', '.join(sorted({s.name for s, _ in models}))}"
    report = new_report(NAME, model=model, models=count, host_replicas=hosts, kind=kind)
    servers: list[tuple[str, Callable[[], ServerHandle]]] = [
        (
            PEER,
            lambda: start_tritonserver(
                repo, free_port(), free_port(), free_port(), log_path=work / "t.log", timeout=900
            ),
        ),
        (
            THIS,
            lambda: start_this_server(
                repo,
                free_port(),
                grpc_port=free_port(),
                log_path=work / "this.log",
                timeout=900,
                extra_args=["--model-hosts", str(hosts)],
            ),
        ),
    ]
    chosen = os.environ.get("BENCH_DENSITY_SERVERS", "tritonserver,this").split(",")
    servers = [(label, start) for label, start in servers if label.split(" ")[0] in chosen]
    results: dict[str, Any] = {}
    for label, start in servers:
        log(f"{NAME}: {label} on {count} models")
        try:
            results[label] = measure_server(start, names)
        except (PeerSetupError, TimeoutError) as exc:
            report.notes.setdefault("skipped", {})[label] = str(exc)[-600:]
            continue
        log(f"{NAME}: {label}: {results[label]}")
    report.notes["servers"] = results
    if PEER in results and THIS in results:
        peer, this = results[PEER], results[THIS]
        report.notes["this_over_peer"] = {
            "ready_s": this["ready_s"] / peer["ready_s"],
            "pss_ready": this["pss_ready_bytes"] / peer["pss_ready_bytes"],
            "pss_after_walk": this["pss_after_walk_bytes"] / peer["pss_after_walk_bytes"],
            "pss_settled": this["pss_settled_bytes"] / peer["pss_settled_bytes"],
            "warm_request_median": this["warm_request_ms"]["median"] / peer["warm_request_ms"]["median"],
        }
    if count == 60 and kind == "python":
        log(f"{NAME}: results in {save_report(report, 'Model density')}")
    else:
        path = (
            RESULTS / NAME / (f"density-{count}.json" if kind == "python" else f"density-{kind}-{count}.json")
        )
        write_json(report, path)
        log(f"{NAME}: results in {path}")
    return report
