"""Python backend: a user's unchanged ``model.py`` (``TritonPythonModel``).

``initialize(args)`` gets Triton's argument keys (``model_config`` as a JSON
string, ``model_name``, ``model_version``, ``model_repository``,
``model_instance_kind``, ``model_instance_name``, ``model_instance_device_id``);
``execute(requests)`` gets the requests of one batch and may be sync or async;
``finalize()`` runs at unload. Calls stay serialized per instance, as in Triton.
An async ``execute`` runs on the event loop. A sync one runs where it costs
least (:class:`ExecutePlacement`): on the loop thread itself while its calls
stay short, in one worker thread per instance otherwise, so a slow model
never stalls the replica's HTTP serving and BLS calls keep being served. Decoupled models
answer through ``request.get_response_sender()``; :meth:`PythonBackend.stream`
yields those responses as they are sent. A non-decoupled model may answer
through the sender too: its first response is the answer.

When ``execute`` raises, or returns what Triton refuses (a decoupled model
returning anything but None, a wrong list), every request of the call that has
no answer yet gets Triton's error, "Failed to process the request(s) for model
'<instance>', message: ...", which is also logged. A raised ``TritonError``
keeps its code instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import inspect
import itertools
import json
import logging
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

from deployments.backends.base import Backend, BackendContext, execution_timeout_s, in_thread, timed
from deployments.backends.python_api import numpy1
from deployments.backends.python_api.bls import BlsBridge, NeedsWorkerThread
from deployments.backends.python_api.context import reset_bridge, set_bridge
from deployments.backends.python_api.errors import TritonError, TritonModelException, to_server_error
from deployments.backends.python_api.request import TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, InferenceRequest
from deployments.backends.python_api.response import InferenceResponse
from deployments.backends.python_api.response_sender import ResponseChannel
from deployments.inference import InferRequest, InferResponse
from repository_loader import datatypes
from repository_loader.errors import InternalError, InvalidArgument, ServerError, Unavailable, Unsupported
from repository_loader.model import ModelDescription

logger = logging.getLogger(__name__)
_counter = itertools.count()


def import_model(path: Path, model_name: str) -> ModuleType:
    """Import ``model.py`` under a private module name; its folder joins ``sys.path`` as in Triton."""
    if not path.exists():
        raise Unavailable(f"model '{model_name}': no Python model file at {path}")
    safe = "".join(c if c.isalnum() else "_" for c in model_name)
    module_name = f"_triton_python_model_{safe}_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise Unavailable(f"model '{model_name}': cannot import {path}")
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.append(folder)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as error:
        sys.modules.pop(module_name, None)
        raise Unavailable(
            f"model '{model_name}': importing {path} failed: {type(error).__name__}: {error}"
        ) from None
    return module


def _reschedule_refused(request: InferenceRequest, model_name: str) -> InvalidArgument:
    """The error of a request its model released with RESCHEDULE where the model's scheduler does not
    run requests again (only an iterative sequence batcher does)."""
    return InvalidArgument(
        "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, but model "
        f"'{model_name}' is not configured to run requests again: set sequence_batching "
        f"{{ iterative_sequence: true }} (request '{request.request_id()}')"
    )


def _sequence_gone(request: InferenceRequest, model_name: str) -> InvalidArgument:
    """The error of a rescheduled request whose iterative sequence went idle while the model held it."""
    return InvalidArgument(
        f"inference request for sequence {request.correlation_id()} to model '{model_name}' must specify "
        "the START flag on the first request of the sequence"
    )


def _plain(value: Any) -> Any:
    """JSON-ready copy of a config value (mappings -> dict, tuples -> list)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def config_dict(model: ModelDescription) -> dict[str, Any]:
    """The model configuration in Triton's JSON form (built from the description if it has none)."""
    if model.config_json:
        return _plain(model.config_json)

    def tensor(spec: Any, with_optional: bool) -> dict[str, Any]:
        entry = {
            "name": spec.name,
            "data_type": datatypes.wire_to_config(spec.datatype),
            "dims": list(spec.dims),
        }
        if spec.reshape is not None:
            entry["reshape"] = {"shape": list(spec.reshape)}
        if with_optional:
            entry["optional"] = spec.optional
        return entry

    return {
        "name": model.name,
        "backend": model.backend or "python",
        "max_batch_size": model.max_batch_size,
        "input": [tensor(t, True) for t in model.inputs],
        "output": [tensor(t, False) for t in model.outputs],
        "parameters": {k: {"string_value": v} for k, v in model.parameters.items()},
        "model_transaction_policy": {"decoupled": model.decoupled},
    }


