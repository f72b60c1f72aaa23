"""Requests from any node of a three-node cluster, and where replicas are placed.

Every node runs an HAProxy ingress (``proxy_location: EveryNode``); the head node
declares no CPUs (the server application is pinned there), so every model replica runs on a worker node and a request
through the head's ingress always crosses to another node. Answers are checked
against references computed here (the examples' own functions, ONNX Runtime,
TorchScript), through each node in turn, with the unmodified Triton HTTP client.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from deployments.serve import haproxy_shim, local_sockets
from repository_loader.plan import SERVER_APP
from tools import netns_cluster
from tools.netns_cluster import HEAD, NODES, ClusterState

pytestmark = [pytest.mark.multinode, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "model_repository"
EXAMPLE_MODELS = sorted(p.name for p in EXAMPLES.iterdir() if (p / "config.pbtxt").is_file())
WORKERS = [n for n in NODES if not n.head]
GPU_NODE = next(n for n in NODES if n.num_gpus > 0)
ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
RNG = np.random.default_rng(19)
IMAGE = (np.indices((48, 160)).sum(axis=0) % 256).astype(np.uint8)[np.newaxis]


def _module(model: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{model}", EXAMPLES / model / "1" / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def _crnn() -> Any:
    import onnxruntime

    return onnxruntime.InferenceSession(
        str(EXAMPLES / "crnn" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )


def crnn_reference(x: np.ndarray) -> np.ndarray:
    session = _crnn()
    return session.run(None, {session.get_inputs()[0].name: x})[0]  # type: ignore[no-any-return]


def infer(
    client: httpclient.InferenceServerClient, model: str, tensors: dict[str, tuple[np.ndarray, str]]
) -> Any:
    inputs = []
    for name, (array, dtype) in tensors.items():
        tensor = httpclient.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return client.infer(model, inputs)


def check_add_sub(client: httpclient.InferenceServerClient) -> None:
    a, b = np.arange(8, dtype=np.float32).reshape(2, 4), np.full((2, 4), 3, np.float32)
    result = infer(client, "add_sub", {"INPUT0": (a, "FP32"), "INPUT1": (b, "FP32")})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def check_identity_fp32(client: httpclient.InferenceServerClient) -> None:
    x = np.linspace(-1, 1, 16, dtype=np.float32)
    np.testing.assert_array_equal(
        infer(client, "identity_fp32", {"INPUT0": (x, "FP32")}).as_numpy("OUTPUT0"), x
    )


def check_string_upper(client: httpclient.InferenceServerClient) -> None:
    words = np.array([b"node", b"Ray serve"], dtype=np.object_)
    out = infer(client, "string_upper", {"INPUT0": (words, "BYTES")}).as_numpy("OUTPUT0")
    assert out.tolist() == [b"NODE", b"RAY SERVE"]


def check_auto_complete_scale(client: httpclient.InferenceServerClient) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(
        infer(client, "auto_complete_scale", {"INPUT0": (x, "FP32")}).as_numpy("OUTPUT0"), 2 * x
    )


def check_image_preprocess(client: httpclient.InferenceServerClient) -> None:
    out = infer(client, "image_preprocess", {"IMAGE": (IMAGE, "UINT8")}).as_numpy("PREPROCESSED")
    np.testing.assert_allclose(out, _module("image_preprocess").preprocess(IMAGE), rtol=1e-6)


def check_crnn(client: httpclient.InferenceServerClient) -> None:
    x = RNG.uniform(-1, 1, (2, 1, 32, 100)).astype(np.float32)
    out = infer(client, "crnn", {"input.1": (x, "FP32")}).as_numpy("308")
    np.testing.assert_allclose(out, crnn_reference(x), rtol=1e-4, atol=1e-4)


def check_crnn_postprocess(client: httpclient.InferenceServerClient) -> None:
    logits = RNG.normal(size=(2, 26, 37)).astype(np.float32)
    out = infer(client, "crnn_postprocess", {"LOGITS": (logits, "FP32")}).as_numpy("TEXT")
    assert out.reshape(-1).tolist() == _module("crnn_postprocess").greedy_ctc_decode(logits, ALPHABET)


def check_simple_torchscript(client: httpclient.InferenceServerClient) -> None:
    import torch

    x = RNG.normal(size=(3, 16)).astype(np.float32)
    out = infer(client, "simple_torchscript", {"INPUT__0": (x, "FP32")}).as_numpy("OUTPUT__0")
    module = torch.jit.load(str(EXAMPLES / "simple_torchscript" / "1" / "model.pt"), map_location="cpu")
    with torch.no_grad():
        expected = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def check_text_recognition(client: httpclient.InferenceServerClient) -> None:
    out = infer(client, "text_recognition", {"IMAGE": (IMAGE, "UINT8")}).as_numpy("TEXT")
    logits = crnn_reference(_module("image_preprocess").preprocess(IMAGE))
    assert out.reshape(-1).tolist() == _module("crnn_postprocess").greedy_ctc_decode(logits, ALPHABET)


CHECKS: dict[str, Callable[[httpclient.InferenceServerClient], None]] = {
    "add_sub": check_add_sub,
    "auto_complete_scale": check_auto_complete_scale,
    "crnn": check_crnn,
    "crnn_postprocess": check_crnn_postprocess,
    "identity_fp32": check_identity_fp32,
    "image_preprocess": check_image_preprocess,
    "simple_torchscript": check_simple_torchscript,
    "string_upper": check_string_upper,
    "text_recognition": check_text_recognition,
}


def client_of(cluster: ClusterState, node: netns_cluster.NodeSpec) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(cluster.ingress(node), network_timeout=60.0)


def replicas_by_app(cluster: ClusterState) -> dict[str, list[dict[str, Any]]]:
    """Serve application -> its replicas, each with ``node_ip``, ``state`` and the deployment's ``num_gpus``."""
    found: dict[str, list[dict[str, Any]]] = {}
    for app_name, app in netns_cluster.serve_details()["applications"].items():
        for deployment in app["deployments"].values():
            options = deployment["deployment_config"].get("ray_actor_options") or {}
            for replica in deployment["replicas"]:
                found.setdefault(app_name, []).append({**replica, "num_gpus": options.get("num_gpus") or 0})
    return found


