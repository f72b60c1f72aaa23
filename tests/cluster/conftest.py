"""One multi-node Ray cluster for the tests of this folder: three nodes in network namespaces.

The cluster (``tools/netns_cluster.py``) is started once for this folder's tests (and taken down
after them, so the rest of the suite has the machine's cores) and serves the
example repository plus ``gpu_probe``, a KIND_GPU Python model that reports where it
runs, and ``POOLED`` models that ask to be pooled on the model hosts (two host replicas, at most
one per node; every other model keeps its own deployment). It needs root and ``ip``; without them
the tests skip with the reason.
"""

from __future__ import annotations

import shutil
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools import netns_cluster

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "model_repository"

# Placed by Ray's GPU resource on the node that declares one; it needs no CUDA to answer.
GPU_PROBE_PY = textwrap.dedent(
    """
    import os

    import numpy as np
    import ray
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.kind = args["model_instance_kind"]

        def execute(self, requests):
            node = ray.get_runtime_context().get_node_id()
            seen = [node, self.kind, os.environ.get("CUDA_VISIBLE_DEVICES", "")]
            out = np.array([s.encode() for s in seen], dtype=np.object_)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", out)]) for _ in requests]
    """
)

GPU_PROBE_CONFIG = textwrap.dedent(
    """
    name: "gpu_probe"
    backend: "python"
    input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "SEEN" data_type: TYPE_STRING dims: [ 3 ] } ]
    instance_group [ { count: 1 kind: KIND_GPU } ]
    """
)


# Answers with the Serve application (an instance group's own) and the replica that ran it, after
# ``DELAY_MS`` of work: enough for a load of a few clients to keep its replicas busy.
WHERE_PY = textwrap.dedent(
    """
    import time

    import numpy as np
    from ray import serve
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            context = serve.get_replica_context()
            self.app, self.replica = context.app_name, context.replica_id.unique_id

        def execute(self, requests):
            responses = []
            for request in requests:
                delay = pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()
                time.sleep(float(delay.reshape(-1)[0]) / 1000.0)
                out = np.array([self.app.encode(), self.replica.encode()], dtype=np.object_)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("WHERE", out)]))
            return responses
    """
)


def where_config(name: str, extra: str) -> str:
    return (
        f'name: "{name}"\nbackend: "python"\n'
        'input [ { name: "DELAY_MS" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "WHERE" data_type: TYPE_STRING dims: [ 2 ] } ]\n' + extra
    )


def _autoscaling(**values: str) -> str:
    return "".join(
        f'parameters {{ key: "ray.autoscaling.{k}" value: {{ string_value: "{v}" }} }}\n'
        for k, v in values.items()
    )


# Two KIND_CPU instance groups of one model: two deployments behind the model's one route.
TWO_GROUPS = 'instance_group [ { name: "first" count: 1 kind: KIND_CPU }, { name: "second" count: 1 kind: KIND_CPU } ]\n'
# Serve's autoscaling from the config's parameters: 1 replica at rest, 2 under load.
AUTOSCALED = "instance_group [ { count: 1 kind: KIND_CPU } ]\n" + _autoscaling(
    min_replicas="1",
    max_replicas="2",
    target_ongoing_requests="1",
    upscale_delay_s="1",
    downscale_delay_s="4",
    metrics_interval_s="0.5",
    look_back_period_s="2",
)


# Pooled on the model hosts (the server runs with ``HOSTS``): answers with the node and the host
# replica it was loaded on.
POOLED_PY = textwrap.dedent(
    """
    import numpy as np
    import ray
    from ray import serve
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            context = serve.get_replica_context()
            self.seen = [ray.get_runtime_context().get_node_id(), context.replica_id.unique_id]

        def execute(self, requests):
            out = np.array([s.encode() for s in self.seen], dtype=np.object_)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("WHERE", out)]) for _ in requests]
    """
)
POOLED = tuple(f"pooled_{i}" for i in range(6))
# two host replicas, one per worker node; only the models that ask are pooled
HOSTS = {
    "model_hosts": 2,
    "model_host_cpus": 0.1,
    "model_host_placement": "dedicated",
    "model_host_max_per_node": 1,
}


def pooled_config(name: str) -> str:
    return (
        f'name: "{name}"\nbackend: "python"\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "WHERE" data_type: TYPE_STRING dims: [ 2 ] } ]\n'
        'parameters { key: "ray.placement" value: { string_value: "pooled" } }\n'
    )


def build_repository(root: Path) -> Path:
    """The example repository plus ``gpu_probe``, ``two_groups``, ``autoscaled`` and ``POOLED``."""
    repo = root / "repo"
    shutil.copytree(EXAMPLES, repo, ignore=shutil.ignore_patterns("README.md", "__pycache__"))
    (repo / "gpu_probe" / "1").mkdir(parents=True)
    (repo / "gpu_probe" / "1" / "model.py").write_text(GPU_PROBE_PY)
    (repo / "gpu_probe" / "config.pbtxt").write_text(GPU_PROBE_CONFIG)
    for name, extra in (("two_groups", TWO_GROUPS), ("autoscaled", AUTOSCALED)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(WHERE_PY)
        (repo / name / "config.pbtxt").write_text(where_config(name, extra))
    for name in POOLED:
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(POOLED_PY)
        (repo / name / "config.pbtxt").write_text(pooled_config(name))
    return repo


@pytest.fixture(scope="package")
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[netns_cluster.ClusterState]:
    """The running cluster; taken down (every process it started, the namespaces, the bridge) after.
    Where one of its tests failed, the nodes' logs are kept first (``netns_cluster.keep_logs``)."""
    reason = netns_cluster.unavailable_reason()
    if reason:
        pytest.skip(f"no multi-node cluster: {reason}")
    repo = build_repository(tmp_path_factory.mktemp("multinode"))
    started = time.monotonic()
    try:
        state = netns_cluster.up(model_repository=repo, server_args=HOSTS)
    except netns_cluster.ClusterError as exc:
        pytest.fail(f"multi-node cluster did not start: {exc}")
    print(f"multi-node cluster up in {time.monotonic() - started:.0f}s")
    failed_before = request.session.testsfailed
    try:
        yield state
    finally:
        stopped = time.monotonic()
        if request.session.testsfailed > failed_before:
            try:
                print(f"a multi-node test failed: logs kept in {netns_cluster.keep_logs(Path(state.dir))}")
            except OSError as exc:
                print(f"a multi-node test failed; its logs could not be kept: {exc!r}")
        netns_cluster.down(Path(state.dir))
        print(f"multi-node cluster down in {time.monotonic() - stopped:.0f}s")
