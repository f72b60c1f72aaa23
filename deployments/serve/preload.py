"""The setup hook of every worker started for the server deployment (``deployments.serve.spare``)."""

from __future__ import annotations

import logging

from deployments.serve import hooks

logger = logging.getLogger(__name__)


def preload() -> None:
    """Import what the server's replica runs, ahead of the replica.

    A failure is logged, never raised: Ray ends a worker whose setup hook raises, and the server's
    replica would then never start."""
    try:
        import deployments.serve.app  # noqa: F401

        hooks.import_replica_actor()
    except Exception:
        logger.warning("the server's worker could not import its modules ahead", exc_info=True)
