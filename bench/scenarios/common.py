"""What the scenarios share: starting this server, variant model repositories, and saving results.

``start_this_server`` is the one place that knows how this project's server is launched; the real
Triton peer is started by ``bench.peers.start_tritonserver``. Variant repositories are copies of the
example models with their ``config.pbtxt`` rewritten through the model-config protobuf schema.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from google.protobuf import text_format

from bench.env import REPO_ROOT, environment
from bench.loadgen import run_client
from bench.measure import MeasureOptions, sweep
from bench.pa_runner import run_perf_analyzer
from bench.peers import ServerHandle, launch, start_tritonserver, wait_ready
from bench.plots import plot_report
from bench.results import Report, Run, write_csv, write_json
from deployments.serve.grpc_ingress import wait_until_answering
from deployments.serve.request_path import haproxy_files_env, instance_ports_env
from repository_loader.proto import model_config_pb2

EXAMPLES = REPO_ROOT / "examples" / "model_repository"
BENCH_MODELS = Path(__file__).resolve().parent / "models"
RESULTS = REPO_ROOT / "bench" / "results"
WORK = REPO_ROOT / "bench" / ".work"

ConfigEdit = Callable[[model_config_pb2.ModelConfig], None]


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def this_server_cmd(
    repo: Path,
    http_port: int,
    grpc_port: int | None = None,
    extra_args: Sequence[str] = (),
    tree: Path | None = None,
) -> list[str]:
    """The command that serves ``repo`` with this project's server (``extra_args``: more serve options);
    ``tree``: an earlier checkout, whose command line lived in ``repository_loader`` before it moved."""
    module = "deployments"
    if tree is not None and not (tree / "deployments" / "__main__.py").exists():
        module = "repository_loader"
    cmd = [sys.executable, "-m", module, "serve", str(repo), "--http-port", str(http_port)]
    if grpc_port is not None:
        cmd += ["--grpc-port", str(grpc_port)]
    if not any(arg.startswith("--metrics-port") for arg in extra_args):
        cmd += ["--metrics-port", str(free_port())]  # never Triton's 8002, which another server may hold
    return cmd + list(extra_args)


BENCH_PORT_BLOCK = 3  # replica ports of servers started here (the test suite's standalone servers: 2)


def server_env(haproxy_folder: Path, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a server started here: this process's, less the Ray Serve settings a Serve
    instance of this process may have set (a test session's own HAProxy ports and files), with
    HAProxy's stats and metrics ports of its own and its files in ``haproxy_folder``, then ``env``."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_SERVE_", "RAY_worker"))}
    full_env.update(instance_ports_env(BENCH_PORT_BLOCK))
    full_env.update(haproxy_files_env(haproxy_folder))
    full_env.update(env or {})
    return full_env


def start_this_server(
    repo: Path,
    http_port: int,
    *,
    grpc_port: int | None = None,
    log_path: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 300.0,
    extra_args: Sequence[str] = (),
    tree: Path | None = None,
) -> ServerHandle:
    """Start this project's server on ``repo`` and wait until ``/v2/health/ready`` answers 200.

    ``tree``: another checkout of the project (an earlier revision) whose server to start instead: its
    folder is the command's working directory (``python -m`` imports from there first) and leads the
    ``PYTHONPATH`` of every process it starts, Ray's workers included.
    """
    # short: Serve adds a 56-character folder, and HAProxy's socket paths must fit in 97 bytes
    haproxy_folder = Path(tempfile.mkdtemp(prefix="trs-h", dir="/tmp"))
    full_env = server_env(haproxy_folder, env)
    if tree is not None:
        full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), full_env.get("PYTHONPATH", "")) if p)
    handle = launch(
        this_server_cmd(repo, http_port, grpc_port, extra_args, tree),
        http_port,
        name="this server",
        log_path=log_path,
        grpc_port=grpc_port,
        env=full_env,
        cwd=tree or REPO_ROOT,
    )
    handle.scratch = haproxy_folder
    try:
        wait_ready(handle, timeout)
        # HAProxy takes up the server replica's gRPC port a moment after HTTP answers ready
        if grpc_port is not None and not wait_until_answering("127.0.0.1", grpc_port, timeout):
            raise TimeoutError(f"this server's gRPC port {grpc_port} did not answer")
    except BaseException:
        handle.stop()
        raise
    return handle


def read_config(path: Path) -> model_config_pb2.ModelConfig:
    """A ``config.pbtxt`` parsed into the model-config message."""
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def write_config(config: model_config_pb2.ModelConfig, path: Path) -> None:
    """Write a model-config message as ``config.pbtxt``."""
    path.write_text(text_format.MessageToString(config))


def make_repository(dest: Path, models: Iterable[tuple[Path, str, ConfigEdit | None]]) -> Path:
    """A fresh repository at ``dest``: each ``(source model dir, name, edit)`` is copied under ``name``
    and its config rewritten by ``edit`` (which may change anything but the name)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for src, name, edit in models:
        target = dest / name
        shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__"))
        cfg_path = target / "config.pbtxt"
        if cfg_path.exists() and (edit is not None or name != src.name):
            config = read_config(cfg_path)
            config.name = name
            if edit is not None:
                edit(config)
            write_config(config, cfg_path)
    return dest


