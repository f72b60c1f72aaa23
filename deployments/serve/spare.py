"""A warm worker for the server application's next replica (docs/recovery.md, "Server restart").

Serve starts a replica as a Ray actor in a new worker process: Python, ``import ray``, then the
replica's modules (Serve's, this server's) before its constructor runs, about 1.3 s of the server
application's restart on a 2-core machine. The server keeps one idle worker of its own job and
runtime environment on its node (``hooks.prestart_workers``), which the raylet gives the next
server replica it starts there; the runtime environment's setup hook (``deployments.serve.preload``) has already
imported what the replica runs. The server's environment differs from what it starts itself (model
deployments, the rate limiter) by that hook, so nothing else takes the spare, and they do not run it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from deployments.serve import hooks

logger = logging.getLogger(__name__)

PRELOAD = "deployments.serve.preload.preload"  # the setup hook, named (it imports the server)
# the server deployment's ray_actor_options runtime_env (Serve merges its env_vars over the application's)
SERVER_RUNTIME_ENV: dict[str, Any] = {"env_vars": {hooks.SETUP_HOOK_ENV: PRELOAD}}
KEEP_ALIVE_S = 365 * 24 * 3600  # until a server replica takes it (Ray ends it with its job or node)
DELAY_S = 5.0  # after the replica's start, so the spare's own start does not slow the models' or its own


def without_setup_hook(runtime_env: Mapping[str, Any]) -> dict[str, Any]:
    """``runtime_env`` less the server's setup hook."""
    env = dict(runtime_env)
    env_vars = {k: v for k, v in (env.get("env_vars") or {}).items() if k != hooks.SETUP_HOOK_ENV}
    if env_vars:
        env["env_vars"] = env_vars
    else:
        env.pop("env_vars", None)
    return env


def child_runtime_env() -> dict[str, Any] | None:
    """The runtime environment for what this process deploys or starts: its own less the server's
    setup hook; None where it has no such hook (not the server's replica, or Ray not connected)."""
    import ray

    if not ray.is_initialized():
        return None
    own = dict(ray.get_runtime_context().runtime_env or {})
    if hooks.SETUP_HOOK_ENV not in (own.get("env_vars") or {}):
        return None
    return without_setup_hook(own)


def with_child_runtime_env(ray_actor_options: Mapping[str, Any]) -> dict[str, Any]:
    """A model deployment's ``ray_actor_options`` with :func:`child_runtime_env` (Serve would give it
    the server's own environment: ``hooks``, ``inherited_runtime_env``)."""
    options = dict(ray_actor_options)
    env = child_runtime_env()
    if env is not None and "runtime_env" not in options:
        options["runtime_env"] = env
    return options


async def keep_spare(delay_s: float = DELAY_S) -> None:
    """After ``delay_s``, ask this node's raylet for one idle worker for the next server replica."""
    await asyncio.sleep(delay_s)
    try:
        await asyncio.to_thread(hooks.prestart_workers, 1, KEEP_ALIVE_S)
    except Exception as exc:  # the restart is only slower without it
        logger.warning("no spare worker for the server's next replica: %s", exc)
    else:
        logger.info("a spare worker waits for the server's next replica on this node")
