"""Where the steps of an ensemble run, and how tensors travel between them.

By default (``colocate``) the composing models that run on the same device
share a group. ``separate`` gives every model its own group. The ensemble's
``parameters`` choose, as Triton config parameters::

    parameters { key: "placement" value: { string_value: "separate" } }
    parameters { key: "placement.postprocess" value: { string_value: "host_side" } }

``placement.<model>`` puts one model into a named group, whatever the mode.
Nested ensembles are flattened: their composing models are placed like the
outer ones.

When serving, the ensemble's own replica hosts one group
(:attr:`EnsemblePlacement.hosted`): it loads those models in process and hands
tensors between them on as the same objects (DLPack views where frameworks
differ). The hosted group is the one with the most tensors passing inside it
(ties: the most steps). A group is never hosted when no tensor passes inside
it, when a model of it places itself (``KIND_MODEL``), when it needs a GPU the
ensemble's replica lacks (``gpu_available``), or, under ``separate``, when
it is a model's own group rather than one that a ``placement.<model>``
parameter names. Steps outside the hosted group run on their models' own
deployments, so only tensors inside the hosted group are reported in process.
:func:`describe_placement` prints the result for ``validate``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ensembles.graph import EnsembleGraph, StepNode
from ensembles.handoff import Route
from repository_loader.errors import ConfigError
from repository_loader.model import InstanceKind, ModelDescription

COLOCATE = "colocate"
SEPARATE = "separate"
MODES = (COLOCATE, SEPARATE)
PARAMETER = "placement"

_ROUTE_WORDS = {
    Route.IN_PROCESS: "in process (DLPack, zero copy)",
    Route.REPLICA: "over HTTP between replicas (binary, host memory)",
}


@dataclass(frozen=True)
class PlacedStep:
    """A composing model of the (flattened) ensemble and the group it runs in."""

    model_name: str
    version: int
    device: str  # "cpu", "gpu", "gpu:0,1" or "model" (KIND_MODEL places itself)
    group: str
    path: str  # ensemble names down to this step, e.g. "outer/inner"


@dataclass(frozen=True)
class Edge:
    """An ensemble tensor going from one step to another, and its route."""

    tensor: str
    producer: str
    consumer: str
    route: Route


@dataclass(frozen=True)
class EnsemblePlacement:
    """The chosen placement of one ensemble."""

    ensemble: str
    mode: str
    steps: tuple[PlacedStep, ...]
    edges: tuple[Edge, ...]
    hosted: str | None = None  # the group the ensemble's replica loads in process; None: none

    def groups(self) -> dict[str, list[PlacedStep]]:
        """Group name -> its steps, in step order."""
        groups: dict[str, list[PlacedStep]] = {}
        for step in self.steps:
            groups.setdefault(step.group, []).append(step)
        return groups

    def group_of(self, model_name: str) -> str:
        return next(s.group for s in self.steps if s.model_name == model_name)

    def hosted_models(self) -> dict[str, str]:
        """Model name -> device, for the models the ensemble's replica loads (each model once)."""
        return {
            s.model_name: s.device for s in self.steps if self.hosted is not None and s.group == self.hosted
        }

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, for ``validate --json``."""
        return {
            "mode": self.mode,
            "hosted_group": self.hosted,
            "groups": [
                {
                    "name": group,
                    "devices": sorted({s.device for s in steps}),
                    "hosted": group == self.hosted,
                    "steps": [
                        {"model": s.model_name, "version": s.version, "device": s.device, "path": s.path}
                        for s in steps
                    ],
                }
                for group, steps in self.groups().items()
            ],
            "edges": [
                {"tensor": e.tensor, "producer": e.producer, "consumer": e.consumer, "route": e.route.value}
                for e in self.edges
            ],
        }


def model_device(model: ModelDescription, gpu_available: bool = False) -> str:
    """The device a model's instances run on, from its instance groups."""
    kinds = {g.kind for g in model.instance_groups} or {InstanceKind.AUTO}
    if InstanceKind.MODEL in kinds:
        return "model"
    if InstanceKind.GPU in kinds or (InstanceKind.AUTO in kinds and gpu_available and model.kind != "python"):
        gpus = sorted({gpu for g in model.instance_groups for gpu in g.gpus})
        return "gpu:" + ",".join(str(g) for g in gpus) if gpus else "gpu"
    return "cpu"


def choose_placement(
    graph: EnsembleGraph,
    devices: Mapping[str, str] | None = None,
    gpu_available: bool = False,
) -> EnsemblePlacement:
    """Place the steps of ``graph`` and choose the group the ensemble's replica hosts.

    ``devices`` (model -> device) overrides what instance groups say;
    ``gpu_available``: the ensemble's replica has a GPU (models of kind AUTO
    then run on it, and a group on a GPU can be hosted).
    """
    mode, overrides = _read_parameters(graph)
    flat = list(_flatten(graph, {}, graph.name))
    steps = []
    for step, _, _, path in flat:
        device = (devices or {}).get(step.model_name) or model_device(step.model, gpu_available)
        group = overrides.get(step.model_name) or _default_group(mode, step.model_name, device)
        steps.append(PlacedStep(step.model_name, step.version, device, group, path))
    pairs = _pairs(flat)
    named = set(overrides.values()) if mode == SEPARATE else None
    hosted = _hosted_group(steps, pairs, gpu_available, named)
    edges = [_edge(tensor, steps[i], steps[j], hosted) for tensor, i, j in pairs]
    return EnsemblePlacement(graph.name, mode, tuple(steps), tuple(edges), hosted)


