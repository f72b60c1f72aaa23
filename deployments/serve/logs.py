"""The logging extension across processes: the server application holds the log settings, every
replica follows them.

Every process that logs applies Triton's log flags at start (``ServerSettings.log_settings``); a change
through ``/v2/logging`` or gRPC ``LogSettings`` reaches the server application, whose
:class:`~deployments.protocol.log_settings.LogBoard` applies it there, keeps it in the cluster's
key-value store (a restarted server replica starts from it) and wakes the replicas: each model replica
and model host replica long-polls the server (:func:`follow`, one call pending per replica, renewed
every ``poll_timeout_s``) with the settings it applied and gets the new ones as soon as they differ. A
replica that starts later gets the current settings on its first call, before it has served for long.
Plain asyncio over :class:`~deployments.serve.server_api.ServerClient`: tested without Ray.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Callable

from deployments.serve.server_api import ServerClient
from deployments.settings import LogSettings

logger = logging.getLogger("ray.serve")

POLL_TIMEOUT_S = 20.0  # how long one call waits at the server for a change
RETRY_S = 1.0  # after a failed call (the server restarting, or not up yet)


async def follow(
    server: ServerClient,
    applied: LogSettings,
    apply: Callable[[LogSettings], None],
    poll_timeout_s: float = POLL_TIMEOUT_S,
) -> None:
    """For the replica's life: apply the server's log settings whenever they differ from ``applied``
    (the settings this process applied at start)."""
    asked: LogSettings | None = None  # the first call answers at once: a restarted server may hold others
    while True:
        try:
            current = await server.log_settings(asked, poll_timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.debug("waiting for the server's log settings: %s", exc)
            await asyncio.sleep(RETRY_S)
            continue
        if current is None:
            continue
        if current != applied:
            apply(current)
            applied = current
        asked = current


def encode(settings: LogSettings) -> bytes:
    """The settings as the server keeps them in the cluster (every one but the file, fixed at start)."""
    kept = {k: v for k, v in dataclasses.asdict(settings).items() if k != "file"}
    return json.dumps(kept, sort_keys=True).encode()


def decode(value: bytes | None, start: LogSettings) -> LogSettings:
    """The settings kept in the cluster over ``start`` (the flags); ``start`` where none were kept or
    they cannot be read."""
    if not value:
        return start
    try:
        kept = json.loads(value)
        return start.changed(**{k: kept[k] for k in ("info", "warning", "error", "verbose_level", "format")})
    except (ValueError, KeyError, TypeError):
        logger.warning("the kept log settings cannot be read; the server's flags apply: %r", value)
        return start
