"""Which Python model's code runs in the current context, and where its BLS calls go.

The backend sets a :class:`~deployments.backends.python_api.bls.BlsBridge`
around each call into a model. A context variable carries it to the model's
code and its asyncio tasks; the last one set is the default for threads the
model starts itself. The logger reads the model's name from it, BLS calls
the executor.
"""

from __future__ import annotations

import contextvars
import sys
from typing import TYPE_CHECKING

from deployments.backends.python_api.errors import TritonModelException
from repository_loader.python_autocomplete import COMPLETING_MODEL_DIR

if TYPE_CHECKING:
    from deployments.backends.python_api.bls import BlsBridge

_BRIDGE: contextvars.ContextVar[BlsBridge | None] = contextvars.ContextVar("pb_utils_bridge", default=None)
_default_bridge: BlsBridge | None = None


def set_bridge(bridge: BlsBridge, default: bool = True) -> contextvars.Token[BlsBridge | None]:
    """Make ``bridge`` the target of BLS calls in this context (and for threads the model starts)."""
    global _default_bridge
    if default:
        _default_bridge = bridge
    return _BRIDGE.set(bridge)


def reset_bridge(token: contextvars.Token[BlsBridge | None]) -> None:
    _BRIDGE.reset(token)


def current_model_name() -> str:
    """The name of the Python model whose code runs in this context ("" outside any)."""
    bridge = _BRIDGE.get() or _default_bridge
    return bridge.model_name if bridge is not None else ""


def get_model_dir() -> str:
    """``pb_utils.get_model_dir()``: the folder of the model version whose code runs in this context
    (``<repository>/<model>/<version>``), also for a model of a Python-based backend, whose
    ``model.py`` lives in the backend directory."""
    completing = COMPLETING_MODEL_DIR.get()  # auto_complete_config runs while the repository is read
    if completing:
        return completing
    bridge = _BRIDGE.get() or _default_bridge
    if bridge is None or not bridge.model_dir:
        raise TritonModelException(
            "get_model_dir() is unavailable: no Python model is loaded in this process"
        )
    return bridge.model_dir


def current_bridge() -> BlsBridge:
    """Where this context's BLS calls go (an error when no Python model is loaded in this process)."""
    bridge = _BRIDGE.get() or _default_bridge
    if bridge is None:
        raise TritonModelException("BLS is unavailable: no Python model is loaded in this process")
    return bridge


def as_stub_process() -> None:
    """Present this replica process to model code as the Python backend's stub presents itself: an
    embedded interpreter, whose ``sys.argv`` is ``[""]``. Code that parses the command line (a model
    running ``unittest.main`` in ``execute``, as Triton's own test models do) would otherwise read the
    Ray worker's arguments and exit."""
    sys.argv = [""]
