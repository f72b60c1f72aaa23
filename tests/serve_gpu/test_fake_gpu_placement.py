"""KIND_GPU instance groups land on the GPUs they name, on a Ray instance with 3 declared GPUs; pooled
models share a model host that has a GPU of its own.

No GPU is needed: Ray hands out GPU ids it was told exist and sets
``CUDA_VISIBLE_DEVICES`` in each replica, which is what is checked here, with
the Python backend (which needs no CUDA). The server runs in its own process
because one process holds one Ray instance.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from deployments.serve.devices import planned_gpu, replica_rank, visible_devices

ROOT = Path(__file__).resolve().parents[2]


def test_planned_gpu_cycles_through_the_group_ids() -> None:
    ids = (0, 0, 1, 1)
    assert [planned_gpu(ids, r) for r in range(5)] == [0, 0, 1, 1, 0]
    assert planned_gpu((), 0) is None and planned_gpu((1,), -1) is None


def test_visible_devices_keeps_rays_choice_where_the_node_lacks_the_gpu() -> None:
    assert visible_devices(1, node_gpus=2, assigned="0") == "1"
    assert visible_devices(3, node_gpus=2, assigned="0") == "0"
    assert visible_devices(None, node_gpus=2, assigned="1") == "1"


def test_replica_rank_reads_serves_rank_object_or_number() -> None:
    class Rank:
        rank = 3

    class Context:
        def __init__(self, rank: object) -> None:
            self.rank = rank

    assert replica_rank(Context(Rank())) == 3
    assert replica_rank(Context(2)) == 2
    assert replica_rank(object()) == -1


@pytest.mark.serve
@pytest.mark.timeout(420)
def test_replicas_land_on_the_gpus_their_instance_group_names() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    work = tempfile.mkdtemp(prefix="trs_gpu_")  # short: Ray's socket paths must fit in 107 bytes
    done = subprocess.run(
        [sys.executable, "-m", "tests.serve_gpu.fake_gpu_server", work],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    shutil.rmtree(work, ignore_errors=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    seen = {name: [v.split("|") for v in values] for name, values in json.loads(lines[0][7:]).items()}

    both = seen["on_both_gpus"]
    assert sorted(gpu for gpu, _, _ in both) == ["0", "1"], both  # two replicas, one per GPU
    assert len({pid for _, _, pid in both}) == 2
    assert {kind for _, kind, _ in both} == {"GPU"}

    assert [(gpu, kind) for gpu, kind, _ in seen["on_gpu_1"]] == [("1", "GPU")]

    (cpu,) = seen["on_cpu"]
    assert (cpu[0], cpu[1]) == ("", "CPU"), cpu  # no GPU reserved, none visible

    # one model, two instance groups: each its own kind and GPU, both reached through the model's route
    mixed = seen["mixed"]
    assert sorted((gpu, kind) for gpu, kind, _ in mixed) == [("", "CPU"), ("1", "GPU")], mixed

    # the model host: whole GPU 2 (the one no dedicated replica holds), both pooled models in one process,
    # the KIND_GPU one on the host's GPU whichever its group names
    (pooled_gpu,), (pooled_cpu,) = seen["pooled_gpu"], seen["pooled_cpu"]
    assert (pooled_gpu[0], pooled_gpu[1]) == ("2", "GPU"), pooled_gpu
    assert (pooled_cpu[0], pooled_cpu[1]) == ("2", "CPU"), pooled_cpu
    assert pooled_gpu[2] == pooled_cpu[2]
    dedicated = {pid for name in ("on_both_gpus", "on_gpu_1", "on_cpu", "mixed") for *_, pid in seen[name]}
    assert pooled_gpu[2] not in dedicated
