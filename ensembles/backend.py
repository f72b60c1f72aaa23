"""An ensemble served like any model, with the co-located placement.

On ``load`` the ensemble's replica chooses its placement
(:func:`ensembles.placement.choose_placement`; a GPU group only when the
replica itself is ``KIND_GPU``); on ``start`` it loads every model of the
hosted group in process, each as a :class:`deployments.runtime.model.ModelRuntime`
of its own (its scheduler, dynamic batcher and statistics, on the device of its
group). A :class:`~deployments.runtime.router.Router` over those runtimes then
sends a step to that runtime when its model is hosted, and to the serving
layer's executor (the replica's router, which reaches the model's own
replicas) otherwise.

Tensors between hosted steps are handed on as the producer's objects, never
copied: a step whose backend works in another framework (PyTorch, TensorRT:
torch; ONNX Runtime on the host: numpy) gets a DLPack view of the same memory
(:func:`deployments.tensors.as_framework`); Python models get the objects as they
are. With ``placement: separate`` (and no group named by a ``placement.<model>``
parameter) nothing is hosted and every step goes to the serving layer's
executor. :meth:`EnsembleBackend.hosted_statistics` reports the hosted models'
own statistics. On a model host (``BackendContext.steps_in_process`` false) the ensemble
places nothing and hosts nothing: the host's router runs its pooled steps in the same process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import numpy as np

from deployments.backends.base import Backend, BackendContext
from deployments.inference import InferRequest, InferResponse
from deployments.runtime.model import ModelRuntime
from deployments.runtime.router import Router
from deployments.tensors import Tensor, as_framework, is_host
from ensembles.graph import StepNode, build_graph
from ensembles.placement import EnsemblePlacement, choose_placement
from ensembles.scheduler import EnsembleScheduler, StepTiming
from repository_loader.errors import Unavailable
from repository_loader.model import InstanceKind, ModelDescription

logger = logging.getLogger(__name__)

# The array type a backend works with; Python models take what they are given.
_FRAMEWORKS = {"pytorch": "torch", "tensorrt": "torch", "onnxruntime": "numpy"}


def consumer_framework(model: ModelDescription, tensor: Tensor) -> str | None:
    """The framework ``model`` wants ``tensor`` in, where a zero-copy view can give it (None: as it is)."""
    framework = _FRAMEWORKS.get(model.kind)
    if isinstance(tensor, np.ndarray) and tensor.dtype == np.object_:
        return None  # BYTES exist only as numpy arrays
    if framework == "numpy" and not is_host(tensor):
        return None  # ONNX Runtime binds device tensors itself
    return framework


def hand_on(model: ModelDescription, tensor: Tensor) -> Tensor:
    """``tensor`` for an in-process step of ``model``: the same memory, in the framework it wants.

    Arrays DLPack cannot describe (read-only numpy views on old numpy, exotic
    dtypes) are passed as they are; every backend converts its inputs itself.
    """
    try:
        return as_framework(tensor, consumer_framework(model, tensor))
    except (BufferError, TypeError, RuntimeError, ValueError):
        return tensor


def _instance_kind(device: str) -> InstanceKind:
    return InstanceKind.GPU if device.startswith("gpu") else InstanceKind.CPU


class EnsembleBackend(Backend):
    """Runs ensemble requests with an :class:`EnsembleScheduler`; hosts one placement group in process.

    The step models come from ``context.composing`` (or ``composing``, where given).
    """

    # Ensembles queue nothing themselves: every request runs its steps at once.
    max_concurrency = 4096

    def __init__(
        self, context: BackendContext, composing: Mapping[str, ModelDescription] | None = None
    ) -> None:
        super().__init__(context)
        self._composing = dict(context.composing if composing is None else composing)
        self._scheduler: EnsembleScheduler | None = None
        self._hosted: dict[str, ModelRuntime] = {}
        self.placement: EnsemblePlacement | None = None
        self.failed_steps = 0  # step requests that failed: Triton counts them as the ensemble's failures too

    def load(self) -> None:
        if self.context.executor is None:
            raise Unavailable(f"ensemble '{self.model.name}' has no executor for its steps")
        graph = build_graph(self.model, self._composing)
        gpu = self.context.instance_kind == InstanceKind.GPU
        if self.context.steps_in_process:
            self.placement = choose_placement(graph, gpu_available=gpu)
        self._scheduler = EnsembleScheduler(
            graph,
            Router(self._hosted, remote=self.context.executor),
            handoff=self._hand_on,
            inline_nested=self.placement is not None and self.placement.hosted is not None,
            on_step=self._on_step,
        )

    def _on_step(self, timing: StepTiming) -> None:
        if not timing.success:
            self.failed_steps += 1

    async def start(self) -> None:
        """Load the hosted group's models in this process; on failure, close those already loaded."""
        if self.placement is None:  # the executor runs the steps in this process (a model host)
            return
        try:
            for name, device in self.placement.hosted_models().items():
                runtime = ModelRuntime(
                    self._composing[name],
                    instance_kind=_instance_kind(device),
                    device_id=self.context.device_id,
                    executor=self.context.executor,
                    composing=self._composing,
                )
                self._hosted[name] = runtime
                await runtime.load()
        except BaseException:
            await self.stop()
            raise
        if self._hosted:
            logger.info("ensemble '%s' hosts %s in process", self.model.name, ", ".join(self._hosted))

    async def stop(self) -> None:
        """Close the hosted models (their queues drain first)."""
        hosted = list(self._hosted.values())
        self._hosted.clear()
        for runtime in hosted:
            await runtime.close()

    def unload(self) -> None:
        """Release hosted models that ``stop`` did not close: their backends only, as no loop is at hand."""
        for runtime in self._hosted.values():
            for version in runtime.versions.values():
                version.ready = False
                try:
                    version.backend.unload()
                except Exception as exc:  # one failing unload must not keep the others loaded
                    logger.warning("model '%s': unload failed: %s", runtime.model.name, exc)
            runtime.versions.clear()
        self._hosted.clear()

    @property
    def hosted(self) -> Mapping[str, ModelRuntime]:
        """The composing models loaded in this replica, by name."""
        return self._hosted

    def hosted_statistics(self) -> list[dict[str, Any]]:
        """Statistics of the hosted models, as :meth:`ModelRuntime.statistics` gives them (by model name)."""
        return [entry for name in sorted(self._hosted) for entry in self._hosted[name].statistics()]

    def _hand_on(self, step: StepNode, name: str, tensor: Tensor) -> Tensor:
        if step.model_name not in self._hosted:
            return tensor
        return hand_on(step.model, tensor)

    async def execute(self, requests: Sequence[InferRequest]) -> list[InferResponse]:
        assert self._scheduler is not None, "load() first"
        return list(await asyncio.gather(*(self._scheduler.infer(r) for r in requests)))

    async def stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """An ensemble with a decoupled step streams each response as it is made; others answer once."""
        assert self._scheduler is not None, "load() first"
        if not self.model.decoupled:
            yield await self._scheduler.infer(request)
            return
        async with contextlib.aclosing(self._scheduler.stream(request)) as responses:
            async for response in responses:
                yield response
