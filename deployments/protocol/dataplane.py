"""The transport-neutral data plane the protocol front ends call.

The HTTP front end (``deployments.protocol.http``) and the gRPC front end are
thin adapters over one :class:`DataPlane`: they decode a request, call one of
its methods, and encode what it returns. Every method is a coroutine, since
some of them gather state from other replicas. Failures are raised as
:class:`~repository_loader.errors.ServerError` subclasses (unknown model:
``NotFound``; not ready: ``Unavailable``; bad request: ``InvalidArgument``),
which each front end maps to its status once.

:class:`ModelDataPlane` is the one implementation. It answers readiness,
metadata, configuration and statistics over a :class:`ModelRegistry`, which
hands it a :class:`ServedModel` or raises ``NotFound`` / ``Unavailable`` with
Triton's messages, and sends every inference to its router
(``deployments.runtime.router``), the one place that decides where an
inference runs. A model replica builds it over a registry of its one model
(``deployments.replica``), the server application over the model controller
(``deployments.control``).

The helpers below build the KServe v2 metadata documents from a model
description, so every served model reports them alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol, runtime_checkable

from deployments.inference import InferRequest, InferResponse
from deployments.protocol.log_settings import LogBoard
from deployments.protocol.shared_memory import SharedMemory, local_shared_memory
from deployments.runtime.router import RawReply, RawRequest, Router
from deployments.settings import LogSettings
from deployments.tracing.control import LocalTraces, TraceControl
from deployments.tracing.store import read_changes
from repository_loader.errors import InvalidArgument, NoAvailableVersion, NotFound, Unavailable
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
    "logging",
    "system_shared_memory",
    "trace",
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

    async def infer(self, request: InferRequest, raw: RawRequest | None = None) -> InferResponse | RawReply:
        """Run one inference: an unknown or unready model raises; the inference's own failure is
        ``response.error``. ``raw`` (an HTTP request as it arrived) lets the router send it on
        unchanged, and the reply then comes back as it is."""
        ...

    def infer_stream(self, request: InferRequest) -> AsyncGenerator[InferResponse, None]:
        """Run one inference and yield every response as it comes (a decoupled model: 0..N, the
        last with ``final`` set; any other model: one). Closing the iterator early cancels the
        request. Errors as in :meth:`infer`."""
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

    async def log_settings(self) -> LogSettings:
        """The server's log settings (Triton's logging extension)."""
        ...

    async def update_log_settings(self, changes: Mapping[str, Any]) -> LogSettings:
        """Apply ``changes`` (checked ``LogSettings`` fields) in every process of the server; the
        settings now in effect."""
        ...

    async def trace_settings(self, name: str | None = None) -> dict[str, Any]:
        """Triton's trace setting document, global (None) or of model ``name``."""
        ...

    async def update_trace_settings(self, name: str | None, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Apply a trace setting request (read with Triton's rules, ``deployments.tracing.read_changes``,
        once the model is known); the document after it."""
        ...


@runtime_checkable
class ServedModel(Protocol):
    """One model as the data plane reaches it: a local runtime or a remote handle."""

    description: ModelDescription

    def is_ready(self, version: str = "") -> bool: ...

    def metadata(self, version: str = "") -> dict[str, Any]:
        """The body of ``GET /v2/models/<m>[/versions/<v>]``; raises NotFound for a version not served."""
        ...

    def config(self, version: str = "") -> dict[str, Any]: ...

    async def statistics(self, version: str = "") -> list[dict[str, Any]]:
        """The model's ``model_stats`` entries (every version when ``version`` is "")."""
        ...


@runtime_checkable
class ModelRegistry(Protocol):
    """Where the data plane finds models, and the repository behind them."""

    def get(self, name: str) -> ServedModel:
        """The model ``name``; NotFound (unknown) or Unavailable (known, not served) otherwise."""
        ...

    def describe(self, name: str) -> ModelDescription:
        """The description the repository holds for ``name``, served or not (NotFound / Unavailable)."""
        ...

    def ready(self) -> bool:
        """Triton's server readiness."""
        ...

    def served(self) -> list[str]:
        """The names of the models :meth:`get` returns."""
        ...

    async def index(self, ready_only: bool = False) -> list[dict[str, Any]]: ...

    async def load(self, name: str, parameters: Mapping[str, Any]) -> None: ...

    async def unload(self, name: str, parameters: Mapping[str, Any]) -> None: ...


Describe = Callable[[str, str], Awaitable[ModelDescription]]


async def _named(
    responses: AsyncGenerator[InferResponse, None], name: str
) -> AsyncGenerator[InferResponse, None]:
    """``responses`` with the model name the client asked for."""
    try:
        async for response in responses:
            yield replace(response, model_name=name)
    finally:
        await responses.aclose()


class ModelDataPlane:
    """The data plane: every :class:`DataPlane` method over a :class:`ModelRegistry`, inference
    through a :class:`~deployments.runtime.router.Router`, which alone decides where it runs.

    ``describe_elsewhere`` (a model replica) gives the description of a model its registry does
    not hold (a gRPC stream's later request for another model), from the server application.
    ``front_ends_ready`` (the server application) holds readiness back until every front end
    answers, so that a client told "ready" over HTTP is answered over gRPC too. ``discover`` (a
    model host) makes a model its registry does not know yet known, where it exists (True).
    ``elsewhere`` (a model host) answers for a model that is neither in its registry nor
    discovered: one served elsewhere, as the server application describes it now (or its error).
    ``logs`` (the server application) holds the server's log settings (the logging extension).
    ``shared_memory`` is the process's view of the registered shared-memory regions (default: a
    table of its own, as the server application holds it; a model replica's asks the server's).
    ``key_for`` (the server application, with model namespacing) names the model a request's model
    name stands for (the one known copy of a name in several repositories); its answers keep the
    name the client asked for.
    """

    def __init__(
        self,
        registry: ModelRegistry,
        router: Router,
        notices: Mapping[str, Any] | None = None,
        describe_elsewhere: Describe | None = None,
        front_ends_ready: Callable[[], bool] | None = None,
        server_name: str = SERVER_NAME,
        discover: Callable[[str], Awaitable[bool]] | None = None,
        elsewhere: Callable[[str], Awaitable[ServedModel]] | None = None,
        logs: LogBoard | None = None,
        shared_memory: SharedMemory | None = None,
        traces: TraceControl | None = None,
        key_for: Callable[[str], str] | None = None,
    ) -> None:
        self.registry = registry
        self._key_for = key_for
        self.logs = logs
        self.shared_memory = shared_memory if shared_memory is not None else local_shared_memory()
        # the trace settings: the server application's own, asked of it by a model replica
        self.traces: TraceControl = traces or LocalTraces()
        self._discover = discover
        self._elsewhere = elsewhere
        self.router = router
        # extra fields of the server metadata: what the operator must know (e.g. a slow request path)
        self.notices = dict(notices or {})
        self._describe_elsewhere = describe_elsewhere
        self._front_ends_ready = front_ends_ready
        self.server_name = server_name  # Triton's --id

    async def server_metadata(self) -> dict[str, Any]:
        return {**server_metadata_document(self.server_name), **self.notices}

    async def live(self) -> bool:
        return True

    async def ready(self) -> bool:
        if self._front_ends_ready is not None and not self._front_ends_ready():
            return False
        return self.registry.ready()

    async def _get(self, name: str) -> ServedModel:
        """The registry's model ``name``, discovered first where the registry does not know it yet."""
        try:
            return self.registry.get(name)
        except NoAvailableVersion:
            raise
        except NotFound:
            if self._discover is not None and await self._discover(name):
                return self.registry.get(name)
            if self._elsewhere is None:
                raise
        return await self._elsewhere(name)

    async def model_ready(self, name: str, version: str = "") -> bool:
        if self._front_ends_ready is not None and not self._front_ends_ready():
            return False  # a model ready over one protocol is ready over every one
        try:
            model = await self._get(name)
        except (Unavailable, NoAvailableVersion):
            return False
        return model.is_ready(version)

    async def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        return (await self._get(name)).metadata(version)

    async def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        try:
            model = await self._get(name)
        except (Unavailable, NoAvailableVersion):
            return dict(self.registry.describe(name).config_json)
        return model.config(version)

    async def model_description(self, name: str, version: str = "") -> ModelDescription:
        try:
            return (await self._get(name)).description
        except NoAvailableVersion:
            raise
        except NotFound:
            if self._describe_elsewhere is None:
                raise
        return await self._describe_elsewhere(name, version)

    async def infer(self, request: InferRequest, raw: RawRequest | None = None) -> InferResponse | RawReply:
        asked = request.model_name
        key = self._key_for(asked) if self._key_for is not None else asked
        if key == asked:
            return await self.router.route(request, raw)
        response = await self.router.route(replace(request, model_name=key))
        return replace(response, model_name=asked) if isinstance(response, InferResponse) else response

    def infer_stream(self, request: InferRequest) -> AsyncGenerator[InferResponse, None]:
        asked = request.model_name
        key = self._key_for(asked) if self._key_for is not None else asked
        if key == asked:
            return self.router.stream(request)
        return _named(self.router.stream(replace(request, model_name=key)), asked)

    async def model_statistics(self, name: str | None = None, version: str = "") -> dict[str, Any]:
        if name is not None:
            return {"model_stats": await (await self._get(name)).statistics(version)}
        models = [self.registry.get(n) for n in self.registry.served()]
        results = await asyncio.gather(*(m.statistics() for m in models), return_exceptions=True)
        return {"model_stats": [s for r in results if isinstance(r, list) for s in r]}

    async def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return await self.registry.index(ready_only)

    async def load_model(self, name: str, parameters: Mapping[str, Any]) -> None:
        await self.registry.load(name, parameters)

    async def unload_model(self, name: str, parameters: Mapping[str, Any]) -> None:
        await self.registry.unload(name, parameters)

    async def log_settings(self) -> LogSettings:
        return self._logs().current

    async def update_log_settings(self, changes: Mapping[str, Any]) -> LogSettings:
        return await self._logs().update(changes)

    def _logs(self) -> LogBoard:
        """The server's log settings: the server application holds them, a model replica does not."""
        if self.logs is None:
            raise Unavailable("the server does not support dynamic logging")
        return self.logs

    async def trace_settings(self, name: str | None = None) -> dict[str, Any]:
        await self._check_traced_model(name)
        return await self.traces.settings(name or None)

    async def update_trace_settings(self, name: str | None, settings: Mapping[str, Any]) -> dict[str, Any]:
        await self._check_traced_model(name)  # first, as Triton: an unknown model before a bad setting
        return await self.traces.update(name or None, read_changes(settings))

    async def _check_traced_model(self, name: str | None) -> None:
        if name and not await self._ready_or_not(name):
            raise InvalidArgument(f"Request for unknown model : {name}")

    async def _ready_or_not(self, name: str) -> bool:
        try:
            return await self.model_ready(name)
        except NotFound:
            return False


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
        "name": model.folder_name,
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
