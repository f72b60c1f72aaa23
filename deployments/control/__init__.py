"""Model control (NONE / EXPLICIT / POLL) and the repository index, independent of Ray.

The :class:`ModelController` is the server's model registry
(``deployments.protocol.dataplane.ModelRegistry``) and does what Triton's model
repository manager does. Its parts, one module each:

* ``controller``: the control modes: start, POLL's change detection, the
  repository API's load and unload (an ensemble's composing models with it);
* ``loading``: loading, reloading and unloading one model through the
  :class:`Deployer`; one model's failure never touches the others;
* ``overlay``: a load's ``config`` / ``file:<version>/<name>`` overrides, written
  as a temporary one-model repository that lives while the model is described from it;
* ``listing``: what the repositories hold (where each name lives, signatures for POLL);
* ``registry``: the view the data plane reads (served models, readiness, the index).

A served model is reached through ``remote``; any other raises NotFound or Unavailable.
Errors name models and repository-relative files, never a server path.
"""

from deployments.control.controller import ModelController
from deployments.control.listing import Listing, Snapshot
from deployments.control.registry import (
    MAX_NAME_LENGTH,
    UNLOADED,
    Deployer,
    ModelEntry,
    Registry,
    RemoteFn,
    check_model_name,
)

__all__ = [
    "MAX_NAME_LENGTH",
    "UNLOADED",
    "Deployer",
    "Listing",
    "ModelController",
    "ModelEntry",
    "Registry",
    "RemoteFn",
    "Snapshot",
    "check_model_name",
]
