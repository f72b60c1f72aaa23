"""The transport-neutral data plane the protocol front ends call.

The HTTP front end (``deployments.protocol.http``) and the gRPC front end are
thin adapters over one :class:`DataPlane`: they decode a request, call one of
its methods, and encode what it returns. Every method is a coroutine, since
some of them gather state from other replicas. Failures are raised as
:class:`~repository_loader.errors.ServerError` subclasses (unknown model:
``NotFound``; not ready: ``Unavailable``; bad request: ``InvalidArgument``),
which each front end maps to its status once.

The helpers below build the KServe v2 metadata documents from a model
description, so every data plane reports them alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from deployments.inference import InferRequest, InferResponse
from repository_loader.model import ModelDescription, TensorSpec

SERVER_NAME = "triton"
SERVER_VERSION = "2.51.0"  # the Triton release whose protocol this server speaks
SERVER_EXTENSIONS: tuple[str, ...] = (
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "binary_tensor_data",
    "parameters",
    "statistics",
)


@runtime_checkable
class DataPlane(Protocol):
    """What a protocol front end needs from the server, independent of the transport."""

    async def server_metadata(self) -> dict[str, Any]:
        """``{"name", "version", "extensions"}`` (see :func:`server_metadata_document`)."""
        ...

    async def live(self) -> bool:
        """Whether the server process is up."""
        ...

    async def ready(self) -> bool:
        """Triton's strict readiness: every model the repository should serve is ready."""
        ...

    async def model_ready(self, name: str, version: str = "") -> bool:
        """Whether ``name`` (at ``version``, "" = the latest served) accepts inferences."""
        ...

    async def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        """``{"name", "versions", "platform", "inputs", "outputs"}`` (see :func:`model_metadata_document`)."""
        ...

    async def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        """The completed model configuration as JSON (``ModelDescription.config_json``)."""
        ...

    async def model_description(self, name: str, version: str = "") -> ModelDescription:
        """The model's description, against which the front end checks infer requests."""
        ...

    async def infer(self, request: InferRequest) -> InferResponse:
        """Run one inference; an error may be raised or set on the response."""
        ...

    async def model_statistics(self, name: str | None = None, version: str = "") -> dict[str, Any]:
        """``{"model_stats": [...]}`` for one model (every model when ``name`` is None)."""
        ...

    async def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Every model of the repository: ``{"name", "version", "state", "reason"}``."""
        ...

    async def load_model(self, name: str, parameters: Mapping[str, Any]) -> None:
        """Load or reload ``name``; ``parameters`` may hold ``config`` (JSON) and ``file:<path>`` (base64)."""
        ...

    async def unload_model(self, name: str, parameters: Mapping[str, Any]) -> None:
        """Unload ``name``; ``parameters`` may hold ``unload_dependents``."""
        ...


def server_metadata_document(
    name: str = SERVER_NAME,
    version: str = SERVER_VERSION,
    extensions: tuple[str, ...] = SERVER_EXTENSIONS,
) -> dict[str, Any]:
    """The body of ``GET /v2``."""
    return {"name": name, "version": version, "extensions": list(extensions)}


def model_metadata_document(
    model: ModelDescription, versions: tuple[int, ...] | None = None
) -> dict[str, Any]:
    """The body of ``GET /v2/models/<m>``: Triton reports the backend as platform where none is set."""
    served = model.versions if versions is None else versions
    return {
        "name": model.name,
        "versions": [str(v) for v in served],
        "platform": model.platform or model.backend,
        "inputs": [_tensor_metadata(t, model.max_batch_size) for t in model.inputs],
        "outputs": [_tensor_metadata(t, model.max_batch_size) for t in model.outputs],
    }


def _tensor_metadata(spec: TensorSpec, max_batch_size: int) -> dict[str, Any]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": spec.full_shape(max_batch_size)}


def empty_model_statistics(name: str, version: str) -> dict[str, Any]:
    """One entry of ``model_stats`` with every counter at zero, in Triton's layout."""
    from deployments.runtime.stats import ModelStats

    return ModelStats(name, version).to_json()