EXECUTE_MODE_PARAMETER = "EXECUTE_MODE"
"""Model parameter choosing where a sync ``execute`` runs: ``auto`` (default), ``thread`` or ``inline``."""

FORCE_CPU_ONLY_PARAMETER = "FORCE_CPU_ONLY_INPUT_TENSORS"
"""Triton's model parameter: ``yes`` (default) hands every input to ``execute`` in host memory."""


def host_inputs_only(model: ModelDescription) -> bool:
    """Whether ``model``'s ``execute`` receives its inputs on the host (:class:`Unsupported` if misspelt)."""
    value = model.parameters.get(FORCE_CPU_ONLY_PARAMETER)
    if value is None or value == "yes":
        return True
    if value == "no":
        return False
    raise Unsupported(f"Incorrect value for {FORCE_CPU_ONLY_PARAMETER}: {value}'")


class ExecutePlacement:
    """Where a sync ``execute`` runs: on the event loop thread, or in the instance's worker thread.

    Handing a call to a worker thread and back costs the loop far more than a
    trivial ``execute`` itself (a thread wake-up, a self-pipe write, a GIL
    hand-over: about 0.2 ms per call on a 2-core machine). A pure-Python
    ``execute`` holds the GIL anyway, so the thread buys nothing while calls are
    short. ``auto`` therefore measures every call (an exponential moving
    average) and runs it inline while the average stays under ``inline_below_s``,
    and in the thread once it rises over ``thread_above_s``. Models that do BLS
    or run event loops of their own (their source names
    ``InferenceRequest`` or ``asyncio``), decoupled models and the
    ``thread`` mode always use the thread; ``inline`` always runs on the loop.
    """

    SAMPLES_BEFORE_INLINE = 4
    SMOOTHING = 0.2

    def __init__(
        self, mode: str, eligible: bool, inline_below_s: float = 0.0005, thread_above_s: float = 0.002
    ) -> None:
        if mode not in ("auto", "thread", "inline"):
            raise ValueError(f"{EXECUTE_MODE_PARAMETER} must be 'auto', 'thread' or 'inline', not '{mode}'")
        self.mode = mode if eligible or mode == "thread" else "thread"
        self.inline_below_s = inline_below_s
        self.thread_above_s = thread_above_s
        self.average_s = 0.0
        self.samples = 0
        self.inline = self.mode == "inline"

    def record(self, seconds: float) -> None:
        """Account for one ``execute`` call that took ``seconds`` and decide where the next one runs."""
        self.samples += 1
        if self.samples == 1:
            self.average_s = seconds
        else:
            self.average_s += self.SMOOTHING * (seconds - self.average_s)
        if self.mode != "auto":
            return
        if self.inline and self.average_s > self.thread_above_s:
            self.inline = False
        elif (
            not self.inline
            and self.samples >= self.SAMPLES_BEFORE_INLINE
            and self.average_s < self.inline_below_s
        ):
            self.inline = True

    def pin_to_thread(self) -> None:
        """The model did a sync BLS call: from now on every call runs in the worker thread."""
        self.mode = "thread"
        self.inline = False


def _may_block_inline(module: ModuleType) -> bool:
    """Whether ``model.py`` does BLS or runs event loops of its own: then it never runs on the loop thread."""
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return True
    return "InferenceRequest" in source or "asyncio" in source


