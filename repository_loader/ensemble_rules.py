"""The one ensemble validator: Triton's rules for an ensemble's steps, on model descriptions.

The repository loader runs :func:`check_ensemble` on every ensemble whose own
config passed :mod:`repository_loader.validation`, so the server and
``triton-serve validate`` give one verdict. :func:`ensembles.graph.build_graph`
builds the step graph of an ensemble that passed, without checking again.
Messages follow Triton's wording where Triton has one.

Within one ensemble (:func:`check_ensemble_flow`):

- every step names a model and maps at least one input and one output;
- an ensemble tensor is written by one step only, never an ensemble input;
- then Triton's data-flow check (``ValidateEnsembleSchedulingConfig``): every
  ensemble input is used; every ensemble output is written; every tensor is
  connected, that is computable from the ensemble inputs (a tensor no step
  writes, or one on a cycle of steps, is not).

Across models (:func:`check_ensemble_members`):

- no circular dependency between ensembles (an ensemble naming itself included);
- every step names a model that loaded, and a version it serves;
- a step maps only the model's own inputs and outputs, and every required input;
- a batching ensemble batches no more rows than each step's model accepts;
- every ensemble tensor has one data type and one shape (``-1`` matches any
  size) wherever it is read or written.

:func:`composing_models` is an ensemble's closure: the models it needs, nested
ensembles included (the server loads and unloads them with it, and gives them
to its application); :func:`nested_first` is the order in which ensembles load.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

from repository_loader.datatypes import wire_to_config
from repository_loader.errors import ConfigError
from repository_loader.findings import Findings
from repository_loader.model import EnsembleStep, ModelDescription, TensorSpec

Node = TypeVar("Node", bound=Hashable)
ModelLookup = Mapping[str, ModelDescription] | Callable[[str], ModelDescription | None]
StepModels = Callable[[str], Sequence[str]]  # model name -> the models its steps name ([] if none)

LATEST_VERSIONS = (-1, 0)  # a step's model_version that means "the latest"
_STEP = "ensemble_scheduling.step"


def lookup_function(models: ModelLookup) -> Callable[[str], ModelDescription | None]:
    """``models`` as a function from name to description (None: unknown)."""
    return models if callable(models) else models.get


def find_cycle(successors: Callable[[Node], Iterable[Node]], roots: Iterable[Node]) -> list[Node]:
    """A cycle reachable from ``roots`` as a node list that starts and ends at one node, or []."""
    state: dict[Node, int] = {}  # 1 = on the current path, 2 = done
    path: list[Node] = []

    def visit(node: Node) -> list[Node]:
        state[node] = 1
        path.append(node)
        for succ in sorted(successors(node), key=str):
            if state.get(succ) == 1:
                return [*path[path.index(succ) :], succ]
            if succ not in state:
                found = visit(succ)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return []

    for root in sorted(roots, key=str):
        if root not in state:
            found = visit(root)
            if found:
                return found
    return []


def ensemble_cycle(name: str, step_models: StepModels) -> list[str]:
    """A circular dependency between ensembles reachable from ``name``, or []."""
    return find_cycle(step_models, [name])


def reached(successors: Callable[[Node], Iterable[Node]], starts: Iterable[Node]) -> list[Node]:
    """Every node reached from ``starts`` (themselves included), each once, in the order a
    depth-first walk meets them (the last successor first)."""
    found: dict[Node, None] = {}
    todo = list(starts)
    while todo:
        node = todo.pop()
        if node not in found:
            found[node] = None
            todo.extend(successors(node))
    return list(found)


def composing_models(ensemble: ModelDescription, models: ModelLookup) -> list[str]:
    """The models ``ensemble`` needs: those its steps name and, through nested ensembles, theirs.

    ``models`` holds the descriptions to follow; a name it does not know is listed, not followed.
    """
    return reached(step_models_of(models), [s.model_name for s in ensemble.ensemble_steps])


def nested_first(ensembles: Sequence[ModelDescription]) -> list[ModelDescription]:
    """``ensembles`` in an order that puts each after the ensembles of the list its steps name, so
    that a nested ensemble is loaded before one that runs it; otherwise in the order given (a
    circular dependency, which validation refuses, is left in that order)."""
    by_name = {m.name: m for m in ensembles}
    ordered: dict[str, ModelDescription] = {}
    visiting: set[str] = set()

    def visit(model: ModelDescription) -> None:
        if model.name in ordered or model.name in visiting:
            return
        visiting.add(model.name)
        for step in model.ensemble_steps:
            nested = by_name.get(step.model_name)
            if nested is not None:
                visit(nested)
        ordered[model.name] = model

    for model in ensembles:
        visit(model)
    return list(ordered.values())


def step_models_of(models: ModelLookup) -> StepModels:
    """The :data:`StepModels` of descriptions: the models each ensemble's steps name."""
    lookup = lookup_function(models)

    def step_models(name: str) -> list[str]:
        model = lookup(name)
        return [s.model_name for s in model.ensemble_steps] if model is not None else []

    return step_models


