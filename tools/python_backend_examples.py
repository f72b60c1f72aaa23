"""Triton's Python backend examples, served unchanged, with their own clients.

``python -m tools.python_backend_examples --python-backend <checkout> [--out DIR]`` lays out the
examples of a checkout of ``triton-inference-server/python_backend`` as their READMEs say
(``models/<name>/1/model.py`` and ``config.pbtxt``), starts this server on that repository with
ports of its own, and runs each example's client against it. The clients are copied with only the
ports changed (8000, 8001 and 8002 are rewritten to the server's), and each passes when it exits 0
(every client checks its answers itself and exits 1 on a wrong one). The table (example, client,
passed, seconds, the output's last lines) goes to ``bench/results/python_backend_examples/``.

Examples that need what this machine does not have are listed, not run: ``jax`` (JAX),
``preprocessing`` (DALI and a TensorRT engine) and ``instance_kind`` (a torchvision ResNet-50 whose
weights are downloaded). Nothing of the checkout is copied into this project.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.env import REPO_ROOT, environment

RESULTS = REPO_ROOT / "bench" / "results" / "python_backend_examples"
# model name -> (the example's model file, its config; None: the model completes its own config)
MODELS: dict[str, tuple[str, str | None]] = {
    "add_sub": ("add_sub/model.py", "add_sub/config.pbtxt"),
    "pytorch": ("pytorch/model.py", "pytorch/config.pbtxt"),
    "bls_sync": ("bls/sync_model.py", "bls/sync_config.pbtxt"),
    "bls_async": ("bls/async_model.py", "bls/async_config.pbtxt"),
    "bls_decoupled_sync": ("bls_decoupled/sync_model.py", "bls_decoupled/sync_config.pbtxt"),
    "bls_decoupled_async": ("bls_decoupled/async_model.py", "bls_decoupled/async_config.pbtxt"),
    "custom_metrics": ("custom_metrics/model.py", "custom_metrics/config.pbtxt"),
    "repeat_int32": ("decoupled/repeat_model.py", "decoupled/repeat_config.pbtxt"),
    "square_int32": ("decoupled/square_model.py", "decoupled/square_config.pbtxt"),
    "batch_auto_complete": ("auto_complete/batch_model.py", None),
    "nobatch_auto_complete": ("auto_complete/nobatch_model.py", None),
}
CLIENTS = (
    "add_sub/client.py",
    "auto_complete/client.py",
    "bls/sync_client.py",
    "bls/async_client.py",
    "bls_decoupled/sync_client.py",
    "bls_decoupled/async_client.py",
    "custom_metrics/client.py",
    "decoupled/repeat_client.py",
    "decoupled/square_client.py",
    "pytorch/client.py",
)
NOT_RUN = {
    "jax": "needs JAX",
    "preprocessing": "needs NVIDIA DALI and a TensorRT engine",
    "instance_kind": "downloads torchvision's ResNet-50 weights (no network here)",
}
DEFAULT_PORTS = {"8000": "http", "8001": "grpc", "8002": "metrics"}


@dataclass(frozen=True)
class ClientResult:
    example: str
    client: str
    passed: bool
    seconds: float
    output_tail: str


def build_repository(examples: Path, dest: Path) -> Path:
    """The examples' models laid out as their READMEs say, under ``dest``."""
    if dest.exists():
        shutil.rmtree(dest)
    for name, (model, config) in MODELS.items():
        (dest / name / "1").mkdir(parents=True)
        shutil.copy(examples / model, dest / name / "1" / "model.py")
        if config is not None:
            shutil.copy(examples / config, dest / name / "config.pbtxt")
    return dest


def with_ports(source: str, ports: dict[str, int]) -> str:
    """A client's text with Triton's default ports (``localhost:8000`` ...) replaced by ``ports``."""

    def swap(match: re.Match[str]) -> str:
        return f"{match.group(1)}:{ports[DEFAULT_PORTS[match.group(2)]]}"

    return re.sub(r"\b(localhost|127\.0\.0\.1):(800[012])\b", swap, source)


def run_clients(examples: Path, folder: Path, ports: dict[str, int], timeout_s: float) -> list[ClientResult]:
    results = []
    for client in CLIENTS:
        path = folder / client.replace("/", "_")
        path.write_text(with_ports((examples / client).read_text(), ports))
        began = time.monotonic()
        try:
            done = subprocess.run(
                [sys.executable, str(path)], capture_output=True, text=True, timeout=timeout_s, cwd=folder
            )
            passed, output = done.returncode == 0, done.stdout + done.stderr
        except subprocess.TimeoutExpired:
            passed, output = False, f"no exit within {timeout_s} s"
        tail = "\n".join(output.strip().splitlines()[-3:])
        results.append(ClientResult(client.split("/")[0], client, passed, time.monotonic() - began, tail))
    return results


def write(results: list[ClientResult], checkout: Path, out: Path, command: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    passed = sum(r.passed for r in results)
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    env = environment(
        command=command, python_backend_checkout=str(checkout), python_backend_commit=head.stdout.strip()
    )
    document = {
        "environment": env,
        "passed": passed,
        "clients": len(results),
        "results": [asdict(r) for r in results],
        "not_run": NOT_RUN,
    }
    (out / "results.json").write_text(json.dumps(document, indent=2) + "\n")
    lines = [
        "# The Python backend's examples on this server",
        "",
        "Written by `python -m tools.python_backend_examples` (docs/conformance.md).",
        "",
        f"- command: `{command}`",
        f"- commit: `{env['git_commit']}`; python_backend at `{env['python_backend_commit']}`",
        f"- passed: {passed} of {len(results)} clients",
        "",
        "| example | client | passed | seconds |",
        "|---|---|---|---:|",
        *(
            f"| {r.example} | `{r.client}` | {'yes' if r.passed else 'no'} | {r.seconds:.1f} |"
            for r in results
        ),
        "",
        "Not run here:",
        "",
        *(f"- {name}: {why}" for name, why in NOT_RUN.items()),
        "",
    ]
    (out / "README.md").write_text("\n".join(lines))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.python_backend_examples", description=__doc__)
    parser.add_argument("--python-backend", type=Path, required=True, help="checkout of python_backend")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds one client may take")
    args = parser.parse_args(argv)
    from bench.scenarios.common import free_port, start_this_server

    examples = args.python_backend / "examples"
    work = Path(tempfile.mkdtemp(prefix="pyb-examples-"))
    repo = build_repository(examples, work / "models")
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
    handle = start_this_server(
        repo,
        ports["http"],
        grpc_port=ports["grpc"],
        log_path=work / "server.log",
        timeout=600,
        extra_args=["--metrics-port", str(ports["metrics"])],
    )
    with handle:
        results = run_clients(examples, work, ports, args.timeout)
    command = "python -m tools.python_backend_examples " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    out = write(results, args.python_backend, args.out, command)
    for r in results:
        print(f"{'PASS' if r.passed else 'FAIL'} {r.client} ({r.seconds:.1f} s)")
    print(f"{sum(r.passed for r in results)} of {len(results)} passed; table in {out}")
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
