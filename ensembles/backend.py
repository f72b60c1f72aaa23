"""An ensemble served like any model: its steps run on the composing models' deployments."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from deployments.backends.base import Backend, BackendContext
from deployments.inference import InferRequest, InferResponse
from ensembles.graph import build_graph
from ensembles.scheduler import EnsembleScheduler
from repository_loader.errors import Unavailable
from repository_loader.model import ModelDescription

# Ensembles queue nothing themselves: every request runs its steps at once.
ENSEMBLE_CONCURRENCY = 4096


class EnsembleBackend(Backend):
    def __init__(self, context: BackendContext, composing: Mapping[str, ModelDescription]) -> None:
        super().__init__(context)
        self._composing = dict(composing)
        self._scheduler: EnsembleScheduler | None = None

    def load(self) -> None:
        if self.context.executor is None:
            raise Unavailable(f"ensemble '{self.model.name}' has no executor for its steps")
        graph = build_graph(self.model, self._composing)
        self._scheduler = EnsembleScheduler(graph, self.context.executor)

    async def execute(self, requests: Sequence[InferRequest]) -> list[InferResponse]:
        assert self._scheduler is not None, "load() first"
        return list(await asyncio.gather(*(self._scheduler.infer(r) for r in requests)))
