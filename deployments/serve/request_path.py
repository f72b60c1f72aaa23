"""The request path's settings: environment variables that Ray's processes read when they start.

One list (:data:`REQUEST_PATH_ENV`), what the process that starts Ray must carry
(:func:`request_path_env`, used by ``deployments.serve.launch``), and what a server started
without them says about it (:func:`request_path_notice`: a loud log line and a field of ``GET /v2``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from deployments.serve import hooks
from deployments.serve.haproxy_shim import REAL_BINARY_ENV, SCRIPT, THREADS_ENV, haproxy_threads, real_binary

# Ray Serve direct ingress behind HAProxy: each model replica answers HTTP itself.
# HAProxy's metrics make it log every request to a Ray actor that parses the lines
# (a fifth of a core on a trivial model at 2,000 requests/s); Serve's replica
# metrics and this server's Triton metrics stay on. Ray starts its workers at nice 15,
# so on a shared node every other process (a load generator, an agent) took the
# CPU from the replicas answering requests; Triton runs at normal priority, so do they.
REQUEST_PATH_ENV = {
    "RAY_worker_niceness": "0",
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    "RAY_SERVE_HAPROXY_METRICS_ENABLED": "0",
    THREADS_ENV: str(haproxy_threads(len(os.sched_getaffinity(0)))),
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "1",
    # A model's replica answers its own routes without Serve's per-request wrapper, and
    # inference runs to completion when a client disconnects, as in Triton
    # (deployments/serve/ingress.py).
    hooks.PROXY_CALLBACK_ENV: "deployments.serve.ingress:middlewares",
    # Serve's per-replica gRPC servers (streams, and every call the server application answers) take
    # messages up to this size, compressed ones checked as they inflate: the default gRPC limits
    # (``grpc_max_receive_message_bytes`` / ``grpc_max_send_message_bytes``, 64 MiB), not Serve's 2 GiB
    hooks.GRPC_MAX_MESSAGE_ENV: str(64 * 1024 * 1024),
    # Serve says after this many seconds (not 30) that a replica waits for a node with free resources;
    # a load then fails ``placement_timeout_s`` later instead of holding model control
    hooks.SLOW_STARTUP_ENV: "10",
    hooks.SLOW_STARTUP_PERIOD_ENV: "10",
    # Serve checks each node's proxy (HAProxy) every 2 s, not 10 s: a killed HAProxy is started again
    # after three failed checks, about 6 s instead of 30 s
    "RAY_SERVE_PROXY_HEALTH_CHECK_PERIOD_S": "2",
    # Large tensors: HAProxy moves bodies in 64 KiB buffers, not 16 KiB (taken while data is in flight,
    # two per stream at most), and lets a gRPC client send 1 MiB of a call before it must wait for a
    # window update, not 64 KiB: a 1 MiB ModelInfer answered about a third more calls a second
    "RAY_SERVE_HAPROXY_TUNE_BUFSIZE": str(64 * 1024),
    "RAY_SERVE_HAPROXY_H2_FE_INITIAL_WINDOW_SIZE": str(1024 * 1024),
    # Serve's replica log files are written line by line, not held back until 1,000 lines (what
    # RAY_SERVE_THROUGHPUT_OPTIMIZED sets): with access logs off, a replica logs little, and what it
    # logs (a start, a warning) is wanted in the dashboard and the file when it happens
    "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1",
}
TUNING = (  # request-path variables whose other values are slower, not wrong
    "RAY_worker_niceness",
    "RAY_SERVE_HAPROXY_NBTHREAD",
    "RAY_SERVE_HAPROXY_TUNE_BUFSIZE",
    "RAY_SERVE_HAPROXY_H2_FE_INITIAL_WINDOW_SIZE",
)


# Serve's HAProxy files; their defaults are one machine-wide folder (/tmp/haproxy-serve) that every
# Serve instance on the machine would share
HAPROXY_FILES = {
    "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": "haproxy.cfg",
    "RAY_SERVE_HAPROXY_SOCKET_PATH": "admin.sock",
    "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": ".",
    "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": "server-state",
    "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": "metrics.sock",
}
HAPROXY_PORTS = ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT")
# Serve's fallback proxies bind these with SO_REUSEPORT: two Serve instances on one machine with the same
# ports would have the kernel share connections between them (the gRPC one answers HAProxy's checks)
FALLBACK_PORTS = ("RAY_SERVE_FALLBACK_PROXY_HTTP_PORT", "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT")
_REPLICA_RANGES = {  # Serve's defaults: HTTP 30000-31000, gRPC 40000-41000
    "HTTP": ("RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT", "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT", 30000),
    "GRPC": ("RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT", "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT", 40000),
}


def instance_ports_env(block: int) -> dict[str, str]:
    """Ports of a second Serve instance on one machine (tests, benchmarks), all by ``block`` (1-9):
    HAProxy's stats and metrics at 8410 / 9110 plus the block, the fallback proxies' at 8500 / 9500
    plus the block, and replica ports in block ``block`` of 1000 above Serve's default ranges, so
    neither instance routes to the other's replicas. None is picked as a free port: ports picked free
    in the ephemeral range were taken before the listener bound them (by one of Ray's processes, or
    by a replica's gRPC server of another instance, whose ports are in that range)."""
    if not 1 <= block <= 9:
        raise ValueError(f"port block must be 1-9, not {block}")
    env = {key: str(base + block) for key, base in zip(HAPROXY_PORTS, (8410, 9110), strict=True)}
    env.update({key: str(base + block) for key, base in zip(FALLBACK_PORTS, (8500, 9500), strict=True)})
    for low_key, high_key, base in _REPLICA_RANGES.values():
        env[low_key] = str(base + 1000 * block)
        env[high_key] = str(base + 1000 * (block + 1))
    return env


def haproxy_files_env(root: Path) -> dict[str, str]:
    """Serve's HAProxy configuration, sockets and state files under ``root``, for a second Serve
    instance on one machine (tests, benchmarks, the nodes of a cluster in namespaces)."""
    return {key: str(root / name) for key, name in HAPROXY_FILES.items()}


HAPROXY_SCRIPT = SCRIPT
"""Starts HAProxy through ``deployments.serve.haproxy_shim`` (a committed script; ``serve_config.yaml``
names it relative to the repository root)."""
PYTHON_ENV = "TRITON_SERVE_PYTHON"


def haproxy_env() -> dict[str, str]:
    """Serve's HAProxy started through ``deployments.serve.haproxy_shim`` (listeners on the configured
    host only, JSON error pages, gRPC routed by model, ends with its manager), by this Python."""
    env = {hooks.HAPROXY_BINARY_ENV: str(HAPROXY_SCRIPT), PYTHON_ENV: sys.executable}
    with contextlib.suppress(ImportError, OSError):  # else the shim looks again when it runs
        env[REAL_BINARY_ENV] = real_binary()
    return env


def request_path_env() -> dict[str, str]:
    """Every variable the process that starts Ray needs: the request path's and the HAProxy shim's."""
    return {**REQUEST_PATH_ENV, **haproxy_env()}


def missing_request_path_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """The request-path variables this process was started without (its value differs or is unset).

    Read in a replica, which inherits the environment of the Ray node (or the application's
    ``runtime_env``); ``RAY_worker_niceness`` is judged by the process's own priority, the only
    place it shows.
    """
    env = os.environ if environ is None else environ
    missing = [k for k, v in REQUEST_PATH_ENV.items() if k not in TUNING and env.get(k) != v]
    if environ is None and os.nice(0) > int(REQUEST_PATH_ENV["RAY_worker_niceness"]):
        missing.insert(0, "RAY_worker_niceness")
    return missing


SLOW_PATH_FIX = (
    "start Ray with them: `make serve`, `triton-serve serve`, "
    "`python -m deployments.serve.launch run serve_config.yaml`, or `triton-serve ray-start --head` "
    "before `serve deploy` (serve_config.yaml also carries them for `serve run`)"
)


def request_path_notice(logger: logging.Logger | None = None) -> dict[str, Any]:
    """Nothing when this process has the request-path settings; otherwise a loud log line and the
    extra field of the server metadata (``GET /v2``) that says which are missing."""
    missing = missing_request_path_env()
    if not missing:
        return {}
    (logger or logging.getLogger("ray.serve")).warning(
        "SLOW REQUEST PATH: Ray was started without %s; inference goes through Serve's proxy at a "
        "fraction of the throughput. To fix: %s.",
        ", ".join(missing),
        SLOW_PATH_FIX,
    )
    return {"request_path": {"direct": False, "missing_settings": missing, "fix": SLOW_PATH_FIX}}
