"""The setup hooks of the workers started for the server's deployments (``deployments.serve.spare``):
each imports what its replica runs, ahead of the replica.

A failure is logged, never raised: Ray ends a worker whose setup hook raises, and no replica could
then start."""

from __future__ import annotations

import logging

from deployments.serve import hooks

logger = logging.getLogger(__name__)


def server() -> None:
    """The server application's workers."""
    try:
        import deployments.serve.app  # noqa: F401

        hooks.import_replica_actor()
    except Exception:
        logger.warning("the server's worker could not import its modules ahead", exc_info=True)


def model() -> None:
    """The workers of model deployments and model hosts."""
    try:
        import deployments.serve.model_app  # noqa: F401
        import deployments.serve.model_host  # noqa: F401

        hooks.import_replica_actor()
    except Exception:
        logger.warning("a model's worker could not import its modules ahead", exc_info=True)
