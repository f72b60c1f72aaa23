"""Names of the Serve applications this server deploys (the plan names a model's; see
``repository_loader.plan``), and the keys of statistics pushed to the server."""

from __future__ import annotations

from repository_loader.plan import (
    MODEL_DEPLOYMENT,
    SERVER_APP,
    SERVER_ROUTE,
    is_group_app,
    model_app_name,
    model_route,
)

SERVER_DEPLOYMENT = "server"
HOSTED_MARK = "#hosted-by:"


def hosted_key(replica_id: str, ensemble: str) -> str:
    """Key of statistics pushed for a model that ``ensemble`` hosts in replica ``replica_id``."""
    return f"{replica_id}{HOSTED_MARK}{ensemble}"


def is_hosted_key(key: str) -> bool:
    return HOSTED_MARK in key


def hosting_ensemble(key: str) -> str:
    """The ensemble named by a hosted key (:func:`hosted_key`)."""
    return key.split(HOSTED_MARK, 1)[1]


def stats_path(model: str) -> str:
    """The path of ``model``'s statistics, where a sibling also asks a replica for its own counts."""
    return f"{model_route(model)}/stats"


__all__ = [
    "HOSTED_MARK",
    "hosting_ensemble",
    "MODEL_DEPLOYMENT",
    "SERVER_APP",
    "SERVER_DEPLOYMENT",
    "SERVER_ROUTE",
    "hosted_key",
    "is_group_app",
    "is_hosted_key",
    "model_app_name",
    "model_route",
    "stats_path",
]
