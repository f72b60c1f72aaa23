"""A server of its own for a test module, started the way an operator starts one (a subprocess running
``serve run`` on a config file, through ``python -m deployments.serve.launch run`` as ``make serve``
does, or plain), on free ports and private temporary folders; stopped by signal, and every process it
started ended by pid."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Collection
from pathlib import Path
from typing import Any

import yaml

from deployments.serve.request_path import haproxy_files_env, instance_ports_env
from tests.serve import processes


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


STANDALONE_PORT_BLOCK = 2  # replica ports apart from the session's Serve instance (bench servers: 3)

ROOT = Path(__file__).resolve().parents[2]


# Ports a test server binds some seconds after they are chosen: outside the kernel's ephemeral range
# (32768-60999 here), which every Ray process's outgoing and port-0 sockets draw from, and outside
# Ray's worker ports (10002-19999), so nothing else takes one in between.
TEST_PORTS = range(20000, 30000)


def free_port(taken: Collection[int] = ()) -> int:
    """A port of :data:`TEST_PORTS` that nothing listens on now, and not one of ``taken``."""
    for port in random.sample(TEST_PORTS, 200):
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {TEST_PORTS}")


def free_ports(count: int, taken: Collection[int] = ()) -> list[int]:
    """``count`` different ports of :data:`free_port`'s: each is free only until it is bound, so two
    separate picks for one server can be the same port."""
    ports: list[int] = []
    for _ in range(count):
        ports.append(free_port({*taken, *ports}))
    return ports


def port_is_bound(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


def http(url: str, body: dict[str, Any] | None = None, timeout: float = 30.0) -> tuple[int, str, bytes]:
    """``(status, content type, body)`` of a GET (or a POST of ``body`` as JSON)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Content-Type", ""), error.read()


class Server:
    """One server in a subprocess; ``url`` is ``http://127.0.0.1:<port>``."""

    def __init__(
        self,
        repository: Path,
        *,
        launcher: bool = True,
        request_path_in_config: bool = True,
        args: dict[str, Any] | None = None,
    ) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="trs-", dir="/tmp"))
        # its folder goes with it, also where a test only stops it (to read its log after the stop)
        weakref.finalize(self, shutil.rmtree, self.tmp, True)
        self.repo = repository
        self.ports_env = instance_ports_env(STANDALONE_PORT_BLOCK)
        # the HTTP, gRPC and metrics ports: three different ones, none of the instance's own
        self.port, grpc_port, metrics_port = free_ports(3, {int(p) for p in self.ports_env.values()})
        self.stats_port = int(self.ports_env["RAY_SERVE_HAPROXY_STATS_PORT"])
        self.metrics_port = int(self.ports_env["RAY_SERVE_HAPROXY_METRICS_PORT"])
        self.url = f"http://127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"  # Triton's, not HAProxy's
        config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
        config["http_options"] = {"host": "127.0.0.1", "port": self.port}
        app = config["applications"][0]
        app["args"] = {
            "model_repository": str(repository),
            "grpc_port": grpc_port,
            "metrics_port": metrics_port,
            **(args or {}),
        }
        if "grpc_options" in config:  # HAProxy binds the gRPC port: this server's own
            config["grpc_options"]["port"] = app["args"]["grpc_port"]
        if not request_path_in_config:
            config.pop("controller_options", None)
            app.pop("runtime_env", None)
        self.config = self.tmp / "serve_config.yaml"
        self.config.write_text(yaml.safe_dump(config))
        env = dict(os.environ)
        for key in [k for k in env if k.startswith(("RAY_SERVE_", "RAY_worker"))]:
            env.pop(key)
        env.update(haproxy_files_env(self.tmp / "haproxy"))
        env.update(self.ports_env)
        env.update(
            RAY_TMPDIR=str(self.tmp / "ray"),
            PYTHONPATH=str(ROOT),
        )
        (self.tmp / "ray").mkdir()
        bin_dir = Path(sys.executable).parent
        if os.environ.get("TRITON_SERVE_TEST_ENV_ONLY"):  # a tree without the launcher (a before run)
            from deployments.serve.launch import REQUEST_PATH_ENV

            env.update(REQUEST_PATH_ENV)
            command = [str(bin_dir / "serve"), "run", str(self.config)]
        elif launcher:
            command = [sys.executable, "-m", "deployments.serve.launch", "run", str(self.config)]
        else:
            command = [str(bin_dir / "serve"), "run", str(self.config)]
        self.log = self.tmp / "server.log"
        self.proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # as a terminal starts it: Ctrl-C (SIGINT) reaches Python's handler even where this test run
            # was itself started in the background (a non-interactive shell's `&` ignores SIGINT, inherited)
            preexec_fn=_default_sigint,
        )
        self.pids: set[int] = {processes.identify(self.proc.pid)}

    def track(self) -> set[int]:
        """Every process the server started so far (kept after they end, so the teardown can check), each
        a :class:`processes.Pid`: a number another process has taken since is never counted as ours."""
        if self.proc.poll() is None:  # not reaped yet: the number is still the server's
            found = processes.descendants(self.proc.pid)
            self.pids = {p for p in self.pids if p not in found} | found  # a reused number: the new one
        return self.pids

    def wait_ready(self, models: list[str], timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.track()
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log.read_text()[-3000:]}")
            try:
                # the models answer from their replicas, the server's own routes (metadata, the
                # repository API) from the server application's, which HAProxy may route a moment later
                ready = all(http(f"{self.url}/v2/models/{m}/ready", timeout=2)[0] == 200 for m in models)
                if ready and http(f"{self.url}/v2", timeout=2)[0] == 200:
                    self.track()
                    return
            except OSError:
                pass
            time.sleep(1)
        raise TimeoutError(f"models {models} not ready: {self.log.read_text()[-3000:]}{self.serve_errors()}")

    def serve_errors(self, lines: int = 30) -> str:
        """The warning and error lines of this server's Serve logs (the controller's and every
        replica's): the launcher's own log does not have them."""
        found: list[str] = []
        for path in sorted(self.tmp.glob("ray/**/session_latest/logs/serve/*.log")):
            with contextlib.suppress(OSError):
                found += [
                    f"{path.name}: {line[:300]}"
                    for line in path.read_text(errors="replace").splitlines()
                    if line.startswith(("ERROR", "WARNING")) or "Error: " in line
                ]
        return "\nServe's warnings and errors:\n" + "\n".join(found[-lines:]) if found else ""

    def replica_pids(self, model: str) -> list[int]:
        """The pids of ``model``'s Serve replicas among this server's processes."""
        tag = f"ServeReplica:model-{model}:"
        return sorted(p for p in processes.alive(self.track()) if tag in processes.command(p))

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> set[int]:
        """Signal the server; what of its processes is still alive ``timeout_s`` later (then ended)."""
        self.track()
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout_s)
        deadline = time.monotonic() + 10
        while processes.alive(self.pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = processes.alive(self.pids)
        for pid in sorted(left):  # named while they still run (the caller's assertion comes after the end)
            print(
                f"still running {timeout_s + 10:.0f}s after the signal: {pid} {processes.command(pid)[:200]}"
            )
        processes.end(self.pids)
        return left

    def close(self) -> None:
        self.stop()
        # a process on its way out (Ray's, HAProxy's) may still write a file as the folder goes: again
        for _ in range(10):
            shutil.rmtree(self.tmp, ignore_errors=True)
            if not self.tmp.exists():
                break
            time.sleep(0.5)
