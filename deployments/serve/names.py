"""Names of the Serve applications this server deploys."""

from __future__ import annotations

import hashlib
import re

SERVER_APP = "triton"
SERVER_ROUTE = "/v2"
MODEL_DEPLOYMENT = "model"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def model_app_name(model: str) -> str:
    """The Serve application of ``model`` (safe for HAProxy backend names)."""
    safe = _UNSAFE.sub("_", model)
    if safe != model:
        safe += "-" + hashlib.sha1(model.encode()).hexdigest()[:8]
    return f"model-{safe}"


def model_route(model: str) -> str:
    return f"{SERVER_ROUTE}/models/{model}"


HOSTED_MARK = "#hosted-by:"


def hosted_key(replica_id: str, ensemble: str) -> str:
    """Key of statistics pushed for a model that ``ensemble`` hosts in replica ``replica_id``."""
    return f"{replica_id}{HOSTED_MARK}{ensemble}"


def is_hosted_key(key: str) -> bool:
    return HOSTED_MARK in key
