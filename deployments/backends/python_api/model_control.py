"""``pb_utils.load_model``, ``unload_model`` and ``is_model_ready``: model control from a model's code.

They go through the same bridge as BLS calls; the server decides whether a
model may load or unload others (its model control mode).
"""

from __future__ import annotations

from deployments.backends.python_api.context import current_bridge
from deployments.backends.python_api.request import as_text


def load_model(model_name: str | bytes, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) ``model_name`` from the repository; ``config`` a JSON override, ``files`` its files.

    The server decides whether loading is allowed (its model control mode).
    """
    current_bridge().control("load_model", as_text(model_name), config, dict(files or {}))


def unload_model(model_name: str | bytes, unload_dependents: bool = False) -> None:
    """Unload ``model_name`` (and the models that depend on it when ``unload_dependents``)."""
    current_bridge().control("unload_model", as_text(model_name), bool(unload_dependents))


def is_model_ready(model_name: str | bytes, model_version: str = "") -> bool:
    """Whether ``model_name`` (the given version, or the policy's choice) is ready for inference."""
    return bool(current_bridge().control("is_model_ready", as_text(model_name), as_text(model_version)))
