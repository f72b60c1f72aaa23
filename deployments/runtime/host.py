"""A model host: many models in one process, loaded on demand, evicted by measured memory.

Triton serves every model of a repository from one process; a Serve application per model costs a
process per model (docs/hosts.md). A :class:`ModelHost` holds the *pooled* models of a host replica:

* a model is **available** when the host knows its description (``describe``); it is **resident**
  once loaded. The first request for an available model loads it (a cold start); loads run at most
  ``load_concurrency`` at a time, and concurrent requests for the same model share one load;
* every resident model's **footprint** is measured, not guessed: the process's resident memory
  before and after its load (loads are serialized for this by default), and on a host with GPUs
  each GPU's used memory likewise (``deployments.runtime.gpu_memory``). ``budget_bytes`` is what
  the models of the host may take together of host memory, ``gpu_budget_bytes`` of each GPU (the
  process's own memory before any model, its CUDA contexts included, is not counted). Before a
  load the host evicts the least recently used *idle* models (no request inside) until the
  resident models' footprints plus the new model's expected one fit every budget. A model whose
  footprint alone passes a budget is unloaded again and fails its load, naming that budget.
  Eviction never drops a request in flight; an evicted model loads again on its next request;
* statistics stay cumulative across evictions: an evicted model's counters are kept and summed
  with those of its next load;
* a pooled **ensemble** is described with every model it reaches: its pooled steps become available
  here, so the router runs them in this process as pooled models of their own (loaded, measured and
  evicted as any), and the ensemble hosts no copies of them. A step that is not pooled is described
  by ``describe_elsewhere`` and called where it runs. A step forgotten (unloaded or changed) takes
  the ensembles that reach it with it, to be built again on their next request.

The host is Ray-free; the serving layer (``deployments.serve.model_host``) gives it the descriptions
and a factory for the runtimes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import statistics
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from deployments.inference import InferRequest, InferResponse
from deployments.runtime.gpu_memory import release_cached_gpu_memory
from deployments.runtime.metrics import merge_model_metrics
from deployments.runtime.model import ModelRuntime
from deployments.runtime.stats import merge_snapshots
from repository_loader.errors import NotFound, ServerError, Unavailable
from repository_loader.model import ModelDescription

logger = logging.getLogger(__name__)

Describe = Callable[[str], Awaitable[ModelDescription | None]]
"""The description of an available pooled model, None if the name is not one."""
DescribeElsewhere = Callable[[str], Awaitable[ModelDescription]]
"""The description of a served model that is not pooled (an ensemble's step with replicas of its own)."""
MakeRuntime = Callable[..., ModelRuntime]
"""``ModelRuntime``'s signature: the description, then ``composing`` and ``steps_in_process`` for an
ensemble."""

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int:
    """This process's resident memory (RSS), from ``/proc/self/statm``; 0 where it is missing."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _release_memory() -> None:
    """Hand freed memory back to the system (and to the GPU driver), so that the next measurement sees
    an eviction."""
    gc.collect()
    release_cached_gpu_memory()
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        ctypes.CDLL("libc.so.6").malloc_trim(0)


@dataclass
class Resident:
    """A loaded model: its runtime, footprint and use."""

    runtime: ModelRuntime
    footprint: int
    gpu_footprint: dict[int, int] = field(default_factory=dict)  # bytes on each GPU it took any of
    inside: int = 0  # requests inside it now
    last_used: float = field(default_factory=time.monotonic)


@dataclass
class HostCounters:
    """What the host did, for ``/metrics`` and the model statistics."""

    loads: int = 0
    load_failures: int = 0
    evictions: int = 0
    cold_start_s: float = 0.0  # summed over loads

    def as_dict(self) -> dict[str, float]:
        return {
            "loads": self.loads,
            "load_failures": self.load_failures,
            "evictions": self.evictions,
            "cold_start_s": self.cold_start_s,
        }


class ModelHost:
    """The pooled models of one host replica (see the module's description)."""

    def __init__(
        self,
        describe: Describe,
        make_runtime: MakeRuntime,
        budget_bytes: int,
        *,
        load_concurrency: int = 1,
        measure: Callable[[], int] = resident_bytes,
        measure_gpus: Callable[[], Mapping[int, int]] | None = None,
        gpu_budget_bytes: Mapping[int, int] | None = None,
        describe_elsewhere: DescribeElsewhere | None = None,
    ) -> None:
        self._describe = describe
        self._describe_elsewhere = describe_elsewhere
        self._make_runtime = make_runtime
        self.budget_bytes = budget_bytes
        self._measure = measure
        self._measure_gpus = measure_gpus or dict
        self.gpu_budget_bytes: dict[int, int] = dict(gpu_budget_bytes or {})  # by CUDA ordinal
        self._loads = asyncio.Semaphore(max(load_concurrency, 1))
        self._loading: dict[str, asyncio.Task[Resident]] = {}
        self.resident: OrderedDict[str, Resident] = OrderedDict()  # least recently used first
        self.known: dict[str, ModelDescription] = {}  # available models seen so far
        self.composing: dict[str, dict[str, ModelDescription]] = {}  # every model each ensemble reaches
        self._retired: dict[str, list[list[dict[str, Any]]]] = {}  # statistics of evicted loads
        self._retired_failures: dict[str, list[dict[str, dict[str, int]]]] = {}  # and their failures
        self.counters: dict[str, HostCounters] = {}
        self.ongoing = 0  # requests inside this host now, those waiting for a load included

    # --- what is available ---------------------------------------------------------------------

    async def description(self, name: str) -> ModelDescription:
        """The description of available model ``name``; ``NotFound`` (Triton's wording) otherwise. An
        ensemble's steps are described with it (:meth:`_steps`)."""
        found = self.known.get(name)
        if found is None:
            found = await self._describe(name)
            if found is None:
                raise NotFound(f"Request for unknown model: '{name}' is not found")
            if found.is_ensemble:
                self.composing[name] = await self._steps(found)
            self.known[name] = found
        return found

    async def _steps(self, ensemble: ModelDescription) -> dict[str, ModelDescription]:
        """Every model ``ensemble`` reaches, described: a pooled one as available here, any other as
        ``describe_elsewhere`` finds it."""
        found: dict[str, ModelDescription] = {}
        todo = [s.model_name for s in ensemble.ensemble_steps]
        while todo:
            name = todo.pop()
            if name in found:
                continue
            try:
                step = await self.description(name)
            except NotFound:
                if self._describe_elsewhere is None:
                    raise
                step = await self._describe_elsewhere(name)
            found[name] = step
            todo.extend(s.model_name for s in step.ensemble_steps)
        return found

    async def forget(self, name: str) -> None:
        """``name`` is no longer available as it was (unloaded, or changed): unload it here when idle,
        and look its description up again on its next request; so too every ensemble that reaches it.
        Its statistics and failures go with it: loaded again, it counts from zero, as in Triton."""
        self.known.pop(name, None)
        self.composing.pop(name, None)
        resident = self.resident.get(name)
        if resident is not None:
            await self._evict(name, resident, reason="no longer available as loaded")
        self._retired.pop(name, None)
        self._retired_failures.pop(name, None)
        for ensemble in [e for e, steps in self.composing.items() if name in steps]:
            await self.forget(ensemble)

    # --- running -----------------------------------------------------------------------------

    async def runtime(self, name: str) -> Resident:
        """The resident model ``name``, loaded now if it is not (marked used)."""
        resident = self.resident.get(name)
        if resident is None:
            resident = await self._load_once(name)
        else:
            self.resident.move_to_end(name)
        resident.last_used = time.monotonic()
        return resident

    async def infer(self, request: InferRequest) -> InferResponse:
        self.ongoing += 1
        try:
            try:
                resident = await self.runtime(request.model_name)
            except ServerError as error:
                return InferResponse.failed(request, error)
            resident.inside += 1
            try:
                return await resident.runtime.infer(request)
            finally:
                resident.inside -= 1
                resident.last_used = time.monotonic()
        finally:
            self.ongoing -= 1

    async def infer_stream(self, request: InferRequest) -> AsyncGenerator[InferResponse, None]:
        self.ongoing += 1
        try:
            try:
                resident = await self.runtime(request.model_name)
            except ServerError as error:
                yield InferResponse.failed(request, error)
                return
            resident.inside += 1
            try:
                async for response in resident.runtime.infer_stream(request):
                    yield response
            finally:
                resident.inside -= 1
                resident.last_used = time.monotonic()
        finally:
            self.ongoing -= 1

    # --- loading and eviction ------------------------------------------------------------------

    def accounted_bytes(self) -> int:
        """Every resident model's measured footprint, together."""
        return sum(r.footprint for r in self.resident.values())

    def accounted_gpu_bytes(self) -> dict[int, int]:
        """Every resident model's measured footprint on each budgeted GPU, together."""
        return {
            gpu: sum(r.gpu_footprint.get(gpu, 0) for r in self.resident.values())
            for gpu in self.gpu_budget_bytes
        }

    def expected_footprint(self) -> tuple[int, dict[int, int]]:
        """What a model not loaded before is expected to take, of host memory and of each GPU: the
        median of those measured here."""
        seen = list(self.resident.values())
        if not seen:
            return 0, {}
        gpus = {
            gpu: int(statistics.median(r.gpu_footprint.get(gpu, 0) for r in seen))
            for gpu in self.gpu_budget_bytes
        }
        return int(statistics.median(r.footprint for r in seen)), gpus

    def _fits(self, needed: int, needed_gpus: Mapping[int, int]) -> bool:
        if self.accounted_bytes() + needed > self.budget_bytes:
            return False
        on_gpus = self.accounted_gpu_bytes()
        return all(
            on_gpus[gpu] + needed_gpus.get(gpu, 0) <= limit for gpu, limit in self.gpu_budget_bytes.items()
        )

    def _over_budget(self, name: str, footprint: int, gpu_footprint: Mapping[int, int]) -> str | None:
        """Why a model of this footprint can never fit here (None: it can)."""
        if footprint > self.budget_bytes:
            return (
                f"model '{name}' takes {footprint / 2**20:.0f} MiB once loaded, more than the memory budget "
                f"of {self.budget_bytes / 2**20:.0f} MiB of this model host's models; give it a dedicated "
                "deployment (parameter ray.placement: dedicated) or raise the budget (model_host_memory_bytes)"
            )
        for gpu, limit in self.gpu_budget_bytes.items():
            if gpu_footprint.get(gpu, 0) > limit:
                return (
                    f"model '{name}' takes {gpu_footprint[gpu] / 2**20:.0f} MiB of GPU {gpu}'s memory once "
                    f"loaded, more than the GPU memory budget of {limit / 2**20:.0f} MiB of this model host's "
                    "models on it; give it a dedicated deployment (parameter ray.placement: dedicated) or raise "
                    "the budget (model_host_gpu_memory_bytes)"
                )
        return None

    async def _load_once(self, name: str) -> Resident:
        """The one load of ``name`` under way (started if none is): a task of its own, so a requester
        that goes away (a cancelled call) does not abort a load others wait for."""
        task = self._loading.get(name)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._load(name))
            self._loading[name] = task
            task.add_done_callback(lambda done: self._loaded(name, done))
        return await asyncio.shield(task)

    def _loaded(self, name: str, task: asyncio.Task[Resident]) -> None:
        if self._loading.get(name) is task:
            del self._loading[name]
        if not task.cancelled():
            task.exception()  # retrieved: a load nobody waits for any more may have failed

    async def _load(self, name: str) -> Resident:
        model = await self.description(name)
        counters = self.counters.setdefault(name, HostCounters())
        async with self._loads:
            await self._make_room(*self.expected_footprint(), keep=name)
            start = time.monotonic()
            # freed memory the allocator still holds (resident) would be reused by the load unseen
            _release_memory()
            before, before_gpus = self._measure(), self._measure_gpus()
            if model.is_ensemble:  # its steps run here as pooled models (or where they run)
                runtime = self._make_runtime(model, composing=self.composing[name], steps_in_process=False)
            else:
                runtime = self._make_runtime(model)
            try:
                await runtime.load()
            except BaseException:
                counters.load_failures += 1
                await runtime.close()
                _release_memory()
                raise
            footprint = max(self._measure() - before, 0)
            gpu_footprint = {
                gpu: used - before_gpus.get(gpu, 0)
                for gpu, used in self._measure_gpus().items()
                if used > before_gpus.get(gpu, 0)
            }
            refused = self._over_budget(name, footprint, gpu_footprint)
            if refused is not None:
                counters.load_failures += 1
                await runtime.close()
                _release_memory()
                raise Unavailable(refused)
            counters.loads += 1
            counters.cold_start_s += time.monotonic() - start
            resident = Resident(runtime, footprint, gpu_footprint)
            self.resident[name] = resident
            await self._make_room(0, {}, keep=name)  # the load may have taken more than expected
            logger.info(
                "model host: loaded '%s' (%.0f MiB%s, %.2f s); %d resident, %.0f of %.0f MiB",
                name,
                footprint / 2**20,
                "".join(f", {b / 2**20:.0f} MiB on GPU {gpu}" for gpu, b in sorted(gpu_footprint.items())),
                time.monotonic() - start,
                len(self.resident),
                self.accounted_bytes() / 2**20,
                self.budget_bytes / 2**20,
            )
            return resident

    async def _make_room(self, needed: int, needed_gpus: Mapping[int, int], keep: str) -> None:
        """Evict least recently used idle models until ``needed`` more bytes of host memory and
        ``needed_gpus`` more of each GPU fit the budgets."""
        for name, resident in list(self.resident.items()):
            if self._fits(needed, needed_gpus):
                return
            if name == keep or resident.inside:
                continue
            await self._evict(name, resident, reason="memory budget")
        if not self._fits(needed, needed_gpus):
            logger.warning(
                "model host: %.0f MiB accounted (+%.0f MiB for '%s'), %s on GPUs, passes a budget (%.0f MiB, "
                "%s on GPUs): every other resident model has requests inside",
                self.accounted_bytes() / 2**20,
                needed / 2**20,
                keep,
                {gpu: f"{b / 2**20:.0f} MiB" for gpu, b in self.accounted_gpu_bytes().items()},
                self.budget_bytes / 2**20,
                {gpu: f"{b / 2**20:.0f} MiB" for gpu, b in self.gpu_budget_bytes.items()},
            )

    async def _evict(self, name: str, resident: Resident, reason: str) -> None:
        if self.resident.get(name) is not resident:
            return
        del self.resident[name]
        self._retired.setdefault(name, []).append(resident.runtime.statistics())
        failures = resident.runtime.request_metrics()["failures"]
        self._retired_failures.setdefault(name, []).append(failures)
        self.counters.setdefault(name, HostCounters()).evictions += 1
        while resident.inside:  # a forgotten model still answering: let its requests finish
            await asyncio.sleep(0.01)
        await resident.runtime.close()
        _release_memory()
        logger.info("model host: evicted '%s' (%s)", name, reason)

    async def close(self) -> None:
        for name, resident in list(self.resident.items()):
            await self._evict(name, resident, reason="host stopping")

    # --- reporting -----------------------------------------------------------------------------

    def statistics(self, name: str) -> list[dict[str, Any]]:
        """Model ``name``'s statistics in this host, over every load of it (cumulative)."""
        snapshots = list(self._retired.get(name, ()))
        resident = self.resident.get(name)
        if resident is not None:
            snapshots.append(resident.runtime.statistics())
        return merge_snapshots(snapshots)

    def request_metrics(self, name: str) -> dict[str, Any]:
        """What ``/metrics`` prints of model ``name`` beside its statistics
        (``ModelRuntime.request_metrics``): its failures by reason over every load of it, and its
        pending requests, caching and recent durations in the load resident now."""
        snapshots = [{"failures": failures} for failures in self._retired_failures.get(name, ())]
        resident = self.resident.get(name)
        if resident is not None:
            snapshots.append(resident.runtime.request_metrics())
        merged = merge_model_metrics(snapshots)
        del merged["stats"]
        return merged

    def served(self) -> Iterator[str]:
        """Every model this host has run (resident or evicted)."""
        yield from dict.fromkeys([*self._retired, *self.resident])


class HostedModels(Mapping[str, "HostedRunner"]):
    """The router's view of a host's models (``Router(local=...)``): every available model runs here."""

    def __init__(self, host: ModelHost) -> None:
        self.host = host

    def __getitem__(self, name: str) -> HostedRunner:
        if name not in self.host.known:
            raise KeyError(name)
        return HostedRunner(self.host)

    def __contains__(self, name: object) -> bool:
        return name in self.host.known

    def __iter__(self) -> Iterator[str]:
        return iter(self.host.known)

    def __len__(self) -> int:
        return len(self.host.known)


class HostedRunner:
    """A :class:`~deployments.runtime.router.Runner` for a pooled model: loads it on its first request."""

    __slots__ = ("host",)

    def __init__(self, host: ModelHost) -> None:
        self.host = host

    async def infer(self, request: InferRequest) -> InferResponse:
        return await self.host.infer(request)

    def infer_stream(self, request: InferRequest) -> AsyncGenerator[InferResponse, None]:
        return self.host.infer_stream(request)


__all__ = ["HostCounters", "HostedModels", "HostedRunner", "ModelHost", "Resident", "resident_bytes"]
