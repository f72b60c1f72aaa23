"""The ensemble as a graph of steps, as the scheduler runs it.

An ensemble model (``platform: "ensemble"``) names its steps in
``ensemble_scheduling``; each step maps its own tensor names onto ensemble
tensor names. :func:`build_graph` resolves every step against the composing
models' descriptions and orders the steps. It expects an ensemble that passed
the one ensemble validator (:mod:`repository_loader.ensemble_rules`, run by the
repository loader) and does not check Triton's rules again: an ensemble that
breaks them raises :class:`InternalError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from repository_loader.ensemble_rules import LATEST_VERSIONS, ModelLookup, lookup_function
from repository_loader.errors import ConfigError, InternalError
from repository_loader.model import ModelDescription


@dataclass(frozen=True)
class StepNode:
    """One resolved step: the composing model, its version and its tensor maps."""

    index: int
    model: ModelDescription
    version: int  # resolved: never -1
    pinned: bool  # the config names a version (False: the latest)
    input_map: Mapping[str, str]  # step input -> ensemble tensor
    output_map: Mapping[str, str]  # step output -> ensemble tensor

    @property
    def model_name(self) -> str:
        return self.model.name

    @property
    def consumes(self) -> frozenset[str]:
        """Ensemble tensors this step reads."""
        return frozenset(self.input_map.values())

    @property
    def produces(self) -> frozenset[str]:
        """Ensemble tensors this step writes."""
        return frozenset(self.output_map.values())


@dataclass(frozen=True)
class EnsembleGraph:
    """A validated ensemble: steps in a topological order and who makes each tensor."""

    ensemble: ModelDescription
    steps: tuple[StepNode, ...]  # topological order
    producer: Mapping[str, int]  # ensemble tensor -> index of the step that makes it
    nested: Mapping[str, EnsembleGraph] = field(default_factory=dict)  # model name -> its graph

    @property
    def name(self) -> str:
        return self.ensemble.name

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.ensemble.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.ensemble.outputs]

    def step(self, index: int) -> StepNode:
        return next(s for s in self.steps if s.index == index)

    def needed_steps(self, requested_outputs: Iterable[str]) -> list[StepNode]:
        """Steps that must run to produce ``requested_outputs``, in topological order."""
        needed: set[int] = set()
        stack = [t for t in requested_outputs if t in self.producer]
        while stack:
            index = self.producer[stack.pop()]
            if index in needed:
                continue
            needed.add(index)
            stack.extend(t for t in self.step(index).consumes if t in self.producer)
        return [s for s in self.steps if s.index in needed]

    def pruned(self, requested_outputs: Iterable[str]) -> EnsembleGraph:
        """This graph with only the steps needed for ``requested_outputs``."""
        requested = list(requested_outputs)
        for name in requested:
            if self.ensemble.output(name) is None:
                raise ConfigError(f"in ensemble '{self.name}', '{name}' is not an output of the ensemble")
        steps = tuple(self.needed_steps(requested))
        kept = {s.index for s in steps}
        producer = {t: i for t, i in self.producer.items() if i in kept}
        nested = {n: g for n, g in self.nested.items() if any(s.model_name == n for s in steps)}
        return EnsembleGraph(self.ensemble, steps, producer, nested)


def build_graph(ensemble: ModelDescription, models: ModelLookup) -> EnsembleGraph:
    """The step graph of ``ensemble`` (validated) over the composing models in ``models``."""
    return _build(ensemble, lookup_function(models), ())


def _build(
    ensemble: ModelDescription,
    lookup: Callable[[str], ModelDescription | None],
    outer: tuple[str, ...],
) -> EnsembleGraph:
    if not ensemble.is_ensemble:
        raise ConfigError(f"model '{ensemble.name}' is not an ensemble (platform '{ensemble.platform}')")
    if ensemble.name in outer:
        raise _unvalidated(ensemble, f"it contains itself ({' -> '.join((*outer, ensemble.name))})")
    steps = [_resolve_step(ensemble, i, lookup) for i in range(len(ensemble.ensemble_steps))]
    producer = {tensor: s.index for s in steps for tensor in s.output_map.values()}
    ordered = _topological_order(ensemble, steps, producer)
    stack = (*outer, ensemble.name)
    nested = {s.model_name: _build(s.model, lookup, stack) for s in steps if s.model.is_ensemble}
    return EnsembleGraph(ensemble, tuple(ordered), producer, nested)


def _unvalidated(ensemble: ModelDescription, problem: str) -> InternalError:
    return InternalError(
        f"ensemble '{ensemble.name}' was not validated before its graph was built: {problem}"
    )


def _resolve_step(
    ensemble: ModelDescription, index: int, lookup: Callable[[str], ModelDescription | None]
) -> StepNode:
    config = ensemble.ensemble_steps[index]
    model = lookup(config.model_name)
    if model is None or not model.versions:
        raise _unvalidated(ensemble, f"step model '{config.model_name}' has no loaded version")
    latest = config.model_version in LATEST_VERSIONS
    return StepNode(
        index,
        model,
        model.latest_version if latest else config.model_version,
        not latest,
        dict(config.input_map),
        dict(config.output_map),
    )


def _topological_order(
    ensemble: ModelDescription, steps: list[StepNode], producer: Mapping[str, int]
) -> list[StepNode]:
    """Kahn's algorithm over the steps (acyclic: the validator checked)."""
    depends = {s.index: {producer[t] for t in s.consumes if t in producer} for s in steps}
    done: list[StepNode] = []
    placed: set[int] = set()
    while len(done) < len(steps):
        ready = [s for s in steps if s.index not in placed and depends[s.index] <= placed]
        if not ready:
            raise _unvalidated(ensemble, "its steps form a cycle")
        done.extend(ready)
        placed.update(s.index for s in ready)
    return done
