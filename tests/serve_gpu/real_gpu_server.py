"""Serves models on this machine's real GPU through Ray Serve; prints what they answered.

Run by ``test_real_gpu_serving.py``, one process per server (one Ray instance per process), on a
machine with CUDA and PyTorch: ``python -m tests.serve_gpu.real_gpu_server WORK dedicated|hosted``.

1. ``KIND_GPU`` models with deployments of their own: a Python model computing with PyTorch on its
   device, and a TorchScript model, each asked over HTTP (JSON) and gRPC (``tritonclient.grpc``);
2. model hosts with a GPU each (``model_host_gpus: 1``) and a GPU budget of one and a half GiB: two
   pooled ``KIND_GPU`` models of 1 GiB each, the second evicting the first; the host's ``/metrics``;
3. (with 1.) an ensemble of two ``KIND_GPU`` Python steps, which its replica runs in process on the GPU
   it was given: the second step reports where the first step's device output reached it.

Prints one ``RESULT <json>`` line.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any

GIB = 1 << 30

TORCH_PY = textwrap.dedent(
    """
    import json
    import os

    import numpy as np
    import torch
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.device = torch.device("cuda:" + args["model_instance_device_id"])
            self.kind = args["model_instance_kind"]
            parameters = json.loads(args["model_config"]).get("parameters", {})
            mib = int(parameters.get("MIB", {}).get("string_value", "0"))
            self.block = torch.ones(mib * 262144, device=self.device) if mib else None

        def execute(self, requests):
            responses = []
            for request in requests:
                x = torch.from_numpy(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()).to(self.device)
                y = (x * 2).cpu().numpy()
                seen = "|".join(
                    [self.kind, str(x.device), torch.cuda.get_device_name(self.device),
                     os.environ.get("CUDA_VISIBLE_DEVICES", ""), str(os.getpid())]
                )
                where = np.array([seen.encode()], dtype=np.object_)
                responses.append(
                    pb_utils.InferenceResponse([pb_utils.Tensor("Y", y), pb_utils.Tensor("WHERE", where)])
                )
            return responses

        def finalize(self):
            self.block = None
    """
)


# an ensemble's two KIND_GPU steps: the first leaves its output on the device (DLPack), the second
# reports where its input arrived (on the host or the device, at which address, in which process)
FIRST_PY = textwrap.dedent(
    """
    import os

    import numpy as np
    import torch
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                x = torch.from_numpy(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()).cuda()
                y = x * 2
                seen = np.array([f"{y.data_ptr()}|{os.getpid()}".encode()], dtype=np.object_)
                responses.append(
                    pb_utils.InferenceResponse(
                        [pb_utils.Tensor.from_dlpack("Y", torch.utils.dlpack.to_dlpack(y)),
                         pb_utils.Tensor("SEEN", seen)]
                    )
                )
            return responses
    """
)

SECOND_PY = textwrap.dedent(
    """
    import os

    import numpy as np
    import torch
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                tensor = pb_utils.get_input_tensor_by_name(request, "Y")
                y = torch.from_dlpack(tensor.to_dlpack())
                seen = f"{tensor.is_cpu()}|{y.device}|{y.data_ptr()}|{os.getpid()}"
                responses.append(
                    pb_utils.InferenceResponse(
                        [pb_utils.Tensor("Z", (y + 1).cpu().numpy()),
                         pb_utils.Tensor("SEEN", np.array([seen.encode()], dtype=np.object_))]
                    )
                )
            return responses
    """
)

CHAIN = textwrap.dedent(
    """
    name: "gpu_chain"
    platform: "ensemble"
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [
      { name: "Z" data_type: TYPE_FP32 dims: [ 4 ] },
      { name: "FIRST" data_type: TYPE_STRING dims: [ 1 ] },
      { name: "SECOND" data_type: TYPE_STRING dims: [ 1 ] }
    ]
    ensemble_scheduling { step [
      { model_name: "gpu_first" model_version: -1
        input_map { key: "X" value: "X" }
        output_map [ { key: "Y" value: "mid" }, { key: "SEEN" value: "FIRST" } ] },
      { model_name: "gpu_second" model_version: -1
        input_map { key: "Y" value: "mid" }
        output_map [ { key: "Z" value: "Z" }, { key: "SEEN" value: "SECOND" } ] }
    ] }
    """
)


def _gpu_chain(root: Path) -> None:
    """The ensemble ``gpu_chain`` of two KIND_GPU Python steps (the second takes device inputs)."""
    steps = {
        "gpu_first": (FIRST_PY, "X", "Y", ""),
        "gpu_second": (
            SECOND_PY,
            "Y",
            "Z",
            'parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "no" } }',
        ),
    }
    for name, (code, x, y, extra) in steps.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(code)
        (root / name / "config.pbtxt").write_text(
            f'''name: "{name}"
backend: "python"
input [ {{ name: "{x}" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "{y}" data_type: TYPE_FP32 dims: [ 4 ] }}, {{ name: "SEEN" data_type: TYPE_STRING dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_GPU }} ]
{extra}
'''
        )
    (root / "gpu_chain" / "1").mkdir(parents=True)
    (root / "gpu_chain" / "config.pbtxt").write_text(CHAIN)


def _python_config(name: str, extra: str = "") -> str:
    return (
        textwrap.dedent(
            f"""
        name: "{name}"
        backend: "python"
        input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }}, {{ name: "WHERE" data_type: TYPE_STRING dims: [ 1 ] }} ]
        instance_group [ {{ count: 1 kind: KIND_GPU }} ]
        """
        )
        + extra
    )


def _torchscript(root: Path) -> None:
    import torch

    class AddOne(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 + 1

    (root / "gpu_ts" / "1").mkdir(parents=True)
    torch.jit.save(torch.jit.script(AddOne()), str(root / "gpu_ts" / "1" / "model.pt"))
    (root / "gpu_ts" / "config.pbtxt").write_text(
        textwrap.dedent(
            """
            name: "gpu_ts"
            platform: "pytorch_libtorch"
            input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
            output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
            instance_group [ { count: 1 kind: KIND_GPU } ]
            """
        )
    )


def _python_model(root: Path, name: str, extra: str = "") -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(TORCH_PY)
    (root / name / "config.pbtxt").write_text(_python_config(name, extra))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(port: int, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        return dict(json.loads(answer.read()))


def _get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as answer:
        return str(answer.read().decode())


def _ask_http(port: int, model: str, name: str = "X") -> dict[str, Any]:
    body = {"inputs": [{"name": name, "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    answer = _post(port, f"/v2/models/{model}/infer", body)
    return {o["name"]: o["data"] for o in answer["outputs"]}


def _ask_grpc(port: int, model: str, name: str = "X") -> dict[str, Any]:
    import numpy as np
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    tensor = grpcclient.InferInput(name, [4], "FP32")
    tensor.set_data_from_numpy(np.arange(1, 5, dtype=np.float32))
    result = client.infer(model, [tensor])
    response = result.get_response()
    out = {o.name: result.as_numpy(o.name).tolist() for o in response.outputs}
    client.close()
    return {k: [v.decode() if isinstance(v, bytes) else v for v in vals] for k, vals in out.items()}


def _serve(repo: Path, work: Path, args: dict[str, Any], run: Any) -> Any:
    import torch

    from deployments.serve import launch
    from deployments.serve.request_path import instance_ports_env
    from deployments.settings import ServerSettings

    os.environ.update(instance_ports_env(4))  # replica ports of its own (standalone: 2, bench: 3, session: 9)
    ports = {"http_port": free_port(), "grpc_port": free_port(), "metrics_port": free_port()}
    launch.start(
        ServerSettings.from_args({"model_repository": str(repo), **ports, **args}),
        ray_init={
            "num_cpus": 4,
            "num_gpus": torch.cuda.device_count(),
            "include_dashboard": False,
            "_temp_dir": str(work / "ray"),
            "log_to_driver": False,
        },
    )
    try:
        return run(ports["http_port"], ports["grpc_port"], ports["metrics_port"])
    finally:
        launch.stop()


def dedicated(work: Path) -> dict[str, Any]:
    repo = work / "dedicated"
    _python_model(repo, "gpu_py")
    _torchscript(repo)
    _gpu_chain(repo)

    def run(http: int, grpc: int, metrics: int) -> dict[str, Any]:
        return {
            "gpu_py_http": _ask_http(http, "gpu_py"),
            "gpu_py_grpc": _ask_grpc(grpc, "gpu_py"),
            "gpu_ts_http": _ask_http(http, "gpu_ts", "INPUT__0"),
            "gpu_ts_grpc": _ask_grpc(grpc, "gpu_ts", "INPUT__0"),
            "gpu_chain_http": _ask_http(http, "gpu_chain"),
            "gpu_chain_grpc": _ask_grpc(grpc, "gpu_chain"),
        }

    return dict(_serve(repo, work, {}, run))


def hosted(work: Path) -> dict[str, Any]:
    repo = work / "hosted"
    sized = 'parameters { key: "MIB" value: { string_value: "1024" } }\n'
    _python_model(repo, "pooled_a", sized)
    _python_model(repo, "pooled_b", sized)
    args = {"model_hosts": 1, "model_host_gpus": 1, "model_host_gpu_memory_bytes": GIB + GIB // 2}

    def run(http: int, grpc: int, metrics_port: int) -> dict[str, Any]:
        first = _ask_http(http, "pooled_a")
        second = _ask_http(http, "pooled_b")
        third = _ask_grpc(grpc, "pooled_b")
        metrics = ""
        deadline = time.monotonic() + 30
        while (
            'nv_model_host_eviction_total{model="pooled_a"} 1' not in metrics and time.monotonic() < deadline
        ):
            time.sleep(1)  # host statistics reach the server application each second
            metrics = _get(metrics_port, "/metrics")
        lines = [line for line in metrics.splitlines() if line.startswith("nv_model_host_")]
        return {"pooled_a": first, "pooled_b": second, "pooled_b_grpc": third, "metrics": lines}

    return dict(_serve(repo, work, args, run))


PHASES = {"dedicated": dedicated, "hosted": hosted}


def main(workdir: str, phase: str) -> int:
    result = PHASES[phase](Path(workdir))
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
