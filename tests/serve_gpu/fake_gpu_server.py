"""Serves a repository on a Ray instance that declares 3 (fake) GPUs, with a model host that has one of
them; prints what each replica saw.

Run by ``test_fake_gpu_placement.py`` in its own process (one Ray instance per
process). Prints one JSON object: model -> sorted distinct
``CUDA_VISIBLE_DEVICES`` values its replicas answered with, plus the instance
kinds Triton's ``initialize`` arguments named.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

MODEL_PY = textwrap.dedent(
    """
    import os

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.kind = args["model_instance_kind"]

        def execute(self, requests):
            seen = f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')}|{self.kind}|{os.getpid()}"
            out = np.array([seen.encode()], dtype=np.object_)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", out)]) for _ in requests]
    """
)


def config(name: str, group: str) -> str:
    return textwrap.dedent(
        f"""
        name: "{name}"
        backend: "python"
        input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "SEEN" data_type: TYPE_STRING dims: [ 1 ] }} ]
        instance_group [ {group} ]
        """
    ) + (
        'parameters { key: "ray.placement" value: { string_value: "dedicated" } }\n'
        if name in DEDICATED
        else ""
    )


MODELS = {
    # one instance on each of GPU 0 and GPU 1: two replicas, one per GPU
    "on_both_gpus": "{ count: 1 kind: KIND_GPU gpus: [ 0, 1 ] }",
    # one instance on GPU 1 only: Ray alone could put it on GPU 0
    "on_gpu_1": "{ count: 1 kind: KIND_GPU gpus: [ 1 ] }",
    # a CPU model on the same cluster reserves no GPU
    "on_cpu": "{ count: 1 kind: KIND_CPU }",
    # a CPU group and a GPU group: two deployments, both answering the model's route
    "mixed": "{ count: 1 kind: KIND_CPU }, { count: 1 kind: KIND_GPU gpus: [ 1 ] }",
    # pooled on the model host, which has a GPU of its own (the third): one process serves both
    "pooled_gpu": "{ count: 1 kind: KIND_GPU gpus: [ 0 ] }",
    "pooled_cpu": "{ count: 1 kind: KIND_CPU }",
}
REPLICAS = {"on_both_gpus": 2, "on_gpu_1": 1, "on_cpu": 1, "mixed": 2, "pooled_gpu": 1, "pooled_cpu": 1}
DEDICATED = ("on_gpu_1", "on_cpu")  # poolable, but asked to keep deployments of their own


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build(root: Path) -> Path:
    for name, group in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(MODEL_PY)
        (root / name / "config.pbtxt").write_text(config(name, group))
    return root


def wait_routed(client: Any, names: list[str], timeout_s: float = 120.0) -> None:
    """Wait until HAProxy routes each model to its own replica (its route table lags readiness)."""
    deadline = time.monotonic() + timeout_s
    pending = list(names)
    while pending and time.monotonic() < deadline:
        pending = [name for name in pending if not client.is_model_ready(name)]
        if pending:
            time.sleep(0.5)


def main(workdir: str) -> int:
    import numpy as np
    import tritonclient.http as http

    from deployments.serve import launch
    from deployments.serve.request_path import instance_ports_env
    from deployments.settings import ServerSettings

    work = Path(workdir)
    repo = build(work / "repo")
    ray_tmp = str(work / "ray")
    # Replica ports of its own: the test session's Serve instance holds the default range, and a port
    # that failed to bind here could otherwise be routed to that instance's replica.
    os.environ.update(instance_ports_env(1))
    port = free_port()
    haproxy_dirs = Path("/tmp/haproxy-serve")
    before = set(haproxy_dirs.glob("*")) if haproxy_dirs.exists() else set()
    try:
        launch.start(
            ServerSettings.from_args(
                {
                    "model_repository": str(repo),
                    "http_port": port,
                    "grpc_port": free_port(),  # never Triton's 8001/8002, which another server may hold
                    "metrics_port": free_port(),
                    "model_hosts": 1,
                    "model_host_gpus": 1,
                }
            ),
            ray_init={
                "num_cpus": 2,
                "num_gpus": 3,
                "include_dashboard": False,
                "_temp_dir": ray_tmp,
                "log_to_driver": False,
            },
        )
        client = http.InferenceServerClient(f"127.0.0.1:{port}")
        wait_routed(client, list(MODELS))
        seen: dict[str, list[str]] = {}
        for name in MODELS:
            values = set()
            # 40 requests, and more while some replica has not answered (HAProxy's routes lag readiness)
            deadline = time.monotonic() + 60.0
            sent = 0
            while sent < 40 or (len(values) < REPLICAS[name] and time.monotonic() < deadline):
                sent += 1
                x = http.InferInput("IN", [1], "INT32")
                x.set_data_from_numpy(np.array([1], np.int32))
                result = client.infer(name, [x])
                values.add(result.as_numpy("SEEN")[0].decode())
            seen[name] = sorted(values)
        print("RESULT " + json.dumps(seen), flush=True)
        return 0
    finally:
        launch.stop()
        subprocess.run(["pkill", "-f", ray_tmp], check=False)
        ours = (set(haproxy_dirs.glob("*")) if haproxy_dirs.exists() else set()) - before
        for folder in ours:  # only this instance's HAProxy: another server may be running
            subprocess.run(["pkill", "-f", f"haproxy .*{folder}"], check=False)
        shutil.rmtree(ray_tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