def set_instances(count: int) -> ConfigEdit:
    """An edit giving the model ``count`` CPU instances."""

    def edit(config: model_config_pb2.ModelConfig) -> None:
        del config.instance_group[:]
        group = config.instance_group.add()
        group.count = count
        group.kind = model_config_pb2.ModelInstanceGroup.KIND_CPU

    return edit


def set_dynamic_batching(enabled: bool, delay_us: int = 0, preferred: Iterable[int] = ()) -> ConfigEdit:
    """An edit turning dynamic batching on (with this queue delay and preferred sizes) or off."""

    def edit(config: model_config_pb2.ModelConfig) -> None:
        config.ClearField("dynamic_batching")
        if enabled:
            config.dynamic_batching.max_queue_delay_microseconds = delay_us
            config.dynamic_batching.preferred_batch_size.extend(preferred)

    return edit


def chain(*edits: ConfigEdit) -> ConfigEdit:
    """Several edits applied in order."""

    def edit(config: model_config_pb2.ModelConfig) -> None:
        for e in edits:
            e(config)

    return edit


def work_dir(scenario: str) -> Path:
    """A scratch folder for a scenario's repositories and logs (git-ignored)."""
    path = WORK / scenario
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_report(report: Report, title: str = "") -> Path:
    """Write a scenario's JSON, CSV and plots into ``bench/results/<name>/``; returns the folder."""
    out = RESULTS / report.name
    write_json(report, out / "results.json")
    write_csv(report.runs, out / "results.csv")
    if any(r.points for r in report.runs):
        plot_report(report.runs, out, title or report.name)
    return out


def new_report(name: str, **extra: Any) -> Report:
    """An empty report for scenario ``name`` with the environment filled in."""
    args = sys.argv[1:] if sys.argv[1:2] == ["scenario"] else ["scenario", name]
    # the BENCH_* variables a scenario reads are part of the command that reproduces it
    settings = [f"{k}={shlex.quote(v)}" for k, v in sorted(os.environ.items()) if k.startswith("BENCH_")]
    command = " ".join([*settings, "python -m bench", *args])
    return Report(name, environment(command=command, **extra))


def log(message: str) -> None:
    """A scenario progress message on stderr."""
    print(f"== {message}", file=sys.stderr, flush=True)


def measure(
    url: str,
    model: str,
    levels: list[float],
    label: str,
    *,
    tools: Iterable[str] = ("bench",),
    batch_size: int = 1,
    shapes: tuple[str, ...] = (),
    window_s: float = 2.0,
    max_windows: int = 10,
) -> list[Run]:
    """Sweep ``levels`` on ``model`` with each of ``tools`` (``bench`` and/or ``perf_analyzer``)."""
    runs = []
    for tool in tools:
        if tool == "perf_analyzer":
            runs.append(
                run_perf_analyzer(
                    url,
                    model,
                    levels,
                    label=f"{label} (perf_analyzer)",
                    batch_size=batch_size,
                    shapes=shapes,
                    measurement_interval_ms=int(window_s * 1000),
                    max_trials=max_windows,
                )
            )
        else:
            opts = MeasureOptions(
                window_s=window_s, max_windows=max_windows, batch_size=batch_size, shapes=shapes
            )
            runs.append(run_client(sweep(url, model, levels, label=f"{label} (bench)", opts=opts)))
    return runs


PEER = "tritonserver"
THIS = "this server"


def peer_and_this(repo: Path, logs: Path, grpc: bool = False) -> list[tuple[str, Callable[[], ServerHandle]]]:
    """tritonserver and this server on ``repo``, as ``(label, start function)`` pairs in the order they
    run; each logs into ``logs``. ``grpc``: this server listens for gRPC too (tritonserver always does)."""
    return [
        (
            PEER,
            lambda: start_tritonserver(
                repo, free_port(), free_port(), free_port(), log_path=logs / "tritonserver.log"
            ),
        ),
        (
            THIS,
            lambda: start_this_server(
                repo,
                free_port(),
                grpc_port=free_port() if grpc else None,
                log_path=logs / "this_server.log",
            ),
        ),
    ]