def check_ensemble(
    ensemble: ModelDescription,
    models: ModelLookup,
    findings: Findings,
    *,
    failed: Mapping[str, Sequence[str]] | None = None,
    step_models: StepModels | None = None,
) -> None:
    """Every rule for ``ensemble``, adding to ``findings``; ``models`` holds the loaded models.

    ``failed`` names models that failed to load; ``step_models`` gives the step
    models of any model of the repository (default: read from ``models``).
    """
    check_ensemble_flow(ensemble, findings)
    if not findings:
        check_ensemble_members(ensemble, models, findings, failed=failed, step_models=step_models)


def validate_ensemble(ensemble: ModelDescription, models: ModelLookup) -> None:
    """Check ``ensemble`` and the ensembles nested in it; raise one :class:`ConfigError` listing every problem."""
    lookup = lookup_function(models)
    errors: list[str] = []

    def checked_steps(name: str) -> list[str]:
        """The models the steps of ``name`` name, once it passed (none below an ensemble that failed)."""
        model = ensemble if name == ensemble.name else lookup(name)
        if model is None or not model.is_ensemble:
            return []
        findings = Findings(model.name, f"{model.name}/config.pbtxt")
        check_ensemble(model, lookup, findings)
        errors.extend(findings.errors)
        return [] if findings else [s.model_name for s in model.ensemble_steps]

    reached(checked_steps, [ensemble.name])
    if errors:
        raise ConfigError("\n".join(errors))


# --- within one ensemble ----------------------------------------------------------


def _where(index: int, step: EnsembleStep) -> str:
    return f"{_STEP}[{index}] '{step.model_name}'"


def check_ensemble_flow(ensemble: ModelDescription, findings: Findings) -> None:
    """Within one ensemble: every step is complete, every tensor written once and connected."""
    steps = ensemble.ensemble_steps
    inputs = {t.name for t in ensemble.inputs}
    errors_before = len(findings.errors)
    writers = _writers(steps, inputs, findings)
    for index, step in enumerate(steps):
        where = _where(index, step)
        if not step.model_name:
            findings.add(f"{_STEP}[{index}].model_name", "must specify 'model_name'")
        if not step.input_map:
            findings.add(f"{where}.input_map", "must specify 'input_map'")
        if not step.output_map:
            findings.add(f"{where}.output_map", "must specify 'output_map'")
    if len(findings.errors) == errors_before:  # Triton checks the data flow of a well-formed graph only
        _check_data_flow(ensemble, writers, findings)


def _check_data_flow(ensemble: ModelDescription, writers: Mapping[str, int], findings: Findings) -> None:
    """Triton's data-flow check, in its words: inputs used, outputs written, every tensor connected."""
    steps, name = ensemble.ensemble_steps, ensemble.name
    errors_before = len(findings.errors)
    mentioned = _tensors_in_maps(steps)
    ready = _ready_tensors(steps, {t.name for t in ensemble.inputs})
    outputs = {t.name for t in ensemble.outputs}
    for spec in ensemble.inputs:
        if spec.name not in mentioned:
            findings.add("input", f"ensemble input '{spec.name}' for ensemble '{name}' is not used")
    for spec in ensemble.outputs:
        if spec.name not in mentioned:
            findings.add("output", f"ensemble output '{spec.name}' for ensemble '{name}' is not used")
        elif spec.name not in ready:
            source = _not_connected_source(spec.name, steps, writers, ready)
            reason = (
                f": at least one of its depending tensors, '{source}', is not connected" if source else ""
            )
            findings.add("output", f"output '{spec.name}' for ensemble '{name}' is not written{reason}")
    if len(findings.errors) > errors_before:
        return  # as Triton, which stops at the first: the tensors below feed what is reported
    for tensor in mentioned:
        if tensor not in outputs and tensor not in ready:
            findings.add(
                _tensor_field(tensor, steps, writers),
                f"ensemble tensor '{tensor}' is unused in ensemble '{name}'",
            )


def _tensors_in_maps(steps: Sequence[EnsembleStep]) -> list[str]:
    """Every ensemble tensor a step reads or writes, in order of first mention."""
    seen: dict[str, None] = {}
    for step in steps:
        seen.update(dict.fromkeys(step.output_map.values()))
        seen.update(dict.fromkeys(step.input_map.values()))
    return list(seen)