def test_every_example_model_has_a_check() -> None:
    assert sorted(CHECKS) == EXAMPLE_MODELS


def test_each_node_declares_its_own_resources(cluster: ClusterState) -> None:
    declared = {n["node_ip"]: n["resources_total"] for n in netns_cluster.ray_nodes()}
    assert sorted(declared) == sorted(n.ip for n in NODES)
    for node in NODES:
        resources = declared[node.ip]
        assert resources.get("CPU", 0) == node.num_cpus, (node.name, resources)
        assert resources.get("GPU", 0) == node.num_gpus, (node.name, resources)
        for name, amount in node.resources.items():
            assert resources.get(name) == amount, (node.name, resources)


@pytest.mark.parametrize("node", NODES, ids=[n.name for n in NODES])
def test_every_example_model_answers_through_each_nodes_ingress(
    cluster: ClusterState, node: netns_cluster.NodeSpec
) -> None:
    client = client_of(cluster, node)
    assert client.is_server_ready()
    index = {m["name"]: m["state"] for m in client.get_model_repository_index()}
    assert {name: index.get(name) for name in EXAMPLE_MODELS} == dict.fromkeys(EXAMPLE_MODELS, "READY")
    failed = {}
    for model in EXAMPLE_MODELS:
        try:
            CHECKS[model](client)
        except Exception as exc:  # report every model that fails, not the first
            failed[model] = repr(exc)[:400]
    assert not failed, f"through {node.name} ({node.ip}): {failed}"


def test_model_replicas_run_on_worker_nodes(cluster: ClusterState) -> None:
    apps = replicas_by_app(cluster)
    for model in [*EXAMPLE_MODELS, "gpu_probe"]:
        assert apps.get(f"model-{model}"), f"no replicas for {model}: {sorted(apps)}"
    worker_ips = {n.ip for n in WORKERS}
    # the server application is pinned to the head (tools/netns_cluster.write_serve_config)
    assert [r["node_ip"] for r in apps.pop(SERVER_APP)] == [HEAD.ip]
    for app_name, replicas in apps.items():
        for replica in replicas:
            assert replica["state"] == "RUNNING", (app_name, replica)
            assert replica["node_ip"] in worker_ips, (app_name, replica["node_ip"])
    placed = sorted((r["node_ip"], a) for a, rs in apps.items() for r in rs)
    print("replica placement:", placed)


