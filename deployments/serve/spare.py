"""Warm workers for the next replicas (docs/recovery.md, "Spare workers").

Serve starts a replica as a Ray actor in a new worker process: Python, ``import ray``, then the
replica's modules (Serve's, this server's) before its constructor runs, over a second on a 2-core
machine. Each replica of the server application and of a model keeps one idle worker of its job and
runtime environment on its node (``hooks.prestart_workers``), which the raylet gives the next replica
of that environment it starts there: a restarted server, a model's replica replaced after a crash, a
model loaded or scaled up. The environment's setup hook (``deployments.serve.preload``) has already
imported what the replica runs. The server's environment and the models' differ by that hook (the
server starts its models with its own environment, its hook swapped for the models'), so a model
never takes the server's spare; what else the server starts (the rate limiter) runs with no hook.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from deployments.serve import hooks

logger = logging.getLogger(__name__)

SERVER_PRELOAD = "deployments.serve.preload.server"
MODEL_PRELOAD = "deployments.serve.preload.model"
# the server deployment's ray_actor_options runtime_env (Serve merges its env_vars over the application's)
SERVER_RUNTIME_ENV: dict[str, Any] = {"env_vars": {hooks.SETUP_HOOK_ENV: SERVER_PRELOAD}}
KEEP_ALIVE_S = 365 * 24 * 3600  # until a replica takes it (Ray ends it with its job or node)
DELAY_S = 5.0  # after the replica's start, so the spare's own start does not slow the replica's
SPARES_PER_NODE = 1  # idle workers kept per node and environment


def without_setup_hook(runtime_env: Mapping[str, Any]) -> dict[str, Any]:
    """``runtime_env`` less any setup hook."""
    env = dict(runtime_env)
    env_vars = {k: v for k, v in (env.get("env_vars") or {}).items() if k != hooks.SETUP_HOOK_ENV}
    if env_vars:
        env["env_vars"] = env_vars
    else:
        env.pop("env_vars", None)
    return env


def child_runtime_env(preload: str | None) -> dict[str, Any] | None:
    """The runtime environment for what this process deploys or starts: its own with ``preload`` as the
    setup hook instead of the server's (no hook for None); None where it has no server hook (not the
    server's replica, or Ray not connected), and Serve's or Ray's default then applies."""
    import ray

    if not ray.is_initialized():
        return None
    own = dict(ray.get_runtime_context().runtime_env or {})
    if (own.get("env_vars") or {}).get(hooks.SETUP_HOOK_ENV) != SERVER_PRELOAD:
        return None
    env = without_setup_hook(own)
    if preload is not None:
        env["env_vars"] = {**(env.get("env_vars") or {}), hooks.SETUP_HOOK_ENV: preload}
    return env


def with_model_runtime_env(ray_actor_options: Mapping[str, Any]) -> dict[str, Any]:
    """A model deployment's ``ray_actor_options`` with the models' runtime environment (Serve would
    give it the server's own: ``hooks``, ``inherited_runtime_env``); options naming one keep theirs."""
    options = dict(ray_actor_options)
    env = child_runtime_env(MODEL_PRELOAD)
    if env is not None and "runtime_env" not in options:
        options["runtime_env"] = env
    return options


RAYLET_PID_ENV = "RAY_RAYLET_PID"  # set by the raylet in every worker it starts
LOCK_NAME = "triton_serve_spares.lock"  # in the node's Ray session folder
SEEN_WITHIN_S = 5.0  # how long a requested worker may take to appear among the processes


def spares(preload: str, raylet_pid: str, proc: Path = Path("/proc")) -> list[int]:
    """The workers of raylet ``raylet_pid`` whose environment names ``preload`` as its setup hook and
    that run nothing yet: idle, or still starting (not yet named ``ray::...``; a replica's worker still
    starting is counted too, so a node never gets more spares than asked for)."""
    marks = (f"{hooks.SETUP_HOOK_ENV}={preload}\0".encode(), f"{RAYLET_PID_ENV}={raylet_pid}\0".encode())
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            title = (entry / "cmdline").read_bytes().split(b"\0", 1)[0]
            if title.startswith(b"ray::") and title != hooks.IDLE_WORKER_TITLE.encode():
                continue
            environ = b"\0" + (entry / "environ").read_bytes()
            if all(b"\0" + mark in environ for mark in marks):
                found.append(int(entry.name))
    return found


def top_up(preload: str, target: int = SPARES_PER_NODE) -> int:
    """Ask this node's raylet for as many idle workers of this worker's environment as make ``target``
    (those there counted by :func:`spares`); how many were asked for. The replicas of a node take turns
    (a lock in the node's Ray session folder), each counting what the ones before it asked for."""
    import fcntl

    raylet_pid = os.environ.get(RAYLET_PID_ENV, "")
    with open(Path(hooks.session_dir()) / LOCK_NAME, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        have = len(spares(preload, raylet_pid))
        missing = target - have
        if missing <= 0:
            return 0
        hooks.prestart_workers(missing, KEEP_ALIVE_S)
        deadline = time.monotonic() + SEEN_WITHIN_S  # the next one counts them: wait until they show
        while len(spares(preload, raylet_pid)) < target and time.monotonic() < deadline:
            time.sleep(0.05)
        return missing


async def keep_spare(delay_s: float = DELAY_S) -> None:
    """After ``delay_s``, keep a spare worker on this node for this replica's environment (named by the
    setup hook this process started with; none: nothing to keep)."""
    preload = os.environ.get(hooks.SETUP_HOOK_ENV)
    if not preload:
        return
    await asyncio.sleep(delay_s)
    try:
        asked = await asyncio.to_thread(top_up, preload)
    except Exception as exc:  # the next replica only starts slower without it
        logger.warning("no spare worker for the next replica: %s", exc)
    else:
        if asked:
            logger.info("a spare worker waits on this node for the next replica (%s)", preload)
