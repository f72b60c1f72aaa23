"""Runs one ensemble request: each step as soon as its inputs exist.

The scheduler is plain asyncio over a :class:`ModelExecutor`: every step is a
task started the moment all the tensors it reads are there, so independent
branches run together; only the steps the requested outputs need run. A step
that fails fails its request alone: the error names the step's model and keeps
the step's error code, and the request's other steps are cancelled.

An ensemble with a decoupled step (itself decoupled, as Triton makes it) streams
(:meth:`EnsembleScheduler.stream`): the steps after a decoupled step run once for each
of its responses, and the ensemble answers each time the requested outputs of one such
response are all made, then sends the final flag alone. Each tensor then carries its
*path*, the response number of every decoupled step it came through (the ensemble's
inputs have the empty path); a step runs for each set of its inputs whose paths lie on
one line (each a prefix of the longest) and its outputs take the longest, extended by
the response number where the step is itself decoupled.

A tensor may pass between a model that batches and one that does not (the
validator accepts it where the shapes agree with or without the batch
dimension). Each tensor keeps the batch size of the request that made it
(0: made without batching) and :func:`fit_batching` adds or strips a batch of
one where the receiving model's configuration asks for it, as Triton does.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from deployments.inference import InferRequest, InferResponse, ModelExecutor, RequestedOutput
from ensembles.graph import EnsembleGraph, StepNode
from repository_loader.ensemble_rules import shapes_agree
from repository_loader.errors import InternalError, ServerError, error_for_code
from repository_loader.model import ModelDescription

Tensor = Any
ABSENT: Any = object()  # an ensemble tensor its step did not send (an optional output left out)


@dataclass(frozen=True)
class StepTiming:
    """One step of one ensemble request, for the composing model's statistics."""

    ensemble: str
    model_name: str
    model_version: int
    start_ns: int
    end_ns: int
    success: bool

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class PathValue:
    """A tensor of a streaming ensemble request, the path it was made on, and its batch size."""

    tensor: Tensor
    path: tuple[int, ...]
    batch: int