def _ready_tensors(steps: Sequence[EnsembleStep], inputs: set[str]) -> set[str]:
    """The tensors computable from the ensemble inputs: a step's outputs once all it reads is ready."""
    ready = set(inputs)
    pending = list(steps)
    while True:
        runnable = [s for s in pending if all(tensor in ready for tensor in s.input_map.values())]
        if not runnable:
            return ready
        for step in runnable:
            ready.update(step.output_map.values())
        pending = [s for s in pending if s not in runnable]


def _not_connected_source(
    output: str, steps: Sequence[EnsembleStep], writers: Mapping[str, int], ready: set[str]
) -> str:
    """The not-connected tensor Triton names for an output that is not written ('' for the output itself).

    Triton's walk: from the output, follow the first depending tensor that is not
    ready and not yet seen, until there is none.
    """

    def depends_on(tensor: str) -> list[str]:
        return list(steps[writers[tensor]].input_map.values()) if tensor in writers else []

    last, seen = output, set[str]()
    nodes = depends_on(output)
    while nodes:
        following: list[str] = []
        for node in nodes:
            if node not in ready and node not in seen:
                seen.add(node)
                last, following = node, depends_on(node)
                break
        nodes = following
    return "" if last == output else last


def _tensor_field(tensor: str, steps: Sequence[EnsembleStep], writers: Mapping[str, int]) -> str:
    """The field to name for an ensemble tensor: the step that writes it, else the first that reads it."""
    if tensor in writers:
        return f"{_where(writers[tensor], steps[writers[tensor]])}.output_map"
    index = next(i for i, s in enumerate(steps) if tensor in s.input_map.values())
    return f"{_where(index, steps[index])}.input_map"


def _writers(steps: Sequence[EnsembleStep], inputs: set[str], findings: Findings) -> dict[str, int]:
    """Ensemble tensor -> index of the step that writes it."""
    writers: dict[str, int] = {}
    for index, step in enumerate(steps):
        where = f"{_where(index, step)}.output_map"
        for tensor in step.output_map.values():
            if tensor in inputs:
                findings.add(
                    where, f"ensemble tensor '{tensor}' is an ensemble input; a step cannot write it"
                )
            elif tensor in writers:
                first = writers[tensor]
                findings.add(
                    where,
                    f"ensemble tensor '{tensor}' can appear in an output map only once "
                    f"(step[{first}] '{steps[first].model_name}' writes it)",
                )
            else:
                writers[tensor] = index
    return writers


# --- across models ----------------------------------------------------------------


def check_ensemble_members(
    ensemble: ModelDescription,
    models: ModelLookup,
    findings: Findings,
    *,
    failed: Mapping[str, Sequence[str]] | None = None,
    step_models: StepModels | None = None,
) -> None:
    """Each step names a loaded model whose tensors agree with the ensemble's (after :func:`check_ensemble_flow`)."""
    lookup = lookup_function(models)
    cycle = ensemble_cycle(ensemble.name, step_models or step_models_of(lookup))
    if cycle:
        findings.add(_STEP, f"circular dependency between ensembles: {' -> '.join(cycle)}")
        return
    members: list[ModelDescription] = []
    for index, step in enumerate(ensemble.ensemble_steps):
        member = _member(index, step, lookup, failed or {}, findings)
        if member is not None:
            _check_maps(ensemble, index, step, member, findings)
            members.append(member)
            if ensemble.response_cache and member.decoupled:
                findings.add(
                    "response_cache.enable",
                    f"Response Cache does not currently support model {ensemble.name} with 'decoupled' "
                    f"composing model {member.name}. Please disable the response cache.",
                )
    if not findings:
        _check_tensors(ensemble, members, findings)


def _member(
    index: int,
    step: EnsembleStep,
    lookup: Callable[[str], ModelDescription | None],
    failed: Mapping[str, Sequence[str]],
    findings: Findings,
) -> ModelDescription | None:
    where = _where(index, step)
    member = lookup(step.model_name)
    if member is None:
        reason = (
            "is not available (it failed to load)"
            if step.model_name in failed
            else "is not in the repository"
        )
        findings.add(f"{where}.model_name", f"model '{step.model_name}' {reason}")
        return None
    if not member.versions:
        findings.add(f"{where}.model_version", f"model '{member.name}' has no version to serve")
    elif step.model_version not in LATEST_VERSIONS and step.model_version not in member.versions:
        served = ", ".join(str(v) for v in member.versions)
        findings.add(
            f"{where}.model_version",
            f"model_version {step.model_version} of '{member.name}' is not served (versions: {served})",
        )
    return member


