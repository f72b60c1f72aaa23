"""The ensemble as a validated graph of steps.

An ensemble model (``platform: "ensemble"``) names its steps in
``ensemble_scheduling``; each step maps its own tensor names onto ensemble
tensor names. :func:`build_graph` resolves every step against the composing
models' descriptions and checks Triton's rules, raising a :class:`ConfigError`
that names the ensemble, the step and the tensor:

- every step names a known model and version, and only that model's inputs
  and outputs; every required input of the model is mapped;
- every ensemble tensor is produced once (by an ensemble input or one step);
- every consumed tensor and every ensemble output is produced;
- the steps form no cycle (nested ensembles included);
- producer and consumer agree on data type and shape (``-1`` is a wildcard);
- the ensemble batches no more rows than each composing model accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from repository_loader.errors import ConfigError
from repository_loader.model import ModelDescription, TensorSpec

ModelLookup = Mapping[str, ModelDescription] | Callable[[str], ModelDescription | None]

LATEST = -1


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
    """Resolve and validate ``ensemble`` against the composing models in ``models``."""
    return _build(ensemble, _lookup_function(models), ())


def _lookup_function(models: ModelLookup) -> Callable[[str], ModelDescription | None]:
    if callable(models):
        return models
    return models.get


def _build(
    ensemble: ModelDescription,
    lookup: Callable[[str], ModelDescription | None],
    outer: tuple[str, ...],
) -> EnsembleGraph:
    if not ensemble.is_ensemble:
        raise ConfigError(f"model '{ensemble.name}' is not an ensemble (platform '{ensemble.platform}')")
    if not ensemble.ensemble_steps:
        raise ConfigError(f"in ensemble '{ensemble.name}', ensemble_scheduling names no step")
    stack = (*outer, ensemble.name)
    steps = [_resolve_step(ensemble, i, lookup) for i in range(len(ensemble.ensemble_steps))]
    producer = _producers(ensemble, steps)
    _check_consumed(ensemble, steps, producer)
    ordered = _topological_order(ensemble, steps, producer)
    _check_batching(ensemble, steps)
    _check_types(ensemble, steps, producer)
    nested = {s.model_name: _nested_graph(ensemble, s, lookup, stack) for s in steps if s.model.is_ensemble}
    return EnsembleGraph(ensemble, tuple(ordered), producer, nested)


def _nested_graph(
    ensemble: ModelDescription,
    step: StepNode,
    lookup: Callable[[str], ModelDescription | None],
    stack: tuple[str, ...],
) -> EnsembleGraph:
    if step.model_name in stack:
        chain = " -> ".join((*stack, step.model_name))
        raise ConfigError(
            f"in ensemble '{ensemble.name}', step '{step.model_name}': ensembles contain each other ({chain})"
        )
    return _build(step.model, lookup, stack)


def _where(ensemble: ModelDescription, step: str | None = None) -> str:
    where = f"in ensemble '{ensemble.name}'"
    return f"{where}, step '{step}'" if step else where


def _resolve_step(
    ensemble: ModelDescription, index: int, lookup: Callable[[str], ModelDescription | None]
) -> StepNode:
    config = ensemble.ensemble_steps[index]
    where = _where(ensemble, config.model_name)
    if config.model_name == ensemble.name:
        raise ConfigError(f"{where}: an ensemble cannot name itself as a step")
    model = lookup(config.model_name)
    if model is None:
        raise ConfigError(f"{where}: model '{config.model_name}' is not in the repository")
    version = _resolve_version(where, model, config.model_version)
    for name in config.input_map:
        if model.input(name) is None:
            raise ConfigError(f"{where}: '{name}' in input_map is not an input of model '{model.name}'")
    for name in config.output_map:
        if model.output(name) is None:
            raise ConfigError(f"{where}: '{name}' in output_map is not an output of model '{model.name}'")
    for spec in model.inputs:
        if not spec.optional and spec.name not in config.input_map:
            raise ConfigError(f"{where}: required input '{spec.name}' is not mapped in input_map")
    if not config.output_map:
        raise ConfigError(f"{where}: output_map maps no output")
    return StepNode(
        index,
        model,
        version,
        config.model_version != LATEST,
        dict(config.input_map),
        dict(config.output_map),
    )


def _resolve_version(where: str, model: ModelDescription, version: int) -> int:
    if not model.versions:
        raise ConfigError(f"{where}: model '{model.name}' has no version to serve")
    if version == LATEST:
        return model.latest_version
    if version not in model.versions:
        available = ", ".join(str(v) for v in model.versions)
        raise ConfigError(
            f"{where}: model_version {version} of '{model.name}' is not served (versions: {available})"
        )
    return version


def _producers(ensemble: ModelDescription, steps: list[StepNode]) -> dict[str, int]:
    """Ensemble tensor -> producing step; rejects tensors produced twice."""
    inputs = {t.name for t in ensemble.inputs}
    producer: dict[str, int] = {}
    for step in steps:
        for step_output, tensor in step.output_map.items():
            where = _where(ensemble, step.model_name)
            if tensor in inputs:
                raise ConfigError(
                    f"{where}: output '{step_output}' writes '{tensor}', which is an input of the ensemble"
                )
            if tensor in producer:
                other = steps[producer[tensor]].model_name
                raise ConfigError(
                    f"{where}: output '{step_output}' writes '{tensor}', already produced by step '{other}'"
                )
            producer[tensor] = step.index
    return producer


def _check_consumed(ensemble: ModelDescription, steps: list[StepNode], producer: Mapping[str, int]) -> None:
    inputs = {t.name for t in ensemble.inputs}
    for step in steps:
        for step_input, tensor in step.input_map.items():
            if tensor not in inputs and tensor not in producer:
                raise ConfigError(
                    f"{_where(ensemble, step.model_name)}: input '{step_input}' reads '{tensor}', "
                    "which no step produces and is not an input of the ensemble"
                )
    for spec in ensemble.outputs:
        if spec.name not in producer:
            raise ConfigError(f"{_where(ensemble)}: output '{spec.name}' is not produced by any step")


def _topological_order(
    ensemble: ModelDescription, steps: list[StepNode], producer: Mapping[str, int]
) -> list[StepNode]:
    """Kahn's algorithm; the steps left over form a cycle."""
    depends = {s.index: {producer[t] for t in s.consumes if t in producer} for s in steps}
    done: list[StepNode] = []
    placed: set[int] = set()
    while len(done) < len(steps):
        ready = [s for s in steps if s.index not in placed and depends[s.index] <= placed]
        if not ready:
            left = [s for s in steps if s.index not in placed]
            names = ", ".join(f"'{s.model_name}'" for s in left)
            left_ids = {s.index for s in left}
            tensors = sorted({t for s in left for t in s.consumes if producer.get(t) in left_ids})
            raise ConfigError(
                f"{_where(ensemble)}: steps {names} form a cycle through tensors {', '.join(tensors)}"
            )
        done.extend(ready)
        placed.update(s.index for s in ready)
    return done


