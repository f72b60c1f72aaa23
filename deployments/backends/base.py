"""The one interface every backend implements: load, execute a batch, unload, describe.

The serving layer calls ``load`` then ``await start()``, and ``await stop()`` then
``unload``; the two async hooks are optional.
"""

from __future__ import annotations

import abc
import asyncio
import contextvars
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, TypeVar

from deployments.inference import InferRequest, InferResponse, ModelExecutor
from repository_loader.errors import InvalidArgument
from repository_loader.model import InstanceKind, ModelDescription, TensorSpec

EXECUTION_TIMEOUT_PARAMETER = "execution_timeout_ms"
T = TypeVar("T")


async def in_thread(
    executor: Executor | None,
    fn: Callable[..., T],
    *args: object,
    on_cancel: Callable[[], None] | None = None,
) -> T:
    """``fn(*args)`` in a worker thread of ``executor`` (None: the loop's default), in the caller's context.

    A thread cannot be stopped: when the caller is cancelled (its client went away), ``on_cancel``
    tells the running code (a Python model sees its requests cancelled), and this still waits for
    ``fn`` to return before the cancellation goes on, so the instance stays busy until it is really
    free and no second ``execute`` overlaps the first.
    """
    context = contextvars.copy_context()
    future = asyncio.get_running_loop().run_in_executor(executor, context.run, fn, *args)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        if on_cancel is not None:
            on_cancel()
        await asyncio.wait((future,))
        raise


def execution_timeout_s(model: ModelDescription) -> float | None:
    """The model's execution time limit (its config ``parameters`` key ``execution_timeout_ms``), if any."""
    raw = (model.parameters or {}).get(EXECUTION_TIMEOUT_PARAMETER)
    if raw is None or str(raw).strip() in ("", "0"):
        return None
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise InvalidArgument(
            f"model '{model.name}': parameter {EXECUTION_TIMEOUT_PARAMETER} must be a number of "
            f"milliseconds, got '{raw}'"
        ) from None
    if value < 0:
        raise InvalidArgument(f"model '{model.name}': parameter {EXECUTION_TIMEOUT_PARAMETER} must be >= 0")
    return value / 1000.0


@dataclass(frozen=True)
class BackendContext:
    """Where and what a backend instance loads."""

    model: ModelDescription
    version: int
    instance_kind: InstanceKind = InstanceKind.CPU  # resolved: CPU, GPU or MODEL
    device_id: int = 0
    instance_name: str = ""
    executor: ModelExecutor | None = None  # BLS / nested inference, from the serving layer
    composing: Mapping[str, ModelDescription] = field(default_factory=dict, compare=False)  # ensemble steps
    # an ensemble hosts copies of its steps in its process as it places them; False where the executor
    # already runs them in this process (a model host's pooled models)
    steps_in_process: bool = True


@dataclass
class ComputeTimes:
    """How long one batch spent preparing inputs and producing outputs, in nanoseconds (Triton's
    ``compute_input`` and ``compute_output``); the rest of the backend's time is ``compute_infer``."""

    input_ns: int = 0
    output_ns: int = 0


_TIMES: contextvars.ContextVar[ComputeTimes | None] = contextvars.ContextVar("compute_times", default=None)


def begin_compute_times() -> tuple[ComputeTimes, contextvars.Token[ComputeTimes | None]]:
    """The runtime, before ``execute``: a fresh record the backend's :func:`timed` phases add to."""
    times = ComputeTimes()
    return times, _TIMES.set(times)


def end_compute_times(token: contextvars.Token[ComputeTimes | None]) -> None:
    _TIMES.reset(token)


@contextmanager
def timed(phase: str) -> Iterator[None]:
    """Book the time of the block as ``"input"`` or ``"output"`` of the batch being executed
    (nothing outside a runtime's execution, e.g. warmup or a unit test calling a backend directly)."""
    times = _TIMES.get()
    if times is None:
        yield
        return
    start = time.perf_counter_ns()
    try:
        yield
    finally:
        elapsed = time.perf_counter_ns() - start
        if phase == "input":
            times.input_ns += elapsed
        else:
            times.output_ns += elapsed


def compute_capability(ordinal: int) -> tuple[int, int] | None:
    """The compute capability ``(major, minor)`` of CUDA device ``ordinal``, from the driver
    (``libcuda``, through ctypes: no framework needed); None where there is no driver or device."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    device, major, minor = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
        return None
    # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR (75) and _MINOR (76)
    if cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, device) != 0:
        return None
    if cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, device) != 0:
        return None
    return major.value, minor.value


class Backend(abc.ABC):
    """A loaded model version on one device.

    ``execute`` receives the requests of one batch (as Triton hands them to a
    backend) and returns exactly one response per request, in order. An error
    in one request is reported in that request's response; an exception
    escaping ``execute`` fails the whole batch.

    ``max_concurrency`` is how many batches the runtime hands the backend at once.
    """

    max_concurrency: ClassVar[int] = 1

    def __init__(self, context: BackendContext) -> None:
        self.context = context
        self.model = context.model

    def model_path(self) -> Path:
        """The model file (or folder) to load: on a GPU instance, the one the model's
        ``cc_model_filenames`` names for its GPU's compute capability, if any; else the default."""
        capability = None
        if self.context.instance_kind == InstanceKind.GPU and self.model.cc_model_filenames:
            capability = compute_capability(self.context.device_id)
        return self.model.model_file(self.context.version, capability)

    @abc.abstractmethod
    def load(self) -> None:
        """Load the model version; raise a ``ServerError`` naming what is wrong."""

    @abc.abstractmethod
    async def execute(self, requests: Sequence[InferRequest]) -> list[InferResponse]:
        """Run one batch."""

    async def stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """Decoupled models: every response of one request, the last with ``final``."""
        for response in await self.execute([request]):
            yield response

    def stream_batch(
        self, requests: Sequence[InferRequest]
    ) -> tuple[list[AsyncIterator[InferResponse]], Awaitable[None]]:
        """Decoupled models under the dynamic batcher: one execution for the batch. Returns each
        request's responses (as :meth:`stream`) and the execution to await, which ends when the
        model's ``execute`` returns (responses may go on after it). By default each request streams
        on its own when read."""
        return [self.stream(r) for r in requests], asyncio.sleep(0)

    async def start(self) -> None:  # noqa: B027 - optional hook
        """After ``load``, on the serving event loop: load what needs the loop (an ensemble's hosted models)."""

    async def stop(self) -> None:  # noqa: B027 - optional hook
        """Before ``unload``, on the serving event loop: close what ``start`` opened."""

    def unload(self) -> None:  # noqa: B027 - optional hook
        """Release the model (``finalize`` for Python models)."""

    def metadata(self) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
        """Inputs and outputs as the backend serves them."""
        return self.model.inputs, self.model.outputs
