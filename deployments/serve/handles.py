"""Other models' replicas through Serve deployment handles (BLS, ensembles, the server's registry)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import Any

from deployments.inference import InferRequest, InferResponse
from deployments.protocol.dataplane import model_metadata_document
from deployments.runtime.stats import merge_snapshots
from deployments.serve.names import (
    MODEL_DEPLOYMENT,
    SERVER_APP,
    SERVER_DEPLOYMENT,
    is_hosted_key,
    model_app_name,
)
from repository_loader.errors import InvalidArgument, NotFound, ServerError, Unavailable
from repository_loader.model import ModelDescription


class HandleExecutor:
    """A ``ModelExecutor`` that calls the target model's own deployment."""

    def __init__(self) -> None:
        self._handles: dict[str, Any] = {}

    def handle(self, model: str) -> Any:
        handle = self._handles.get(model)
        if handle is None:
            from ray import serve

            try:
                handle = serve.get_deployment_handle(MODEL_DEPLOYMENT, app_name=model_app_name(model))
            except Exception:
                raise NotFound(f"Request for unknown model: '{model}' is not found") from None
            self._handles[model] = handle
        return handle

    async def infer(self, request: InferRequest) -> InferResponse:
        handle = self.handle(request.model_name)
        try:
            response: InferResponse = await handle.infer_internal.remote(request)
            return response
        except Exception as exc:
            raise self._failure(request.model_name, exc) from None

    async def stream(self, request: InferRequest) -> AsyncGenerator[InferResponse, None]:
        """Every response of ``request`` from the model's replica (``infer_stream_internal``), in order.

        Closing this iterator early (or cancelling the task reading it) cancels the call on the
        replica, where the model sees ``request.is_cancelled()``.
        """
        handle = self.handle(request.model_name)
        responses = handle.options(stream=True).infer_stream_internal.remote(request)
        finished = False
        try:
            while True:
                try:
                    response: InferResponse = await responses.__anext__()
                except StopAsyncIteration:
                    finished = True
                    return
                except Exception as exc:
                    finished = True
                    raise self._failure(request.model_name, exc) from None
                yield response
        finally:
            if not finished:
                responses.cancel()

    # --- BLS model control: the server application's repository API, under its model control mode ---

    async def load_model(self, name: str, config: str, files: Mapping[str, bytes]) -> None:
        await self._control("control_load", name, config, dict(files))
        self._handles.pop(name, None)

    async def unload_model(self, name: str, unload_dependents: bool) -> None:
        await self._control("control_unload", name, unload_dependents)
        self._handles.pop(name, None)

    async def is_model_ready(self, name: str, version: str) -> bool:
        return bool(await self._control("control_is_ready", name, version))

    async def _control(self, method: str, *args: Any) -> Any:
        from ray import serve

        server = serve.get_deployment_handle(SERVER_DEPLOYMENT, app_name=SERVER_APP)
        try:
            return await getattr(server, method).remote(*args)
        except Exception as exc:
            cause = exc if isinstance(exc, ServerError) else getattr(exc, "cause", None)
            if isinstance(cause, ServerError):
                raise cause from None
            raise Unavailable(f"model control is unavailable: {exc}") from None

    def _failure(self, model: str, exc: Exception) -> ServerError:
        """The server error a failed handle call stands for (Unavailable when the replica is gone)."""
        if isinstance(exc, ServerError):
            return exc
        cause = getattr(exc, "cause", None) or getattr(exc, "__cause__", None)
        if isinstance(cause, ServerError):
            return cause
        self._handles.pop(model, None)
        return Unavailable(f"model '{model}' is unavailable: {exc}")


class RemoteModel:
    """A :class:`~deployments.protocol.dataplane.ServedModel` whose replicas run in their own application.

    Metadata and configuration come from the description the server holds; inference goes
    through a handle; statistics are those the replicas pushed (several replicas, copies
    hosted by ensembles), else asked of one replica.
    """

    def __init__(
        self,
        description: ModelDescription,
        executor: HandleExecutor,
        pushed: Mapping[str, list[dict[str, Any]]],
    ) -> None:
        self.description = description
        self._executor = executor
        self._pushed = pushed

    def _version(self, version: str) -> tuple[int, ...]:
        if not version:
            return tuple(self.description.versions)
        name = self.description.name
        try:
            number = int(version)
        except ValueError:
            raise InvalidArgument(f"model '{name}': version '{version}' is not a number") from None
        if number not in self.description.versions:
            raise NotFound(f"Request for unknown model: '{name}' version {number} is not found")
        return (number,)

    def is_ready(self, version: str = "") -> bool:
        try:
            return bool(self._version(version))
        except ServerError:
            return False

    def metadata(self, version: str = "") -> dict[str, Any]:
        return model_metadata_document(self.description, self._version(version))

    def config(self, version: str = "") -> dict[str, Any]:
        self._version(version)
        return dict(self.description.config_json)

    async def infer(self, request: InferRequest) -> InferResponse:
        return await self._executor.infer(request)

    def infer_stream(self, request: InferRequest) -> AsyncGenerator[InferResponse, None]:
        return self._executor.stream(request)

    async def statistics(self, version: str = "") -> list[dict[str, Any]]:
        served = {str(v) for v in self._version(version)}
        own = [s for key, s in self._pushed.items() if not is_hosted_key(key)]
        hosted = [s for key, s in self._pushed.items() if is_hosted_key(key)]
        if not own:
            own = [await self._executor.handle(self.description.name).stats_snapshot.remote()]
        return [s for s in merge_snapshots(own + hosted) if s["version"] in served]