def _read_parameters(graph: EnsembleGraph) -> tuple[str, dict[str, str]]:
    params = graph.ensemble.parameters
    mode = params.get(PARAMETER, COLOCATE)
    if mode not in MODES:
        raise ConfigError(
            f"in ensemble '{graph.name}', parameter '{PARAMETER}' is '{mode}'; expected one of {', '.join(MODES)}"
        )
    names = set(_leaf_names(graph))
    overrides: dict[str, str] = {}
    for key, value in params.items():
        if not key.startswith(PARAMETER + "."):
            continue
        model = key[len(PARAMETER) + 1 :]
        if model not in names:
            raise ConfigError(
                f"in ensemble '{graph.name}', parameter '{key}' names model '{model}', which is not a step"
            )
        if not value:
            raise ConfigError(f"in ensemble '{graph.name}', parameter '{key}' names no group")
        overrides[model] = value
    return mode, overrides


def _leaf_names(graph: EnsembleGraph) -> Iterator[str]:
    for step in graph.steps:
        if step.model_name in graph.nested:
            yield from _leaf_names(graph.nested[step.model_name])
        else:
            yield step.model_name


def _default_group(mode: str, model_name: str, device: str) -> str:
    if mode == SEPARATE or device == "model":
        return model_name
    return device


Flat = tuple[StepNode, frozenset[str], frozenset[str], str]  # step, reads, writes, path


def _flatten(graph: EnsembleGraph, alias: Mapping[str, str], path: str) -> Iterator[Flat]:
    """Leaf steps with tensor names made global: nested tensors map onto the outer ones."""

    def name(tensor: str) -> str:
        nested = "/" in path
        return alias.get(tensor, f"{path}/{tensor}" if nested else tensor)

    for step in graph.steps:
        if step.model_name in graph.nested:
            inner = {k: name(v) for k, v in step.input_map.items()}
            inner.update({k: name(v) for k, v in step.output_map.items()})
            yield from _flatten(graph.nested[step.model_name], inner, f"{path}/{step.model_name}")
        else:
            reads = frozenset(name(t) for t in step.consumes)
            writes = frozenset(name(t) for t in step.produces)
            yield step, reads, writes, path


def _pairs(flat: list[Flat]) -> list[tuple[str, int, int]]:
    """Every tensor passed between steps: (tensor, producing step, consuming step), as flat indices."""
    writer = {t: i for i, (_, _, writes, _) in enumerate(flat) for t in writes}
    pairs = []
    for j, (_, reads, _, _) in enumerate(flat):
        for tensor in sorted(reads):
            if tensor in writer:
                pairs.append((tensor, writer[tensor], j))
    return pairs


def _hosted_group(
    steps: list[PlacedStep],
    pairs: list[tuple[str, int, int]],
    gpu_available: bool,
    named: set[str] | None,
) -> str | None:
    """The group with the most tensors passing inside it (ties: most steps, then the first); see the module doc."""
    best: tuple[int, int] | None = None
    chosen = None
    for group in dict.fromkeys(s.group for s in steps):
        members = [s for s in steps if s.group == group]
        if not _hostable(members, gpu_available) or (named is not None and group not in named):
            continue
        inside = sum(1 for _, i, j in pairs if steps[i].group == group == steps[j].group)
        score = (inside, len(members))
        if inside and (best is None or score > best):
            best, chosen = score, group
    return chosen


def _hostable(members: list[PlacedStep], gpu_available: bool) -> bool:
    devices = {s.device for s in members}
    if "model" in devices:
        return False
    return gpu_available or not any(d.startswith("gpu") for d in devices)


def _edge(tensor: str, producer: PlacedStep, consumer: PlacedStep, hosted: str | None) -> Edge:
    inside = hosted is not None and producer.group == consumer.group == hosted
    return Edge(
        tensor, producer.model_name, consumer.model_name, Route.IN_PROCESS if inside else Route.REPLICA
    )


def _route_words(edge: Edge, steps: Mapping[str, PlacedStep]) -> str:
    words = _ROUTE_WORDS[edge.route]
    ends = (steps.get(edge.producer), steps.get(edge.consumer))
    if edge.route is Route.REPLICA and any(s is not None and s.device.startswith("gpu") for s in ends):
        words += ", copied off and onto the GPU"
    return words


def describe_placement(placement: EnsemblePlacement) -> list[str]:
    """Lines for the validate command: the groups, and the route of every tensor between steps."""
    lines = [f"ensemble '{placement.ensemble}': placement {placement.mode}"]
    for group, steps in placement.groups().items():
        members = ", ".join(f"{s.model_name} v{s.version}" for s in steps)
        devices = ",".join(sorted({s.device for s in steps}))
        lines.append(f"  group '{group}' on {devices}: {members}")
    if placement.hosted is None:
        lines.append("  the ensemble's replica hosts no group: every step runs on its model's deployment")
    elif len(placement.groups()) == 1:
        lines.append(f"  the ensemble's replica hosts group '{placement.hosted}': every step runs in it")
    else:
        lines.append(
            f"  the ensemble's replica hosts group '{placement.hosted}'; "
            "the other steps run on their models' deployments"
        )
    placed = {s.model_name: s for s in placement.steps}
    for edge in placement.edges:
        lines.append(f"  {edge.producer} -> {edge.consumer}: '{edge.tensor}' {_route_words(edge, placed)}")
    return lines