class PythonBackend(Backend):
    """One ``TritonPythonModel`` instance."""

    def __init__(self, context: BackendContext) -> None:
        super().__init__(context)
        self._output_names = [o.name for o in self.model.outputs]
        self._host_inputs = True
        self._bridge = BlsBridge(
            context.executor,
            model_name=self.model.name,
            model_dir=str(self.model.version_path(context.version)),
        )
        self._pool: ThreadPoolExecutor | None = None
        self._instance: Any = None

    # --- lifecycle ---------------------------------------------------------------

    @property
    def instance_name(self) -> str:
        """Triton's name for this instance, ``<group name>_<index>`` (``add_sub_0_0``).

        Models see it in ``args`` and error messages name it. A name the caller
        gives in that form, of any of the model's groups, is kept; any other (a
        replica's id) becomes the first group's index 0.
        """
        names = [g.name or f"{self.model.name}_{i}" for i, g in enumerate(self.model.instance_groups)]
        names = names or [f"{self.model.name}_0"]
        given = self.context.instance_name
        return given if any(given.startswith(f"{name}_") for name in names) else f"{names[0]}_0"

    def initialize_args(self) -> dict[str, str]:
        """The ``args`` Triton passes to ``initialize``."""
        ctx = self.context
        return {
            "model_config": json.dumps(config_dict(self.model)),
            "model_instance_kind": ctx.instance_kind.value.removeprefix("KIND_"),
            "model_instance_name": self.instance_name,
            "model_instance_device_id": str(ctx.device_id),
            "model_repository": str(self.model.path),
            "model_version": str(ctx.version),
            "model_name": self.model.folder_name,
        }

    def model_path(self) -> Path:
        """The ``model.py`` to run: the version's own, or the Python-based backend's."""
        return Path(self.model.python_runtime) if self.model.python_runtime else super().model_path()

    def load(self) -> None:
        self._host_inputs = host_inputs_only(self.model)
        numpy1.restore()  # a model written for Triton 2.51's stub may use NumPy 1's aliases
        module = import_model(self.model_path(), self.model.name)
        self._module_name = module.__name__
        model_class = getattr(module, "TritonPythonModel", None)
        if model_class is None:
            raise Unavailable(f"model '{self.model.name}': model.py defines no class TritonPythonModel")
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"python-model-{self.model.name}")
        try:
            self._instance = model_class()
            self._async = inspect.iscoroutinefunction(self._instance.execute)
            mode = self.model.parameters.get(EXECUTE_MODE_PARAMETER, "auto").strip().lower()
            if execution_timeout_s(self.model) is not None and mode in ("auto", "inline"):
                mode = "thread"  # code on the event loop cannot be timed out: its timer would never fire
            self.placement = ExecutePlacement(
                mode,
                eligible=not self._async and not self.model.decoupled and not _may_block_inline(module),
            )
            self._lifecycle("initialize", self.initialize_args())
        except Exception as error:
            self._pool.shutdown(wait=False)
            raise Unavailable(
                f"model '{self.model.name}' failed to initialize: {type(error).__name__}: {error}"
            ) from None

    def _lifecycle(self, name: str, *args: Any) -> None:
        """Call ``initialize``/``finalize`` if the model has it (sync or async) with BLS available."""
        method = getattr(self._instance, name, None)
        if method is None:
            return
        token = set_bridge(self._bridge)
        try:
            result = method(*args)
            if inspect.isawaitable(result):
                assert self._pool is not None
                self._pool.submit(asyncio.run, _awaited(result)).result()
        finally:
            reset_bridge(token)

    def unload(self) -> None:
        if self._instance is None:
            return
        try:
            self._lifecycle("finalize")
        finally:
            self._instance = None
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            sys.modules.pop(getattr(self, "_module_name", ""), None)

    # --- execution ---------------------------------------------------------------------

    async def execute(self, requests: Sequence[InferRequest]) -> list[InferResponse]:
        """One response per request; decoupled models: every response of every request, in order."""
        loop = asyncio.get_running_loop()
        if not requests:
            return []
        channels = [ResponseChannel(loop, self.model.decoupled) for _ in requests]
        collected = await self._execute_batch(list(requests), channels)
        return [response for responses in collected for response in responses]

    async def _execute_batch(
        self, batch: list[InferRequest], channels: list[ResponseChannel]
    ) -> list[list[InferResponse]]:
        with timed("input"):
            pb_requests = [
                InferenceRequest.from_server(r, self._output_names, c, self._host_inputs)
                for r, c in zip(batch, channels, strict=True)
            ]
        await self._run(pb_requests, channels)
        ready = [channel.take_all_now() for channel in channels]
        if all(items is not None for items in ready):  # no task per request where all is answered
            gathered = [
                [self._from_item(r, item) for item in items or ()]
                for r, items in zip(batch, ready, strict=True)
            ]
        else:
            gathered = await asyncio.gather(
                *(self._drain(r, c, items) for r, c, items in zip(batch, channels, ready, strict=True))
            )
        if self.model.decoupled:
            return [_collected(responses) for responses in gathered]
        return [[_answer(responses)] for responses in gathered]

    async def stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """Every response of ``request`` as the model sends it; the last has ``final`` set."""
        if not self.model.decoupled:
            for response in await self.execute([request]):
                yield response
            return
        channel = ResponseChannel(asyncio.get_running_loop())
        # no reference kept here: once ``execute`` returns, the model alone holds the request (and its
        # sender, which answers with an error if the model lets go of it before the FINAL flag)
        pb_requests = [InferenceRequest.from_server(request, self._output_names, channel, self._host_inputs)]
        task = asyncio.ensure_future(self._run(pb_requests, [channel]))
        del pb_requests
        try:
            async with contextlib.aclosing(self._responses(request, channel)) as responses:
                async for response in responses:
                    yield response
        finally:
            await task

    def stream_batch(
        self, requests: Sequence[InferRequest]
    ) -> tuple[list[AsyncIterator[InferResponse]], Awaitable[None]]:
        """One ``execute`` for a batch of decoupled requests, each with its own response sender (Triton's
        dynamic batcher batches decoupled requests too): each request's responses as the model sends
        them, and the call to await (it ends when ``execute`` returns)."""
        if not self.model.decoupled:
            return super().stream_batch(requests)
        loop = asyncio.get_running_loop()
        channels = [ResponseChannel(loop) for _ in requests]
        pb_requests = [
            InferenceRequest.from_server(r, self._output_names, c, self._host_inputs)
            for r, c in zip(requests, channels, strict=True)
        ]
        return (
            [self._responses(r, c) for r, c in zip(requests, channels, strict=True)],
            self._run(pb_requests, channels),
        )

    async def _responses(
        self, request: InferRequest, channel: ResponseChannel
    ) -> AsyncGenerator[InferResponse, None]:
        finished = False
        try:
            async for item in channel.items():
                finished = item[1]
                yield self._from_item(request, item)
        finally:
            if not finished:  # the consumer stopped early (a cancelled client)
                channel.cancelled = True

    async def _run(self, pb_requests: list[InferenceRequest], channels: list[ResponseChannel]) -> None:
        """Call ``execute`` for the batch, then again for the requests it rescheduled, as Triton does.

        A request released with ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` runs
        again, with the others rescheduled in the same call, until the model
        releases it with ALL (or, decoupled, sends FINAL). What each call returns
        is checked and delivered before the next. When a call fails, every
        request of it that has no answer yet gets the error, and the error is logged.
        """
        requests, senders = pb_requests, channels
        while True:
            scheduled_ns = time.monotonic_ns()
            returned, error = await self._invoke(requests)
            if error is None:
                error = self._deliver(requests, senders, returned)
            if error is not None:
                logger.error("%s", error.message)
                for channel in senders:
                    channel.fail(error)
                return
            again = [i for i, request in enumerate(requests) if request.take_reschedule()]
            if again and not self._iterative:
                # Triton's scheduler refuses the release: only iterative sequences run a request again
                for i in again:
                    senders[i].fail(_reschedule_refused(requests[i], self.model.name))
                return
            if not again:
                return
            idle_ns = self._idle_ns
            if idle_ns and time.monotonic_ns() - scheduled_ns > idle_ns:
                # held past max_sequence_idle_microseconds: the sequence lost its slot meanwhile, and its
                # request comes back without START, as in Triton's sequence batcher
                for i in again:
                    senders[i].fail(_sequence_gone(requests[i], self.model.name))
                return
            requests = [requests[i] for i in again]
            senders = [senders[i] for i in again]

    @property
    def _idle_ns(self) -> int:
        """The sequence idle limit of an iterative model (0: none)."""
        sequence = self.model.sequence_batching
        return sequence.max_sequence_idle_microseconds * 1000 if sequence is not None else 0

    @property
    def _iterative(self) -> bool:
        """Whether the model may release a request with RESCHEDULE (``sequence_batching { iterative_sequence:
        true }``, as Triton's Python backend README requires)."""
        return self.model.sequence_batching is not None and self.model.sequence_batching.iterative

    def _deliver(
        self, requests: list[InferenceRequest], channels: list[ResponseChannel], returned: Any
    ) -> ServerError | None:
        """Send what ``execute`` returned, after Triton's checks (all of them before anything is sent)."""
        if returned is None:
            return None
        if self.model.decoupled:
            return self._failed(
                f"Python model '{self.instance_name}' is using the decoupled mode and the execute "
                "function must return None."
            )
        if not isinstance(returned, list):
            return self._failed(f"Expected a list in the execute return, found type '{type(returned)}'.")
        if len(returned) != len(requests):
            return self._failed(
                "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
                f"InferenceRequest(s) size is:{len(requests)}, and InferenceResponse(s) size "
                f"is:{len(returned)}\n"
            )
        for request, channel, response in zip(requests, channels, returned, strict=True):
            if response is None:
                continue
            if request.release_flags() == TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
                return self._failed(
                    "Expected a None object in the execute function return list for reschduled request, "
                    f"found type '{type(response)}'."
                )
            if not isinstance(response, InferenceResponse):
                return self._failed(
                    "Expected an 'InferenceResponse' object in the execute function return list, "
                    f"found type '{type(response)}'."
                )
            try:
                channel.check(response, True)
            except TritonModelException as error:
                return self._failed(str(error))
        for channel, response in zip(channels, returned, strict=True):
            if response is not None:
                channel.put(response, True)
        return None

    def _failed(self, message: str) -> ServerError:
        """Triton's error for a failed ``execute`` of this instance."""
        return InternalError(
            f"Failed to process the request(s) for model '{self.instance_name}', message: {message}"
        )

    async def _invoke(self, pb_requests: list[InferenceRequest]) -> tuple[Any, ServerError | None]:
        """Call the model's ``execute``; return what it returned, or the error it raised."""
        self._bridge.loop = asyncio.get_running_loop()
        token = set_bridge(self._bridge)
        try:
            if self._async:
                returned = await self._instance.execute(pb_requests)
            else:
                returned = await self._execute_sync(pb_requests)
                if inspect.isawaitable(returned):
                    returned = await returned
            return returned, None
        except Exception as error:
            if isinstance(error, TritonError):
                return None, to_server_error(error)
            if isinstance(error, ServerError):
                return None, error
            return None, self._failed(f"{type(error).__name__}: {error}")
        finally:
            reset_bridge(token)

    async def _execute_sync(self, pb_requests: list[InferenceRequest]) -> Any:
        placement = self.placement
        if placement.inline:
            self._bridge.inline = True
            start = time.perf_counter()
            try:
                returned = self._instance.execute(pb_requests)
                placement.record(time.perf_counter() - start)
                return returned
            except NeedsWorkerThread:
                placement.pin_to_thread()  # nothing was answered yet: run the batch again in the thread
            finally:
                self._bridge.inline = False
        return await in_thread(
            self._pool, self._timed_execute, pb_requests, on_cancel=lambda: _cancel(pb_requests)
        )

    def _timed_execute(self, pb_requests: list[InferenceRequest]) -> Any:
        start = time.perf_counter()
        try:
            return self._instance.execute(pb_requests)
        finally:
            self.placement.record(time.perf_counter() - start)

    # --- responses -------------------------------------------------------------------------

    def _convert(self, request: InferRequest, response: Any, final: bool = True) -> InferResponse:
        if not isinstance(response, InferenceResponse):
            error = InternalError(
                f"model '{self.model.name}': execute returned a {type(response).__name__}, not an InferenceResponse"
            )
            return InferResponse.failed(request, error)
        with timed("output"):
            converted = response.to_server(
                self.model.name,
                str(self.context.version),
                request.id,
                request.output_names(self._output_names),
            )
        converted.final = final
        return converted

    async def _drain(
        self,
        request: InferRequest,
        channel: ResponseChannel,
        ready: list[tuple[Any, bool, Any]] | None = None,
    ) -> list[InferResponse]:
        """The responses of ``request``: those already taken (``ready``), else as they come."""
        if ready is not None:
            return [self._from_item(request, item) for item in ready]
        return [self._from_item(request, item) async for item in channel.items()]

    def _from_item(self, request: InferRequest, item: tuple[Any, bool, Any]) -> InferResponse:
        response, final, error = item
        if error is not None:
            return InferResponse.failed(request, error)
        if response is None:
            return InferResponse(
                final=final,
                model_name=self.model.name,
                model_version=str(self.context.version),
                id=request.id,
            )
        return self._convert(request, response, final)


def _cancel(requests: list[InferenceRequest]) -> None:
    for request in requests:
        request.mark_cancelled()


def _collected(responses: list[InferResponse]) -> list[InferResponse]:
    """A decoupled request's responses without the empty end marker; the last one is final."""
    sent = [r for r in responses if r.outputs or r.error]
    if not sent:
        return responses[-1:]
    for response in sent:
        response.final = False
    sent[-1].final = True
    return sent


def _answer(responses: list[InferResponse]) -> InferResponse:
    """A non-decoupled request's answer: the one response it got (the model's, or the error)."""
    answer = responses[-1]
    answer.final = True
    return answer


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
