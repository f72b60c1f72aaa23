"""Model config helpers of ``triton_python_backend_utils``: look-ups in the config a model is given.

``model_config`` is the parsed JSON of ``args["model_config"]`` in ``initialize``.
(``pb_utils.ModelConfig``, the object ``auto_complete_config`` edits, lives
with the repository loader that calls it.)
"""

from __future__ import annotations

from typing import Any


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((t for t in model_config.get("input", []) if t.get("name") == name), None)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((t for t in model_config.get("output", []) if t.get("name") == name), None)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool((model_config.get("model_transaction_policy") or {}).get("decoupled", False))
