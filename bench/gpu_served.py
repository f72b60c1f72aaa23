"""A GPU ensemble served through Ray Serve: its steps in the ensemble's replica, or each on its own.

Two ``KIND_GPU`` Python steps compute with PyTorch: ``scale`` doubles a ``[rows, cols]`` FP32 input
on the device and hands its output on as a device tensor (DLPack); ``shift`` adds one and returns the
result to the host. Two ensembles run them on one server:

- ``chain_colocated``: the default placement. The ensemble's replica takes a share of the GPU and
  runs both steps itself, so the intermediate tensor stays in device memory;
- ``chain_separate``: ``placement: separate``. Each step runs on its model's replicas, so the
  intermediate tensor goes to the host, over HTTP to the next replica and back to the device.

Closed-loop client threads send binary tensors over HTTP to each ensemble in alternating rounds.
Without CUDA the same server runs on a GPU that Ray is told of and the steps compute on the CPU (a
check of the harness, not a measurement)::

    python -m bench.gpu_served --out bench/results/gpu_pipeline/served.json

Needs Ray, PyTorch and this package; the server takes free ports and replica port block 3.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import tempfile
import textwrap
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

ENSEMBLES = ("chain_colocated", "chain_separate")

STEP_PY = textwrap.dedent(
    """
    import numpy as np
    import torch
    import triton_python_backend_utils as pb_utils

    DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


    class TritonPythonModel:
        def initialize(self, args):
            self.name = args["model_name"]

        def execute(self, requests):
            responses = []
            for request in requests:
                tensor = pb_utils.get_input_tensor_by_name(request, "X")
                x = torch.from_dlpack(tensor.to_dlpack()).to(DEVICE)
                if self.name == "scale":
                    out = pb_utils.Tensor.from_dlpack("Y", torch.utils.dlpack.to_dlpack(x * 2))
                else:
                    out = pb_utils.Tensor("Y", (x + 1).cpu().numpy())
                responses.append(pb_utils.InferenceResponse([out]))
            return responses
    """
)


@dataclass(frozen=True)
class Settings:
    """Sizes and counts of one run."""

    rows: int = 256
    cols: int = 1024  # 1 MiB of FP32 per request by default
    concurrency: int = 4
    seconds: float = 8.0  # one round of one ensemble
    rounds: int = 2
    warmup: int = 20  # requests to each ensemble before timing


def write_repository(root: Path, s: Settings) -> None:
    """The two steps and the two ensembles over them."""
    dims = f"[ {s.rows}, {s.cols} ]"
    for name in ("scale", "shift"):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(STEP_PY)
        (root / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\n'
            f'input [ {{ name: "X" data_type: TYPE_FP32 dims: {dims} }} ]\n'
            f'output [ {{ name: "Y" data_type: TYPE_FP32 dims: {dims} }} ]\n'
            "instance_group [ { count: 1 kind: KIND_GPU } ]\n"
            'parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "no" } }\n'
        )
    for name in ENSEMBLES:
        placement = 'parameters { key: "placement" value: { string_value: "separate" } }\n'
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(
            f'name: "{name}"\nplatform: "ensemble"\n'
            f'input [ {{ name: "X" data_type: TYPE_FP32 dims: {dims} }} ]\n'
            f'output [ {{ name: "Z" data_type: TYPE_FP32 dims: {dims} }} ]\n'
            "ensemble_scheduling { step [\n"
            '  { model_name: "scale" model_version: -1 input_map { key: "X" value: "X" } '
            'output_map { key: "Y" value: "mid" } },\n'
            '  { model_name: "shift" model_version: -1 input_map { key: "X" value: "mid" } '
            'output_map { key: "Y" value: "Z" } }\n'
            "] }\n" + (placement if name == "chain_separate" else "")
        )


def _body(x: np.ndarray) -> tuple[bytes, dict[str, str]]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "X",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [{"name": "Z", "parameters": {"binary_data": True}}],
        }
    ).encode()
    headers = {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }
    return header + x.tobytes(), headers


def _answer(
    connection: http.client.HTTPConnection, model: str, body: bytes, headers: dict[str, str]
) -> bytes:
    connection.request("POST", f"/v2/models/{model}/infer", body, headers)
    response = connection.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"{model}: {response.status} {data[:300]!r}")
    size = int(response.getheader("Inference-Header-Content-Length") or 0)
    return data[size:]


def _round(port: int, model: str, x: np.ndarray, s: Settings) -> list[float]:
    """Latencies (seconds) of every request answered by ``s.concurrency`` threads in one round."""
    body, headers = _body(x)
    latencies: list[list[float]] = [[] for _ in range(s.concurrency)]
    errors: list[BaseException] = []
    deadline = time.perf_counter() + s.seconds

    def loop(own: list[float]) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            while time.perf_counter() < deadline:
                start = time.perf_counter()
                _answer(connection, model, body, headers)
                own.append(time.perf_counter() - start)
        except BaseException as exc:  # reported after the round
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=loop, args=(own,)) for own in latencies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return [latency for own in latencies for latency in own]


def measure(port: int, s: Settings) -> dict[str, Any]:
    """Check each ensemble's answer, warm both up, then time them in alternating rounds."""
    x = np.random.default_rng(0).standard_normal((s.rows, s.cols)).astype(np.float32)
    body, headers = _body(x)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    for model in ENSEMBLES:
        z = np.frombuffer(_answer(connection, model, body, headers), dtype=np.float32).reshape(x.shape)
        np.testing.assert_allclose(z, x * 2 + 1, rtol=1e-6)
        for _ in range(s.warmup):
            _answer(connection, model, body, headers)
    connection.close()
    latencies: dict[str, list[float]] = {m: [] for m in ENSEMBLES}
    elapsed = dict.fromkeys(ENSEMBLES, 0.0)
    for _ in range(s.rounds):
        for model in ENSEMBLES:
            latencies[model].extend(_round(port, model, x, s))
            elapsed[model] += s.seconds
    modes = {
        m: {
            "requests": len(latencies[m]),
            "infer_per_s": len(latencies[m]) / elapsed[m],
            "latency_p50_ms": statistics.median(latencies[m]) * 1000,
            "latency_p99_ms": float(np.percentile(latencies[m], 99)) * 1000,
        }
        for m in ENSEMBLES
    }
    return {
        "modes": modes,
        "colocated_over_separate": modes["chain_colocated"]["infer_per_s"]
        / modes["chain_separate"]["infer_per_s"],
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(s: Settings) -> dict[str, Any]:
    """Serve the repository on this machine's GPU (or a declared one without CUDA) and measure."""
    import torch

    from deployments.serve import launch
    from deployments.serve.request_path import instance_ports_env
    from deployments.settings import ServerSettings

    cuda = torch.cuda.is_available()
    with tempfile.TemporaryDirectory(prefix="gpu_served_") as work:
        repo = Path(work) / "repo"
        write_repository(repo, s)
        os.environ.update(instance_ports_env(3))
        port = _free_port()
        ports = {"http_port": port, "grpc_port": _free_port(), "metrics_port": _free_port()}
        launch.start(
            ServerSettings.from_args({"model_repository": str(repo), **ports}),
            ray_init={
                "num_cpus": max(4, os.cpu_count() or 4),
                "num_gpus": torch.cuda.device_count() if cuda else 1,
                "include_dashboard": False,
                "_temp_dir": str(Path(work) / "ray"),
                "log_to_driver": False,
            },
        )
        try:
            measured = measure(port, s)
        finally:
            launch.stop()
    return {
        "experiment": "GPU ensemble served: steps in the ensemble's replica (DLPack) vs on their own replicas",
        "device": "cuda" if cuda else "cpu (a declared GPU: a check of the harness, not a measurement)",
        "device_name": torch.cuda.get_device_name(0) if cuda else "",
        "versions": {"torch": torch.__version__, "numpy": np.__version__},
        "settings": asdict(s),
        **measured,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, value in asdict(Settings()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = vars(parser.parse_args(argv))
    out = args.pop("out")
    text = json.dumps(run(Settings(**args)), indent=2)
    print(text)
    if out:
        Path(out).write_text(text + "\n")


if __name__ == "__main__":
    main()