def common_path(paths: Sequence[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The longest of ``paths`` where every other one is a prefix of it (they lie on one line), else None."""
    longest = max(paths, key=len, default=())
    return longest if all(longest[: len(p)] == p for p in paths) else None


StepCallback = Callable[[StepTiming], None]
# Turns a tensor into what a step receives (the hand-off across processes); identity by default.
InputHandoff = Callable[[StepNode, str, Tensor], Tensor]


def fit_batching(tensor: Tensor, dims: Sequence[int], batching: bool, batch_size: int) -> Tensor:
    """``tensor`` (made with ``batch_size``, 0 where made without batching) shaped for a receiver whose
    configuration has ``dims`` and batches or not.

    A receiver that batches, given a tensor made without batching that matches its ``dims``, gets it as a
    batch of one; a receiver that does not batch, given a batch of one that does not match its ``dims``,
    gets it without the batch dimension. Anything else passes as it is (the receiver checks it).
    """
    if batching == (batch_size != 0):
        return tensor
    shape = tuple(int(d) for d in tensor.shape)
    if batching and shapes_agree(dims, shape):
        return tensor.reshape((1, *shape))
    if not batching and batch_size == 1 and not shapes_agree(dims, shape):
        return tensor.reshape(shape[1:])
    return tensor


def request_batch_size(model: ModelDescription, inputs: Mapping[str, Tensor]) -> int:
    """The batch size of a request to ``model`` with ``inputs`` (0 where ``model`` does not batch)."""
    if model.max_batch_size <= 0:
        return 0
    for tensor in inputs.values():
        shape = tensor.shape
        if len(shape):
            return int(shape[0])
    return 0


def sequence_flags(request: InferRequest) -> dict[str, Any]:
    """The response parameters an ensemble answers a sequence request with: its start and end flags,
    as Triton echoes them; none for a request outside a sequence."""
    if not request.correlation_id:
        return {}
    return {"sequence_start": request.sequence_start, "sequence_end": request.sequence_end}


def step_error(ensemble: str, step: StepNode, error: BaseException) -> ServerError:
    """The request's error for a failing step: the step named, its error code kept."""
    if isinstance(error, ServerError):
        return error_for_code(
            error.code, f"in ensemble '{ensemble}', step '{step.model_name}': {error.message}"
        )
    return InternalError(
        f"in ensemble '{ensemble}', step '{step.model_name}': {type(error).__name__}: {error}"
    )


class EnsembleScheduler:
    """Executes requests of one validated ensemble through ``executor``.

    ``inline_nested``: run steps that are themselves ensembles with a scheduler
    in this process (their tensors then stay in process too) instead of
    sending them to ``executor``.
    """

    def __init__(
        self,
        graph: EnsembleGraph,
        executor: ModelExecutor,
        *,
        on_step: StepCallback | None = None,
        handoff: InputHandoff | None = None,
        inline_nested: bool = False,
    ) -> None:
        self.graph = graph
        self.executor = executor
        self.on_step = on_step
        self.handoff = handoff
        self.inline_nested = inline_nested
        self._pruned: dict[tuple[str, ...], EnsembleGraph] = {}
        self._nested: dict[str, EnsembleScheduler] = {}

    async def infer(self, request: InferRequest) -> InferResponse:
        """Run ``request``; errors come back in the response, as from any executor.

        ``request`` was checked against the ensemble's inputs and outputs at the runtime's boundary
        (``deployments.runtime.checks``), like a request to any model.
        """
        response = InferResponse(
            model_name=self.graph.name,
            model_version=str(self.graph.ensemble.latest_version),
            id=request.id,
            parameters=sequence_flags(request),
        )
        try:
            outputs = request.output_names(self.graph.output_names)
            batch_size = request_batch_size(self.graph.ensemble, request.inputs)
            batches: dict[str, int] = dict.fromkeys(request.inputs, batch_size)
            tensors = await self._run(self._plan(outputs), request, outputs, batches)
        except ServerError as error:
            response.error = error
            return response
        ensemble = self.graph.ensemble
        batching = batch_size != 0
        response.outputs = {  # an output no step sent is left out, as Triton leaves it out
            name: fit_batching(
                tensors[name], _dims(ensemble, name, output=True), batching, batches.get(name, 0)
            )
            for name in outputs
            if tensors.get(name, ABSENT) is not ABSENT
        }
        return response

    async def stream(self, request: InferRequest) -> AsyncGenerator[InferResponse, None]:
        """Every response of ``request`` to an ensemble with a decoupled step (see the module's text): one
        for each path on which the requested outputs are all made, then the final flag alone; a failing
        step ends the stream with its error."""
        outputs = request.output_names(self.graph.output_names)
        batch_size = request_batch_size(self.graph.ensemble, request.inputs)
        graph = self._plan(outputs)
        needed = set(outputs).union(*(s.consumes for s in graph.steps))
        values: dict[str, list[PathValue]] = {
            name: [PathValue(tensor, (), batch_size)] for name, tensor in request.inputs.items()
        }
        made: asyncio.Queue[tuple[StepNode, dict[str, PathValue] | BaseException | None]] = asyncio.Queue()
        running: dict[asyncio.Task[None], StepNode] = {}
        started: set[tuple[int, tuple[tuple[int, ...], ...]]] = set()
        answered: set[tuple[int, ...]] = set()
        outstanding = 0  # steps started that have not sent their last response
        try:
            while True:
                for step, inputs, path in self._runnable(graph, values, started):
                    task = asyncio.create_task(self._stream_step(step, request, inputs, path, needed, made))
                    running[task] = step
                    outstanding += 1
                if not outstanding:
                    break
                step, result = await made.get()
                running = {t: s for t, s in running.items() if not t.done()}
                if isinstance(result, BaseException):
                    yield self._answer(request, error=step_error(self.graph.name, step, result))
                    return
                if result is None:
                    outstanding -= 1
                    continue
                for name, value in result.items():
                    values.setdefault(name, []).append(value)
                for path in sorted({v.path for n, v in result.items() if n in outputs}):
                    answer = self._answer_on(path, outputs, values, answered)
                    if answer is not None:
                        yield self._answer(request, outputs=answer)
        finally:
            await _cancel(running)
        yield self._answer(request, final=True)

    def _answer(
        self,
        request: InferRequest,
        outputs: dict[str, Tensor] | None = None,
        error: ServerError | None = None,
        final: bool = False,
    ) -> InferResponse:
        return InferResponse(
            outputs=outputs or {},
            model_name=self.graph.name,
            model_version=str(self.graph.ensemble.latest_version),
            id=request.id,
            error=error,
            final=final or error is not None,
            parameters=sequence_flags(request),
        )

    def _answer_on(
        self,
        path: tuple[int, ...],
        outputs: list[str],
        values: Mapping[str, list[PathValue]],
        answered: set[tuple[int, ...]],
    ) -> dict[str, Tensor] | None:
        """The requested ``outputs`` made on ``path`` (or a prefix of it), once all are there."""
        if path in answered:
            return None
        found: dict[str, PathValue] = {}
        for name in outputs:
            on_line = [v for v in values.get(name, []) if path[: len(v.path)] == v.path]
            if not on_line:
                return None
            found[name] = max(on_line, key=lambda v: len(v.path))
        answered.add(path)
        ensemble = self.graph.ensemble
        batching = ensemble.max_batch_size > 0
        return {
            name: fit_batching(v.tensor, _dims(ensemble, name, output=True), batching, v.batch)
            for name, v in found.items()
            if v.tensor is not ABSENT
        }

    @staticmethod
    def _runnable(
        graph: EnsembleGraph,
        values: Mapping[str, list[PathValue]],
        started: set[tuple[int, tuple[tuple[int, ...], ...]]],
    ) -> list[tuple[StepNode, dict[str, PathValue], tuple[int, ...]]]:
        """Each step with a set of made inputs on one line it has not run with yet (marked started)."""
        runnable = []
        for step in graph.steps:
            produced = [t for t in step.consumes if t in graph.producer]
            for chosen in itertools.product(*(values.get(t, []) for t in produced)):
                paths = tuple(v.path for v in chosen)
                path = common_path(paths)
                if path is None or (step.index, paths) in started:
                    continue
                started.add((step.index, paths))
                inputs = {t: values[t][0] for t in step.consumes if t in values and t not in produced}
                inputs.update(zip(produced, chosen, strict=True))
                runnable.append((step, inputs, path))
        return runnable

    async def _stream_step(
        self,
        step: StepNode,
        request: InferRequest,
        inputs: Mapping[str, PathValue],
        path: tuple[int, ...],
        needed: set[str],
        made: asyncio.Queue[tuple[StepNode, dict[str, PathValue] | BaseException | None]],
    ) -> None:
        """Run ``step`` on ``inputs``; put each response's outputs (with their path) on ``made``, then
        None, or the exception that ended it."""
        wanted = [name for name, tensor in step.output_map.items() if tensor in needed]
        tensors = {name: v.tensor for name, v in inputs.items()}
        batches = {name: v.batch for name, v in inputs.items()}
        sub = self._step_request(step, request, tensors, batches, wanted)
        made_with = request_batch_size(step.model, sub.inputs)
        start = time.perf_counter_ns()
        success = False
        count = 0
        try:
            async with contextlib.aclosing(self._stream_call(step, sub)) as responses:
                async for response in responses:
                    if response.error is not None:
                        raise response.error
                    if step.model.decoupled and not response.outputs:
                        continue  # the final flag alone
                    here = (*path, count) if step.model.decoupled else path
                    count += 1
                    made.put_nowait(
                        (
                            step,
                            {
                                step.output_map[name]: PathValue(
                                    response.outputs.get(name, ABSENT), here, made_with
                                )
                                for name in wanted
                            },
                        )
                    )
            success = True
            made.put_nowait((step, None))
        except asyncio.CancelledError:
            raise
        except Exception as error:
            made.put_nowait((step, error))
        finally:
            self._record(step, start, success)

    def _stream_call(self, step: StepNode, request: InferRequest) -> AsyncGenerator[InferResponse, None]:
        if self.inline_nested and step.model_name in self.graph.nested:
            nested = self._nested_scheduler(step.model_name)
            return nested.stream(request) if step.model.decoupled else _one(nested.infer(request))
        streaming = getattr(self.executor, "stream", None)
        if step.model.decoupled and streaming is not None:
            stream: AsyncGenerator[InferResponse, None] = streaming(request)
            return stream
        return _one(self.executor.infer(request))

    def _plan(self, outputs: list[str]) -> EnsembleGraph:
        key = tuple(sorted(outputs))
        if key not in self._pruned:
            self._pruned[key] = self.graph.pruned(key)
        return self._pruned[key]

    async def _run(
        self, graph: EnsembleGraph, request: InferRequest, outputs: list[str], batches: dict[str, int]
    ) -> dict[str, Tensor]:
        """Every tensor the requested ``outputs`` need; ``batches`` (the inputs' batch size given) gets each
        produced one's."""
        tensors: dict[str, Tensor] = dict(request.inputs)
        needed = set(outputs).union(*(s.consumes for s in graph.steps))
        pending = {s.index: s for s in graph.steps}
        running: dict[asyncio.Task[dict[str, Tensor]], StepNode] = {}
        try:
            while pending or running:
                for step in self._ready(graph, pending, tensors):
                    del pending[step.index]
                    task = asyncio.create_task(self._run_step(step, request, tensors, batches, needed))
                    running[task] = step
                if not running:
                    raise InternalError(f"in ensemble '{graph.name}', no step can run (inputs missing)")
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    del running[task]
                    tensors.update(task.result())
        finally:
            await _cancel(running)
        return tensors

    @staticmethod
    def _ready(
        graph: EnsembleGraph, pending: Mapping[int, StepNode], tensors: Mapping[str, Tensor]
    ) -> list[StepNode]:
        """Pending steps whose every produced input exists (absent optional ensemble inputs are skipped)."""
        return [
            step
            for step in pending.values()
            if all(t in tensors for t in step.consumes if t in graph.producer)
        ]

    async def _run_step(
        self,
        step: StepNode,
        request: InferRequest,
        tensors: Mapping[str, Tensor],
        batches: dict[str, int],
        needed: set[str],
    ) -> dict[str, Tensor]:
        wanted = [name for name, tensor in step.output_map.items() if tensor in needed]
        sub = self._step_request(step, request, tensors, batches, wanted)
        made_with = request_batch_size(step.model, sub.inputs)
        start = time.perf_counter_ns()
        success = False
        try:
            response = await self._call(step, sub)
            if response.error is not None:
                raise response.error
            # an output the step did not send stays absent (Triton's placeholder): a later step may take
            # it as an optional input; one that requires it fails on its own input check
            produced = {step.output_map[name]: response.outputs.get(name, ABSENT) for name in wanted}
            batches.update((tensor, made_with) for tensor in produced)
            success = True
            return produced
        except asyncio.CancelledError:
            raise
        except Exception as error:
            raise step_error(self.graph.name, step, error) from error
        finally:
            self._record(step, start, success)

    def _step_request(
        self,
        step: StepNode,
        request: InferRequest,
        tensors: Mapping[str, Tensor],
        batches: Mapping[str, int],
        wanted: list[str],
    ) -> InferRequest:
        inputs = {}
        batching = step.model.max_batch_size > 0
        for step_input, tensor in step.input_map.items():
            if tensors.get(tensor, ABSENT) is not ABSENT:
                value = fit_batching(
                    tensors[tensor], _dims(step.model, step_input), batching, batches.get(tensor, 0)
                )
                inputs[step_input] = self.handoff(step, step_input, value) if self.handoff else value
        return InferRequest(
            model_name=step.model_name,
            inputs=inputs,
            model_version=str(step.version) if step.pinned else "",
            id=request.id,
            requested_outputs=[RequestedOutput(name) for name in wanted],
            parameters=dict(request.parameters),
            correlation_id=request.correlation_id,
            sequence_start=request.sequence_start,
            sequence_end=request.sequence_end,
            priority=request.priority,
            timeout_us=request.timeout_us,
            arrival_ns=request.arrival_ns,
            trace=request.trace,  # a traced ensemble: the step's span hangs under the ensemble's
        )

    async def _call(self, step: StepNode, request: InferRequest) -> InferResponse:
        if self.inline_nested and step.model_name in self.graph.nested:
            return await self._nested_scheduler(step.model_name).infer(request)
        return await self.executor.infer(request)

    def _nested_scheduler(self, name: str) -> EnsembleScheduler:
        if name not in self._nested:
            self._nested[name] = EnsembleScheduler(
                self.graph.nested[name],
                self.executor,
                on_step=self.on_step,
                handoff=self.handoff,
                inline_nested=True,
            )
        return self._nested[name]

    def _record(self, step: StepNode, start_ns: int, success: bool) -> None:
        if self.on_step is not None:
            timing = StepTiming(
                self.graph.name, step.model_name, step.version, start_ns, time.perf_counter_ns(), success
            )
            self.on_step(timing)


def _dims(model: ModelDescription, name: str, output: bool = False) -> Sequence[int]:
    spec = model.output(name) if output else model.input(name)
    return spec.dims if spec is not None else ()


async def _one(response: Any) -> AsyncGenerator[InferResponse, None]:
    """The one response of an awaitable, as a stream."""
    yield await response


async def _cancel(running: Mapping[asyncio.Task[Any], StepNode]) -> None:
    """Cancel the steps still running and wait for them to end."""
    for task in running:
        task.cancel()
    if running:
        await asyncio.gather(*running, return_exceptions=True)
