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
