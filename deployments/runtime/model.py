"""The model data plane of one replica: every served version of one model.

Ray-free: the Serve deployment (``deployments.serve.app``) holds one
:class:`ModelRuntime` and puts its HTTP app in front of it. Every request,
whatever its origin (HTTP, gRPC, BLS, an ensemble step), is checked here once
against the model's configuration (:meth:`ModelSchema.check_request`), queued
in the version's scheduler (dynamic batcher or one-at-a-time), executed by the
backend, and accounted for in statistics and metrics.

Errors: :meth:`ModelRuntime.infer` never raises for a request's fault (unknown
version, a broken rule, a rejection, a failing model); the response carries it
in ``error``, as everything behind it does (see :mod:`deployments.inference`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from deployments import custom_metrics
from deployments.backends.base import (
    Backend,
    BackendContext,
    begin_compute_times,
    end_compute_times,
    execution_timeout_s,
)
from deployments.inference import InferRequest, InferResponse, ModelExecutor
from deployments.runtime import response_cache
from deployments.runtime.checks import ModelSchema
from deployments.runtime.metrics import TritonMetrics, tags_for
from deployments.runtime.stats import ModelStats
from deployments.runtime.warmup import warmup_requests
from deployments.tracing import TRACER
from repository_loader.errors import (
    ExecutionTimeout,
    InvalidArgument,
    NotFound,
    Rejected,
    SequenceCancelled,
    ServerError,
    Unavailable,
)
from repository_loader.model import InstanceKind, ModelDescription
from repository_loader.revision import same_but_versions, version_signatures

if TYPE_CHECKING:
    from deployments.runtime.batching import Scheduler

ExecutionGate = Callable[[], contextlib.AbstractAsyncContextManager[None]]
"""What an execution holds while it runs (the rate limiter's resources, docs/rate_limiter.md)."""

logger = logging.getLogger(__name__)

_tickets = itertools.count(1)


def _ticket(request: InferRequest) -> int:
    """``request``'s ticket, given on first use (its copies keep it: the same request, still waiting)."""
    if not request.ticket:
        request.ticket = next(_tickets)
    return request.ticket


ExecuteFn = Callable[[Sequence[InferRequest]], Awaitable[list[InferResponse]]]


async def release_backend(backend: Backend) -> None:
    """``stop`` then ``unload``; ``unload`` runs even when ``stop`` fails."""
    try:
        await backend.stop()
    finally:
        backend.unload()


def failure_reason(error: ServerError | None) -> str:
    """Triton's reason label of a request its scheduler or backend failed (``nv_inference_request_failure``):
    ``CANCELED`` for a request its sequence's cancellation cancelled (a request whose caller left is
    counted so where it is awaited), ``REJECTED`` for one its queue refused, else ``BACKEND``."""
    if isinstance(error, SequenceCancelled):
        return "CANCELED"
    if isinstance(error, Rejected):
        return "REJECTED"
    return "BACKEND"


class VersionRuntime:
    """One loaded version: backend, scheduler, statistics."""

    def __init__(
        self,
        model: ModelDescription,
        version: int,
        backend: Backend,
        metrics: TritonMetrics,
        max_concurrent: int = 1,
        gate: ExecutionGate | None = None,
    ) -> None:
        from deployments.runtime.batching import make_scheduler

        self.model = model
        # docs/rate_limiter.md: each execution holds the instance's rate-limiter resources
        self._gate = gate
        self.version = version
        self.backend = backend
        self.stats = ModelStats(model.name, str(version))
        self._metrics = metrics
        self._tags = tags_for(model.name, version)
        self.scheduler = make_scheduler(model, self._execute, max_concurrent_batches=max_concurrent)
        # a decoupled model's streamed requests go through the dynamic batcher too, as in Triton: one
        # ``execute`` for the batch, each request answered through its own response sender
        self._stream_batcher: Scheduler | None = None
        self._stream_starts: dict[int, asyncio.Future[AsyncIterator[InferResponse]]] = {}
        if model.decoupled and model.dynamic_batching is not None and model.sequence_batching is None:
            self._stream_batcher = make_scheduler(
                model, self._execute_streams, max_concurrent_batches=max_concurrent
            )
        self.ready = False
        self._computes = not model.is_ensemble  # an ensemble's span has its steps, no compute span
        self.schema = ModelSchema.from_description(model)
        self._waiting: set[int] = set()  # tickets of requests accepted and not yet handed to the backend
        self.failures: dict[str, int] = {}  # failed requests by Triton's reason (OTHER, BACKEND, ...)
        # docs: config parameters ``execution_timeout_ms``; ``hung`` says why the version stopped serving
        self.execution_timeout_s = execution_timeout_s(model)
        self.hung: str | None = None
        # docs: config ``response_cache`` (the process's cache, where the server configured one)
        self.cache = response_cache.current() if model.response_cache else None

    def _count_failure(self, reason: str) -> None:
        """One failed request, by Triton's reason; an ensemble's are ``OTHER``, as Triton labels them."""
        if self.model.is_ensemble:
            reason = "OTHER"
        self.failures[reason] = self.failures.get(reason, 0) + 1

    def failure_counts(self) -> dict[str, int]:
        """Failed requests by reason (``nv_inference_request_failure``). An ensemble's count, as
        Triton's, also holds each failed request of its steps (``OTHER``)."""
        counts = dict(self.failures)
        failed_steps = getattr(self.backend, "failed_steps", 0)
        if failed_steps:
            counts["OTHER"] = counts.get("OTHER", 0) + failed_steps
        return counts

    @property
    def pending(self) -> int:
        """Requests waiting for execution (Triton's ``nv_inference_pending_request_count``)."""
        return len(self._waiting)

    async def _execute(self, requests: Sequence[InferRequest]) -> list[InferResponse]:
        if self.hung is not None:
            for request in requests:
                self._waiting.discard(_ticket(request))
            raise Unavailable(f"{self.hung}; the instance is being restarted")
        gate = self._gate() if self._gate is not None else contextlib.nullcontext()
        async with gate:  # a wait for the rate limiter's resources is queue time, and still pending
            start = time.monotonic_ns()
            queue = [start - (r.arrival_ns or start) for r in requests]
            for request in requests:
                self._waiting.discard(_ticket(request))
            times, token = begin_compute_times()
            try:
                if self.execution_timeout_s is None:
                    responses = await self.backend.execute(requests)
                else:
                    responses = await self._execute_within_limit(requests, self.execution_timeout_s)
            finally:
                end_compute_times(token)
        end = time.monotonic_ns()
        if TRACER.active and self._computes:
            for request in requests:
                if request.trace is not None:
                    TRACER.compute_span(
                        request.trace, start, start + times.input_ns, end - times.output_ns, end
                    )
        rows = sum(r.batch_rows() for r in requests) if self.model.max_batch_size > 0 else len(requests)
        inferences = rows
        if (
            self.model.sequence_batching is not None
        ):  # a Direct batch's padding (no correlation ID) is no inference
            real = [r for r in requests if r.correlation_id]
            inferences = sum(r.batch_rows() for r in real) if self.model.max_batch_size > 0 else len(real)
        input_ns, output_ns = times.input_ns, times.output_ns
        infer_ns = max(end - start - input_ns - output_ns, 0)
        self.stats.record_batch(rows, len(requests), queue, input_ns, infer_ns, output_ns, inferences)
        self._metrics.batch(self._tags, inferences, sum(queue), input_ns, infer_ns, output_ns, len(requests))
        return responses

    async def _execute_streams(self, requests: Sequence[InferRequest]) -> list[InferResponse]:
        """The dynamic batcher's execution of streamed decoupled requests: hands each waiting request its
        response stream, then holds the instance until the model's ``execute`` returns."""
        start = time.monotonic_ns()
        queue = [start - (r.arrival_ns or start) for r in requests]
        gate = self._gate() if self._gate is not None else contextlib.nullcontext()
        async with gate:
            streams, execution = self.backend.stream_batch(requests)
            for request, stream in zip(requests, streams, strict=True):
                self._waiting.discard(_ticket(request))
                started = self._stream_starts.pop(id(request), None)
                if started is not None and not started.done():
                    started.set_result(stream)
            await execution
        infer_ns = time.monotonic_ns() - start
        rows = sum(r.batch_rows() for r in requests) if self.model.max_batch_size > 0 else len(requests)
        self.stats.record_batch(rows, len(requests), queue, 0, infer_ns, 0)
        self._metrics.batch(self._tags, rows, sum(queue), 0, infer_ns, 0, len(requests))
        return [InferResponse(id=r.id) for r in requests]  # the answers went through the streams

    async def _batched_stream(self, request: InferRequest) -> AsyncGenerator[InferResponse, None]:
        """``request`` through the stream batcher: its responses once its batch starts, or the batcher's
        refusal (a full queue, a queue timeout, an unload)."""
        assert self._stream_batcher is not None
        started: asyncio.Future[AsyncIterator[InferResponse]] = asyncio.get_running_loop().create_future()
        self._stream_starts[id(request)] = started
        self._waiting.add(_ticket(request))
        submitted = asyncio.ensure_future(self._stream_batcher.submit(request))
        submitted.add_done_callback(lambda t: t.cancelled() or t.exception())
        try:
            waiting: set[asyncio.Future[Any]] = {started, submitted}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if not started.done():
                refused = submitted.result()
                yield (
                    refused
                    if refused.error is not None
                    else InferResponse.failed(
                        request, Unavailable(f"model '{self.model.name}' did not run the request")
                    )
                )
                return
            stream = started.result()
            try:
                async for response in stream:
                    yield response
            finally:
                aclose = getattr(stream, "aclose", None)
                if aclose is not None:
                    await aclose()
        finally:
            self._stream_starts.pop(id(request), None)
            self._waiting.discard(_ticket(request))
            if not started.done():  # left while queued: the batcher drops it
                submitted.cancel()

    async def _execute_within_limit(
        self, requests: Sequence[InferRequest], limit_s: float
    ) -> list[InferResponse]:
        """The backend's execution, failed with :class:`ExecutionTimeout` after ``limit_s``. The backend's
        thread cannot be taken back from a model that never returns: the version is marked ``hung``,
        so the replica reports itself unhealthy and Serve starts a fresh one (``check_health``)."""
        task = asyncio.ensure_future(self.backend.execute(requests))
        done, _ = await asyncio.wait({task}, timeout=limit_s)
        if task in done:
            return task.result()
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        task.cancel()
        self.hung = (
            f"model '{self.model.name}' version {self.version} did not finish executing within its "
            f"execution_timeout_ms ({limit_s * 1000:.0f} ms)"
        )
        logger.error("%s; its instance will be restarted", self.hung)
        raise ExecutionTimeout(self.hung)

    async def infer(self, request: InferRequest) -> InferResponse:
        """Check ``request`` against the model, run it; a failure comes back in ``response.error``."""
        arrival = request.arrival_ns = request.arrival_ns or time.monotonic_ns()
        if request.trace is not None:
            return await self._traced(request, arrival)
        return await self._infer(request, arrival)

    async def _traced(self, request: InferRequest, arrival: int) -> InferResponse:
        """:meth:`_infer` inside the model's span; the request carries that span to its compute span,
        its ensemble steps and its BLS calls."""
        assert request.trace is not None
        span = TRACER.model_span(
            request.trace, self.model.name, self.version, request.id, arrival, time.monotonic_ns()
        )
        request.trace = span.parent
        try:
            return await self._infer(request, arrival)
        finally:
            span.end(time.monotonic_ns())

    async def _infer(self, request: InferRequest, arrival: int) -> InferResponse:
        ok = False
        reason = "OTHER"
        try:
            try:
                self.schema.check_request(request)
            except ServerError as error:
                return InferResponse.failed(request, error)
            key = None
            if self.cache is not None:
                lookup = time.monotonic_ns()
                key = self.cache.key(request, self.model.name, self.version)
                cached = self.cache.get(key) if key is not None else None
                if cached is not None:
                    ok = True
                    self.stats.record_cache(True, time.monotonic_ns() - lookup)
                    return InferResponse(outputs=dict(cached.outputs), parameters=dict(cached.parameters))
                lookup = time.monotonic_ns() - lookup
            self._waiting.add(_ticket(request))
            reason = "BACKEND"
            try:
                response = await self.scheduler.submit(request)
            except asyncio.CancelledError:
                request.cancelled = True  # the caller left: a running model sees it cancelled
                reason = "CANCELED"
                raise
            ok = response.error is None
            if not ok:
                reason = failure_reason(response.error)
            if key is not None and self.cache is not None:
                insert = time.monotonic_ns()
                if ok:
                    self.cache.put(key, response)
                self.stats.record_cache(False, lookup + time.monotonic_ns() - insert)
            return response
        finally:
            self._waiting.discard(_ticket(request))
            duration = time.monotonic_ns() - arrival
            self.stats.record_request(ok, duration)
            self._metrics.request(self._tags, ok, duration)
            if not ok:
                self._count_failure(reason)

    async def infer_stream(self, request: InferRequest) -> AsyncGenerator[InferResponse, None]:
        """Check ``request``, then every response the backend streams for it (the last ``final``).

        With dynamic batching, decoupled requests are batched as Triton batches them (one ``execute``
        per batch, a response sender per request); otherwise each runs alone, counted as a batch of
        one. A consumer that stops early (a cancelled client) closes the backend's stream, which
        cancels the request.
        """
        arrival = request.arrival_ns = request.arrival_ns or time.monotonic_ns()
        ok = False
        reason = "OTHER"
        ended = False  # the final response was handed on
        try:
            try:
                self.schema.check_request(request)
            except ServerError as error:
                yield InferResponse.failed(request, error)
                return
            reason = "BACKEND"
            if self._stream_batcher is not None:
                ok = True
                async with contextlib.aclosing(self._batched_stream(request)) as responses:
                    async for response in responses:
                        if response.error is not None and ok:
                            ok, reason = False, failure_reason(response.error)
                        ended = response.final
                        yield response
                return
            start = time.monotonic_ns()
            ok = True
            stream = self.backend.stream(request)
            try:
                async for response in stream:
                    if response.error is not None and ok:
                        ok, reason = False, failure_reason(response.error)
                    ended = response.final
                    yield response
            finally:  # closed early (a cancelled client): the backend cancels the request now
                aclose = getattr(stream, "aclose", None)
                if aclose is not None:
                    await aclose()
            infer_ns = time.monotonic_ns() - start
            self.stats.record_batch(1, 1, [start - arrival], 0, infer_ns, 0)
            self._metrics.batch(self._tags, 1, start - arrival, 0, infer_ns, 0, 1)
        except (GeneratorExit, asyncio.CancelledError):
            if ok and not ended:  # the consumer left before the final response: a cancelled request
                ok, reason = False, "CANCELED"
            raise
        finally:
            duration = time.monotonic_ns() - arrival
            self.stats.record_request(ok, duration)
            self._metrics.request(self._tags, ok, duration)
            if not ok:
                self._count_failure(reason)

    async def warmup(self) -> None:
        for request in warmup_requests(self.model, self.version):
            try:
                self.schema.check_request(request)
                response = await self.backend.execute([request])
                error = response[0].error if response else None
            except ServerError as exc:
                error = exc
            if error is not None:
                raise Unavailable(
                    f"model '{self.model.name}' version {self.version}: warmup '{request.id}' failed: "
                    f"{error.message}"
                )

    def adopt(self, model: ModelDescription, metrics: TritonMetrics) -> None:
        """Serve on under ``model``, a description of the same model that differs only in the versions
        it selects (``ModelRuntime.take_over``), counting into the new runtime's ``metrics``."""
        self.model = model
        self._metrics = metrics

    async def close(self) -> None:
        self.ready = False
        try:
            await self.scheduler.close()
            if self._stream_batcher is not None:
                await self._stream_batcher.close()
        finally:
            await release_backend(self.backend)


class ModelRuntime:
    """Every version of one model that the version policy selected, in one replica."""

    def __init__(
        self,
        model: ModelDescription,
        instance_kind: InstanceKind = InstanceKind.CPU,
        device_id: int = 0,
        executor: ModelExecutor | None = None,
        instance_name: str = "",
        composing: Mapping[str, ModelDescription] | None = None,
        steps_in_process: bool = True,
        instances: int = 1,
        gate: ExecutionGate | None = None,
        keep: Mapping[int, VersionRuntime] | None = None,
        signatures: Mapping[int, str] | None = None,
    ) -> None:
        self.model = model
        self.gate = gate
        # loaded versions of the runtime this one replaces, served as they are (:meth:`reusable`);
        # still that runtime's until :meth:`take_over`
        self._kept: dict[int, VersionRuntime] = {v: r for v, r in (keep or {}).items() if v in model.versions}
        self.composing = dict(composing or {})
        self.steps_in_process = steps_in_process
        # a model host runs a stateless model's CPU instances as one loaded model: this many batches at once
        self.instances = max(instances, 1)
        self.instance_kind = instance_kind
        self.device_id = device_id
        self.executor = executor
        self.instance_name = instance_name or f"{model.name}_0"
        self.versions: dict[int, VersionRuntime] = {}
        # each loaded version's files (revision.version_signatures): read at load unless given
        self.signatures: dict[int, str] = dict(signatures or {})
        self.metrics = TritonMetrics()
        # requests inside this replica (queued or executing): what Serve's autoscaling scales on
        self.ongoing = 0

    async def load(self) -> None:
        """Load every version and run its warmup; a version is ready only after both."""
        from deployments.backends.registry import create_backend
        from deployments.runtime.sequence_config import backend_model

        # A stateful model's backend also sees the control and state tensors (docs/sequence.md);
        # the request check stays on the model's own inputs.
        seen_by_backend = backend_model(self.model) if self.model.sequence_batching else self.model
        if not self.signatures:
            self.signatures = await asyncio.to_thread(version_signatures, self.model)
        for version in self.model.versions:
            kept = self._kept.get(version)
            if kept is not None:
                self.versions[version] = kept
                logger.info(
                    "model '%s' version %d kept as loaded: its files and configuration did not change",
                    self.model.name,
                    version,
                )
                continue
            context = BackendContext(
                model=seen_by_backend,
                version=version,
                instance_kind=self.instance_kind,
                device_id=self.device_id,
                instance_name=self.instance_name,
                executor=self.executor,
                composing=self.composing,
                steps_in_process=self.steps_in_process,
            )
            backend = create_backend(context)
            backend.load()
            try:
                await backend.start()
                concurrent = backend.max_concurrency * self.instances
                runtime = VersionRuntime(self.model, version, backend, self.metrics, concurrent, self.gate)
                await runtime.warmup()
            except BaseException:
                try:
                    await release_backend(backend)
                except Exception as exc:  # the load error is the one to report
                    logger.warning("model '%s' version %d: unload failed: %s", self.model.name, version, exc)
                raise
            runtime.ready = True
            self.versions[version] = runtime
            logger.info("model '%s' version %d ready", self.model.name, version)

    def version(self, version: str | int | None) -> VersionRuntime:
        """The runtime of ``version`` ("" or None = the latest loaded)."""
        if version in (None, "", -1, "-1"):
            if not self.versions:
                # a replica or model host that has not loaded the model yet (starting, or a pooled
                # model loading on another host after its own was lost): the model is not gone, so the
                # client is told to try again; Triton's "has no available versions" (404) is the
                # server application's answer for a model it knows with no version ready
                raise Unavailable(f"model '{self.model.name}' has no version loaded here yet; try again")
            return self.versions[max(self.versions)]
        try:
            number = int(version)
        except (TypeError, ValueError):
            raise InvalidArgument(f"model '{self.model.name}': version '{version}' is not a number") from None
        runtime = self.versions.get(number)
        if runtime is None and number in self.model.retired_versions:
            raise Unavailable(
                f"Request for unknown model: '{self.model.name}' version {number} is not at ready state"
            )
        if runtime is None:
            raise NotFound(f"Request for unknown model: '{self.model.name}' version {number} is not found")
        return runtime

    def _ready_version(self, request: InferRequest) -> VersionRuntime | InferResponse:
        """The ready version ``request`` names, or the failed response that says why there is none."""
        try:
            runtime = self.version(request.model_version)
            if not runtime.ready:
                raise Unavailable(
                    f"Request for unknown model: '{self.model.name}' version {runtime.version} is not at ready state"
                )
        except ServerError as error:
            failed = InferResponse.failed(request, error)
            failed.model_name = self.model.name
            return failed
        return runtime

    def holds_sequence(self, correlation_id: int | str) -> bool:
        """Whether a version's sequence batcher holds sequence ``correlation_id`` (docs/sequence.md)."""
        for runtime in self.versions.values():
            holds = getattr(runtime.scheduler, "holds", None)
            if holds is not None and holds(correlation_id):
                return True
        return False

    def can_start_sequence(self, version: str) -> bool:
        """Whether a new sequence for ``version`` ("" = the latest) would take a slot here now, not wait
        in the backlog (docs/sequence.md, "A full owner lends"); True where nothing would wait."""
        try:
            scheduler = self.version(version).scheduler
        except ServerError:
            return True  # the request fails here as it would anywhere
        free = getattr(scheduler, "has_free_slot", None)
        return True if free is None else bool(free())

    def reserve_sequence(self, version: str, correlation_id: int | str) -> bool:
        """Keep a free slot of ``version`` for a new sequence whose START follows (its owner lends it,
        docs/sequence.md, "A full owner lends"): True where one was free and is now kept."""
        try:
            scheduler = self.version(version).scheduler
        except ServerError:
            return False  # the START fails at its owner, as it would anywhere
        reserve = getattr(scheduler, "reserve", None)
        return False if reserve is None else bool(reserve(correlation_id))

    def sequence_idle_ns(self) -> int:
        """The longest idle time a sequence of this model keeps its slot (0: none or no limit)."""
        return max((getattr(r.scheduler, "idle_ns", 0) for r in self.versions.values()), default=0)

    async def infer(self, request: InferRequest) -> InferResponse:
        """Run ``request`` on the version it names; every failure comes back in ``response.error``."""
        runtime = self._ready_version(request)
        if isinstance(runtime, InferResponse):
            return runtime
        self.ongoing += 1
        try:
            response = await runtime.infer(request)
        finally:
            self.ongoing -= 1
        response.model_name = self.model.name
        response.model_version = str(runtime.version)
        response.id = request.id
        return response

    async def infer_stream(self, request: InferRequest) -> AsyncGenerator[InferResponse, None]:
        """Every response of ``request`` (0..N from a decoupled model, the last ``final``); failures
        come back in ``response.error``, as from :meth:`infer`."""
        runtime = self._ready_version(request)
        if isinstance(runtime, InferResponse):
            yield runtime
            return
        stream = runtime.infer_stream(request)
        self.ongoing += 1
        try:
            async for response in stream:
                response.model_name = self.model.name
                response.model_version = str(runtime.version)
                response.id = request.id
                yield response
        finally:
            self.ongoing -= 1
            await stream.aclose()

    def hung(self) -> str | None:
        """Why a version stopped serving (its execution ran past ``execution_timeout_ms``), if one did."""
        return next((v.hung for v in self.versions.values() if v.hung is not None), None)

    def is_ready(self, version: str | int | None = None) -> bool:
        try:
            return self.version(version).ready
        except ServerError:
            return False

    def config(self, version: str | int | None = None) -> dict[str, Any]:
        if version not in (None, ""):
            self.version(version)
        return dict(self.model.config_json)

    def statistics(self, version: str | int | None = None) -> list[dict[str, Any]]:
        if version in (None, ""):
            return [self.versions[v].stats.to_json() for v in sorted(self.versions)]
        return [self.version(version).stats.to_json()]

    def metrics_snapshot(self) -> dict[str, Any]:
        """What Triton's metrics endpoint prints of this replica, as plain data (see
        :func:`deployments.runtime.metrics.render_triton`): statistics, pending requests and failures
        by reason per version, this process's custom metric families, and where the latency summaries
        are on, each version's recent durations (``samples``)."""
        return {"stats": self.statistics(), **self.request_metrics(), "custom": custom_metrics.snapshot()}

    def request_metrics(self) -> dict[str, Any]:
        """The part of :meth:`metrics_snapshot` that is this model's own beside its statistics: pending
        requests and failures by reason per version, whether it caches, and the recent durations."""
        snapshot: dict[str, Any] = {
            "pending": {str(v): r.pending for v, r in self.versions.items()},
            "failures": {str(v): r.failure_counts() for v, r in self.versions.items()},
            "response_cache": any(r.cache is not None for r in self.versions.values()),
        }
        windows = {str(v): r.stats.window for v, r in self.versions.items() if r.stats.window is not None}
        if windows:
            snapshot["samples"] = {version: window.samples() for version, window in windows.items()}
        return snapshot

    def hosted_statistics(self) -> dict[str, list[dict[str, Any]]]:
        """Statistics of the models an ensemble hosts in this replica, by model name (empty otherwise)."""
        out: dict[str, list[dict[str, Any]]] = {}
        for runtime in self.versions.values():
            hosted = getattr(runtime.backend, "hosted_statistics", None)
            for entry in hosted() if hosted is not None else ():
                out.setdefault(entry["name"], []).append(entry)
        return out

    def reusable(self, model: ModelDescription, signatures: Mapping[int, str]) -> dict[int, VersionRuntime]:
        """The versions loaded here that a reload to ``model`` keeps as they are, without loading them
        again: ``model`` describes the model alike but for the versions it selects, and a version's
        files (``signatures``: :func:`~repository_loader.revision.version_signatures` of ``model``) did
        not change. Triton reloads only the versions whose files changed, likewise."""
        if not same_but_versions(self.model, model):
            return {}
        return {
            version: runtime
            for version, runtime in self.versions.items()
            if version in signatures
            and self.signatures.get(version) == signatures[version]
            and runtime.ready
            and runtime.hung is None
        }

    def take_over(self, previous: ModelRuntime) -> None:
        """This runtime now serves in place of ``previous``: the versions it kept of ``previous`` are
        its own from now on (``previous`` no longer closes them) and count into its metrics."""
        for version, runtime in self._kept.items():
            if previous.versions.get(version) is runtime:
                del previous.versions[version]
            runtime.adopt(self.model, self.metrics)
        self._kept.clear()

    async def close(self) -> None:
        for version, runtime in list(self.versions.items()):
            if self._kept.get(version) is runtime:  # still the replaced runtime's (a reload not committed)
                continue
            try:
                await runtime.close()
            except Exception as exc:  # finalize errors must not stop the others
                logger.warning("model '%s': unload failed: %s", self.model.name, exc)
        self.versions.clear()
        self.metrics.flush()