def _full_shape(spec: TensorSpec, max_batch_size: int) -> tuple[int, ...]:
    return tuple(spec.full_shape(max_batch_size))


def shapes_agree(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Same rank and equal dimensions, where ``-1`` matches any size."""
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=True))


def _check_pair(
    where: str,
    what: str,
    producer: tuple[TensorSpec, int],
    consumer: tuple[TensorSpec, int],
) -> None:
    (p_spec, p_batch), (c_spec, c_batch) = producer, consumer
    if p_spec.datatype != c_spec.datatype:
        raise ConfigError(f"{where}: {what}: data type {p_spec.datatype} does not match {c_spec.datatype}")
    p_shape, c_shape = _full_shape(p_spec, p_batch), _full_shape(c_spec, c_batch)
    if not shapes_agree(p_shape, c_shape):
        raise ConfigError(f"{where}: {what}: shape {list(p_shape)} does not match {list(c_shape)}")


def _source_spec(
    ensemble: ModelDescription, steps: list[StepNode], producer: Mapping[str, int], tensor: str
) -> tuple[TensorSpec, int, str]:
    """The spec a tensor has where it is made, its batch size and a description of its maker."""
    spec = ensemble.input(tensor)
    if spec is not None:
        return spec, ensemble.max_batch_size, f"ensemble input '{tensor}'"
    step = steps[producer[tensor]]
    step_output = next(k for k, v in step.output_map.items() if v == tensor)
    out = step.model.output(step_output)
    assert out is not None  # checked in _resolve_step
    return out, step.model.max_batch_size, f"output '{step_output}' of step '{step.model_name}'"


def _check_types(ensemble: ModelDescription, steps: list[StepNode], producer: Mapping[str, int]) -> None:
    for step in steps:
        where = _where(ensemble, step.model_name)
        for step_input, tensor in step.input_map.items():
            source, batch, maker = _source_spec(ensemble, steps, producer, tensor)
            spec = step.model.input(step_input)
            assert spec is not None
            what = f"tensor '{tensor}' from {maker} to input '{step_input}'"
            _check_pair(where, what, (source, batch), (spec, step.model.max_batch_size))
    for out in ensemble.outputs:
        source, batch, maker = _source_spec(ensemble, steps, producer, out.name)
        what = f"tensor '{out.name}' from {maker} to the ensemble output"
        _check_pair(_where(ensemble), what, (source, batch), (out, ensemble.max_batch_size))


def _check_batching(ensemble: ModelDescription, steps: list[StepNode]) -> None:
    if ensemble.max_batch_size <= 0:
        return
    for step in steps:
        if step.model.max_batch_size < ensemble.max_batch_size:
            raise ConfigError(
                f"{_where(ensemble, step.model_name)}: max_batch_size {ensemble.max_batch_size} of the "
                f"ensemble exceeds max_batch_size {step.model.max_batch_size} of model '{step.model_name}'"
            )
