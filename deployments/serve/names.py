"""Names of the Serve applications this server deploys (the plan names a model's; see
``repository_loader.plan``), and the keys of statistics pushed to the server."""

from __future__ import annotations

from repository_loader.plan import (
    GROUP_APP_MARK,
    MODEL_DEPLOYMENT,
    SERVER_APP,
    SERVER_ROUTE,
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


def is_group_app(app: str, model: str | None = None) -> bool:
    """Whether Serve application ``app`` is an instance group's past the first (of ``model``, if given)."""
    base, mark, index = app.rpartition(GROUP_APP_MARK)
    if not mark or not index.isdigit() or index.startswith("0"):
        return False
    return model is None or base == model_app_name(model)


__all__ = [
    "HOSTED_MARK",
    "MODEL_DEPLOYMENT",
    "SERVER_APP",
    "SERVER_DEPLOYMENT",
    "SERVER_ROUTE",
    "hosted_key",
    "is_group_app",
    "is_hosted_key",
    "model_app_name",
    "model_route",
]
