"""Other models' replicas through Serve deployment handles (BLS, ensembles, the server's registry).

A model with several instance groups has one Serve application per group (``repository_loader.plan``),
so one handle per group: each call goes to the group least loaded by this process's calls in
flight, per replica of the group (the first group on a tie), and Serve's handle picks a replica
inside it. Which applications a model has is the server's deployer's to say
(``RayDeployer.group_apps``): the server application reads it in place, a model replica asks
the server once per model and again every ``GROUP_APPS_REFRESH_S`` (never per call).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from deployments.inference import InferRequest, InferResponse
from deployments.protocol.dataplane import model_metadata_document
from deployments.runtime.stats import merge_snapshots
from deployments.serve.direct_calls import DirectCalls, counting
from deployments.serve.names import (
    MODEL_DEPLOYMENT,
    SERVER_APP,
    SERVER_DEPLOYMENT,
    is_hosted_key,
    model_app_name,
)
from deployments.serve.sequence_routing import owner_rank
from repository_loader.errors import InvalidArgument, NotFound, ServerError, Unavailable
from repository_loader.model import ModelDescription

logger = logging.getLogger("ray.serve")

GroupApps = tuple[tuple[str, int], ...]
"""A model's Serve applications, one per instance group in group order, each with its replica count."""
GroupAppsLookup = Callable[[str], Awaitable[GroupApps]]
Connect = Callable[[str], Any]  # application name -> the handle of its model deployment

GROUP_APPS_REFRESH_S = 30.0  # how long a model replica trusts what the server said of a model's groups
GROUP_APPS_ASK_TIMEOUT_S = 2.0  # the server may be starting (its constructor deploys the models)


def own_app(model: str) -> GroupApps:
    """The model's own application alone (a model with one instance group, or none known)."""
    return ((model_app_name(model), 1),)


class GroupPicker:
    """Which instance group of a model takes the next call: the one with the fewest calls in flight
    from this process per replica of the group, the first on a tie."""

    def __init__(self) -> None:
        self.in_flight: dict[str, int] = {}  # application -> calls in flight through it

    def pick(self, apps: GroupApps, correlation_id: int | str = 0) -> str:
        """``correlation_id`` (a sequence's call, several groups): the group holding the owner's rank
        (ranks run over the groups in order, ``deployments.serve.sequence_routing``)."""
        if len(apps) == 1:
            return apps[0][0]
        if correlation_id:
            rank = owner_rank(correlation_id, sum(max(1, n) for _, n in apps))
            for app, replicas in apps:
                if rank < max(1, replicas):
                    return app
                rank -= max(1, replicas)
        index = min(
            range(len(apps)), key=lambda i: (self.in_flight.get(apps[i][0], 0) / max(1, apps[i][1]), i)
        )
        return apps[index][0]

    def calling(self, app: str) -> AbstractContextManager[None]:
        """Count one call in flight through ``app`` while the block runs."""
        return counting(self.in_flight, app)


def _serve_handle(app: str) -> Any:
    from ray import serve

    return serve.get_deployment_handle(MODEL_DEPLOYMENT, app_name=app)


class HandleExecutor:
    """A ``ModelExecutor`` that calls the target model's own deployments.

    ``group_apps`` says which applications a model has (default: ask the server application);
    ``refresh_s`` is how long an answer is kept; ``connect`` makes an application's handle;
    ``direct``, where given, carries unary calls over the replicas' own HTTP ports
    (``deployments.serve.direct_calls``), the handle serving what it cannot.
    """

    def __init__(
        self,
        group_apps: GroupAppsLookup | None = None,
        refresh_s: float = GROUP_APPS_REFRESH_S,
        connect: Connect = _serve_handle,
        direct: DirectCalls | None = None,
    ) -> None:
        self.direct = direct
        self._lookup = group_apps or self._ask_server
        self._refresh_s = refresh_s
        self._connect = connect
        self._handles: dict[str, Any] = {}  # application -> handle
        self._groups: dict[str, tuple[GroupApps, float]] = {}  # model -> its applications, when asked
        self.picker = GroupPicker()

    def handle(self, model: str) -> Any:
        """The handle of the model's own application (its first instance group)."""
        return self._app_handle(model, model_app_name(model))

    def _app_handle(self, model: str, app: str) -> Any:
        handle = self._handles.get(app)
        if handle is None:
            try:
                handle = self._connect(app)
            except Exception:
                raise NotFound(f"Request for unknown model: '{model}' is not found") from None
            self._handles[app] = handle
        return handle

    async def _group_apps(self, model: str) -> GroupApps:
        known = self._groups.get(model)
        now = time.monotonic()
        if known is not None and now - known[1] < self._refresh_s:
            return known[0]
        apps = await self._lookup(model) or own_app(model)
        self._groups[model] = (apps, now)
        return apps

    async def _pick(self, model: str, correlation_id: int | str = 0) -> tuple[str, Any]:
        """The application (least loaded instance group, or the sequence owner's) the next call to
        ``model`` goes to, and its handle."""
        app = self.picker.pick(await self._group_apps(model), correlation_id)
        return app, self._app_handle(model, app)

    async def _ask_server(self, model: str) -> GroupApps:
        """The model's applications as the server's deployer holds them; the model's own alone while
        the server does not answer (it is starting), asked again after ``refresh_s``."""
        from ray import serve

        try:
            server = serve.get_deployment_handle(SERVER_DEPLOYMENT, app_name=SERVER_APP)
            found = await asyncio.wait_for(server.model_apps.remote(model), GROUP_APPS_ASK_TIMEOUT_S)
        except Exception as exc:
            logger.debug("instance groups of model '%s' not known yet: %s", model, exc)
            return own_app(model)
        return tuple((str(app), int(replicas)) for app, replicas in found)

    def forget(self, model: str) -> None:
        """Drop what is known of ``model``'s applications and their handles (asked again on next use)."""
        known = self._groups.pop(model, None)
        for app, _ in (*own_app(model), *(known[0] if known is not None else ())):
            self._handles.pop(app, None)

    async def infer(self, request: InferRequest) -> InferResponse:
        app, handle = await self._pick(request.model_name, request.correlation_id)
        try:
            with self.picker.calling(app):
                direct = await self.direct.infer(app, request) if self.direct is not None else None
                response: InferResponse = direct or await handle.infer_internal.remote(request)
            return response
        except Exception as exc:
            raise self._failure(request.model_name, exc) from None

    async def stream(self, request: InferRequest) -> AsyncGenerator[InferResponse, None]:
        """Every response of ``request`` from the model's replica (``infer_stream_internal``), in order.

        Closing this iterator early (or cancelling the task reading it) cancels the call on the
        replica, where the model sees ``request.is_cancelled()``.
        """
        app, handle = await self._pick(request.model_name, request.correlation_id)
        responses = handle.options(stream=True).infer_stream_internal.remote(request)
        finished = False
        try:
            with self.picker.calling(app):
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
        self.forget(name)

    async def unload_model(self, name: str, unload_dependents: bool) -> None:
        await self._control("control_unload", name, unload_dependents)
        self.forget(name)

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
        self.forget(model)
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
