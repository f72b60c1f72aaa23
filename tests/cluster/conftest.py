"""One multi-node Ray cluster for the tests of this folder: three nodes in network namespaces.

The cluster (``tools/netns_cluster.py``) is started once for this folder's tests (and taken down
after them, so the rest of the suite has the machine's cores) and serves the
example repository plus ``gpu_probe``, a KIND_GPU Python model that reports where it
runs. It needs root and ``ip``; without them the tests skip with the reason.
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


def build_repository(root: Path) -> Path:
    """The example repository plus ``gpu_probe``."""
    repo = root / "repo"
    shutil.copytree(EXAMPLES, repo, ignore=shutil.ignore_patterns("README.md", "__pycache__"))
    (repo / "gpu_probe" / "1").mkdir(parents=True)
    (repo / "gpu_probe" / "1" / "model.py").write_text(GPU_PROBE_PY)
    (repo / "gpu_probe" / "config.pbtxt").write_text(GPU_PROBE_CONFIG)
    return repo


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[netns_cluster.ClusterState]:
    """The running cluster; taken down (every process it started, the namespaces, the bridge) after."""
    reason = netns_cluster.unavailable_reason()
    if reason:
        pytest.skip(f"no multi-node cluster: {reason}")
    repo = build_repository(tmp_path_factory.mktemp("multinode"))
    started = time.monotonic()
    try:
        state = netns_cluster.up(model_repository=repo)
    except netns_cluster.ClusterError as exc:
        pytest.fail(f"multi-node cluster did not start: {exc}")
    print(f"multi-node cluster up in {time.monotonic() - started:.0f}s")
    try:
        yield state
    finally:
        stopped = time.monotonic()
        netns_cluster.down(Path(state.dir))
        print(f"multi-node cluster down in {time.monotonic() - stopped:.0f}s")