def test_every_nodes_haproxy_routes_each_model_to_its_replicas_on_other_nodes(cluster: ClusterState) -> None:
    """One hop from any node: each HAProxy lists the replicas' own addresses (other nodes' by node IP)."""
    where = {a: {r["node_ip"] for r in rs} for a, rs in replicas_by_app(cluster).items()}
    node_ids = {n["node_ip"]: n["node_id"] for n in netns_cluster.ray_nodes()}
    for node in NODES:
        # a folder per node id, under the Serve controller's setting (the head's), for every node
        (config,) = Path(cluster.dir).glob(f"*/haproxy/{node_ids[node.ip]}/haproxy.cfg")
        servers: dict[str, set[str]] = {}
        for line in config.read_text().splitlines():
            words = line.split()
            if len(words) > 2 and words[0] == "server" and words[1].startswith("SERVE_REPLICA_model-"):
                app = words[1].removeprefix("SERVE_REPLICA_").rsplit("-model-", 1)[0]
                servers.setdefault(app, set()).add(words[2].rsplit(":", 1)[0])
        for model in [*EXAMPLE_MODELS, "gpu_probe"]:
            app = f"model-{model}"
            # a replica on the ingress's own node is reached through loopback
            expected = {"127.0.0.1" if ip == node.ip else ip for ip in where[app]}
            assert servers.get(app) == expected, (node.name, app, servers.get(app), expected)
        # what HAProxy runs: its own node's replicas through their local sockets (in the node's network
        # namespace), every other node's by IP, as Serve wrote them
        adjusted = config.with_name("haproxy.triton.cfg").read_text()
        assert haproxy_shim.drop_unasked_access_log(adjusted.splitlines(), {}) == adjusted.splitlines()
        for backend, served in _replica_servers(config.read_text()).items():
            runs = _replica_servers(adjusted)[backend]
            for name, address in served.items():
                host, port = address.rsplit(":", 1)
                local = backend.startswith("http-") and host == "127.0.0.1"
                want = local_sockets.haproxy_address(int(port)) if local else address
                assert runs[name] == want, (node.name, backend, name, runs[name], want)


def _replica_servers(text: str) -> dict[str, dict[str, str]]:
    """The ``SERVE_REPLICA_`` servers of each backend of an HAProxy configuration, name to address."""
    found: dict[str, dict[str, str]] = {}
    backend = ""
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["backend"]:
            backend = words[1]
        elif len(words) > 2 and words[0] == "server" and words[1].startswith("SERVE_REPLICA_"):
            found.setdefault(backend, {})[words[1]] = words[2]
    return found


def test_gpu_replicas_land_on_the_gpu_node_only(cluster: ClusterState) -> None:
    apps = replicas_by_app(cluster)
    on_gpus = {a: [r["node_ip"] for r in rs] for a, rs in apps.items() if any(r["num_gpus"] > 0 for r in rs)}
    assert "model-gpu_probe" in on_gpus  # KIND_GPU
    assert "model-auto_complete_scale" in on_gpus  # no instance_group: KIND_AUTO, a GPU exists
    assert all(ip == GPU_NODE.ip for ips in on_gpus.values() for ip in ips), on_gpus
    for model in ("add_sub", "crnn", "string_upper"):  # KIND_CPU reserves no GPU
        assert all(r["num_gpus"] == 0 for r in apps[f"model-{model}"]), model


@pytest.mark.parametrize("node", NODES, ids=[n.name for n in NODES])
def test_gpu_probe_answers_from_the_gpu_node(cluster: ClusterState, node: netns_cluster.NodeSpec) -> None:
    gpu_node_id = next(n["node_id"] for n in netns_cluster.ray_nodes() if n["node_ip"] == GPU_NODE.ip)
    seen = infer(client_of(cluster, node), "gpu_probe", {"IN": (np.array([1], np.int32), "INT32")}).as_numpy(
        "SEEN"
    )
    node_id, kind, visible = (s.decode() for s in seen.reshape(-1))
    assert (node_id, kind, visible) == (gpu_node_id, "GPU", "0")


def test_a_client_inside_a_worker_node_reaches_every_ingress(cluster: ClusterState) -> None:
    """From the GPU node's own namespace: its loopback and the head's address answer alike."""
    script = (
        "import sys, numpy as np, tritonclient.http as h\n"
        "for url in sys.argv[1:]:\n"
        "    c = h.InferenceServerClient(url)\n"
        "    i = h.InferInput('INPUT0', [4], 'FP32'); i.set_data_from_numpy(np.arange(4, dtype=np.float32))\n"
        "    print(url, c.infer('identity_fp32', [i]).as_numpy('OUTPUT0').tolist())\n"
    )
    urls = [f"127.0.0.1:{cluster.http_port}", cluster.ingress(HEAD)]
    done = subprocess.run(
        ["ip", "netns", "exec", GPU_NODE.netns, sys.executable, "-c", script, *urls],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [f"{url} [0.0, 1.0, 2.0, 3.0]" for url in urls]