def _check_maps(
    ensemble: ModelDescription, index: int, step: EnsembleStep, member: ModelDescription, findings: Findings
) -> None:
    where = _where(index, step)
    for name in step.input_map:
        if member.input(name) is None:
            findings.add(f"{where}.input_map", f"'{name}' is not an input of model '{member.name}'")
    for spec in member.inputs:
        if not spec.optional and spec.name not in step.input_map:
            findings.add(
                f"{where}.input_map",
                f"required input '{spec.name}' of model '{member.name}' is not mapped to any ensemble tensor",
            )
    for name in step.output_map:
        if member.output(name) is None:
            findings.add(f"{where}.output_map", f"'{name}' is not an output of model '{member.name}'")
    # a model that does not batch may serve a batching ensemble (its full shapes checked below)
    if 0 < member.max_batch_size < ensemble.max_batch_size:
        findings.add(
            f"{where}.model_name",
            f"ensemble '{ensemble.name}' allows max_batch_size {ensemble.max_batch_size}, "
            f"but model '{member.name}' allows only {member.max_batch_size}",
        )


def shapes_agree(a: Sequence[int], b: Sequence[int]) -> bool:
    """Same rank and equal dimensions, where ``-1`` matches any size."""
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))


class _Seen:
    """An ensemble tensor as first read or written: data type, full shape and the model it comes from."""

    def __init__(self, spec: TensorSpec, max_batch_size: int, model: str, own: bool) -> None:
        dims = spec.reshape if own and spec.reshape is not None else spec.dims
        self.datatype = wire_to_config(spec.datatype)
        self.dims = list(dims)
        self.shape = ([-1] if max_batch_size > 0 else []) + self.dims
        self.model = model


def _check_tensors(
    ensemble: ModelDescription, members: Sequence[ModelDescription], findings: Findings
) -> None:
    """Each ensemble tensor has one data type and one shape wherever it is read or written."""
    seen = {
        t.name: _Seen(t, ensemble.max_batch_size, ensemble.name, True)
        for t in (*ensemble.inputs, *ensemble.outputs)
    }
    for index, (step, member) in enumerate(zip(ensemble.ensemble_steps, members, strict=True)):
        for field_name, mapping, spec_of in (
            ("input_map", step.input_map, member.input),
            ("output_map", step.output_map, member.output),
        ):
            for name, tensor in mapping.items():
                spec = spec_of(name)
                assert spec is not None  # checked in _check_maps
                here = _Seen(spec, member.max_batch_size, member.name, False)
                first = seen.setdefault(tensor, here)
                problem = _disagreement(first, here)
                if problem:
                    findings.add(
                        f"{_where(index, step)}.{field_name}", f"ensemble tensor '{tensor}': {problem}"
                    )


def _disagreement(first: _Seen, here: _Seen) -> str:
    if first.datatype != here.datatype:
        return (
            f"inconsistent data type: {first.datatype} is inferred from model '{first.model}' "
            f"while {here.datatype} is inferred from model '{here.model}'"
        )
    # the dimensions agree, or the full shapes do (a tensor passed between a model that batches and one that
    # does not: [-1, d...] without batching is [d...] with it); the scheduler adds or strips the batch of one
    if not shapes_agree(first.dims, here.dims) and not shapes_agree(first.shape, here.shape):
        return (
            f"inconsistent shape: {first.shape} is inferred from model '{first.model}' "
            f"while {here.shape} is inferred from model '{here.model}'"
        )
    return ""


def with_step_labels(ensemble: ModelDescription, models: Mapping[str, ModelDescription]) -> ModelDescription:
    """``ensemble`` with each output that names no label file given the label file of the step output
    that produces it (``TensorSpec.step_labels``), through nested ensembles: Triton's classification
    labels an ensemble's output as the model that made the tensor labels it. An output the ensemble
    labels itself, or whose producing step has no labels, is left as it is."""
    producers = {
        tensor: (step.model_name, step_output)
        for step in ensemble.ensemble_steps
        for step_output, tensor in step.output_map.items()
    }
    outputs = []
    for output in ensemble.outputs:
        name, step_output = producers.get(output.name, ("", ""))
        step = models.get(name) if not output.label_filename else None
        spec = next((o for o in step.outputs if o.name == step_output), None) if step else None
        found = None
        if step is not None and spec is not None:
            found = spec.step_labels or (
                str(step.path / spec.label_filename) if spec.label_filename else None
            )
        outputs.append(replace(output, step_labels=found) if found else output)
    return replace(ensemble, outputs=tuple(outputs))
