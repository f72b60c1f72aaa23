"""Triton's rules for ensembles: how tensors flow between steps, and the models the steps name."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

from repository_loader.datatypes import wire_to_config
from repository_loader.findings import Findings
from repository_loader.model import ModelDescription
from repository_loader.proto import model_config_pb2 as pb

_WHERE = "ensemble_scheduling"
Node = TypeVar("Node", bound=Hashable)
Steps = Sequence[pb.ModelEnsembling.Step]


def check_ensemble_flow(config: pb.ModelConfig, findings: Findings) -> None:
    """Within one ensemble: every tensor a step reads exists, and the steps form no cycle."""
    steps = config.ensemble_scheduling.step
    inputs = {t.name for t in config.input}
    producers = _producers(steps, inputs, findings)
    consumed: set[str] = set()
    for index, step in enumerate(steps):
        where = f"{_WHERE}.step[{index}] '{step.model_name}'"
        if not step.model_name:
            findings.add(f"{_WHERE}.step[{index}].model_name", "must not be empty")
        if not step.input_map:
            findings.add(f"{where}.input_map", "must map at least one input")
        if not step.output_map:
            findings.add(f"{where}.output_map", "must map at least one output")
        for tensor in step.input_map.values():
            consumed.add(tensor)
            if tensor not in inputs and tensor not in producers:
                findings.add(
                    f"{where}.input_map",
                    f"tensor '{tensor}' is neither an ensemble input nor an output of any step",
                )
    for output in config.output:
        if output.name not in producers:
            findings.add("output", f"ensemble output '{output.name}' is not produced by any step")
    for name in sorted(inputs - consumed):
        findings.add("input", f"ensemble input '{name}' is not used by any step")
    cycle = _step_cycle(steps, producers)
    if cycle:
        names = " -> ".join(f"step[{i}] '{steps[i].model_name}'" for i in cycle)
        findings.add(f"{_WHERE}.step", f"the steps form a cycle through their tensors: {names}")


def _producers(steps: Steps, inputs: set[str], findings: Findings) -> dict[str, int]:
    """Ensemble tensor -> index of the step that writes it."""
    producers: dict[str, int] = {}
    for index, step in enumerate(steps):
        for tensor in step.output_map.values():
            where = f"{_WHERE}.step[{index}] '{step.model_name}'.output_map"
            if tensor in inputs:
                findings.add(where, f"tensor '{tensor}' is an ensemble input; a step cannot write it")
            elif tensor in producers:
                findings.add(where, f"tensor '{tensor}' is already written by step[{producers[tensor]}]")
            else:
                producers[tensor] = index
    return producers


def _step_cycle(steps: Steps, producers: Mapping[str, int]) -> list[int]:
    """Step indices along a cycle of the step graph, or an empty list."""
    edges: dict[int, set[int]] = defaultdict(set)
    for index, step in enumerate(steps):
        for tensor in step.input_map.values():
            if tensor in producers:
                edges[producers[tensor]].add(index)
    return find_cycle(edges)


def find_cycle(edges: Mapping[Node, set[Node]]) -> list[Node]:
    """A cycle of the directed graph ``edges`` (node -> successors) as a node list, or []."""
    state: dict[Node, int] = {}  # 1 = on the current path, 2 = done
    path: list[Node] = []

    def visit(node: Node) -> list[Node]:
        state[node] = 1
        path.append(node)
        for succ in sorted(edges.get(node, set()), key=str):
            if state.get(succ) == 1:
                return [*path[path.index(succ) :], succ]
            if succ not in state:
                found = visit(succ)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return []

    for node in sorted(edges, key=str):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def check_ensemble_members(
    config: pb.ModelConfig,
    findings: Findings,
    models: Mapping[str, ModelDescription],
    failed: Mapping[str, list[str]],
    pending: frozenset[str] | set[str] = frozenset(),
) -> None:
    """Each step names a model of the repository whose tensors match the step's maps.

    Models in ``pending`` are still being loaded (a cycle, reported elsewhere) and are skipped.
    """
    inputs = {t.name: t for t in config.input}
    outputs = {t.name: t for t in config.output}
    for index, step in enumerate(config.ensemble_scheduling.step):
        where = f"{_WHERE}.step[{index}] '{step.model_name}'"
        if step.model_name == config.name:
            findings.add(f"{where}.model_name", "an ensemble cannot name itself as a step")
            continue
        if step.model_name in pending:
            continue
        member = models.get(step.model_name)
        if member is None:
            if step.model_name in failed:
                findings.add(
                    f"{where}.model_name", f"model '{step.model_name}' is not available (it failed to load)"
                )
            else:
                findings.add(f"{where}.model_name", f"model '{step.model_name}' is not in the repository")
            continue
        if step.model_version not in (-1, 0) and step.model_version not in member.versions:
            findings.add(
                f"{where}.model_version",
                f"version {step.model_version} of '{member.name}' is not served (versions {list(member.versions)})",
            )
        _check_step_inputs(step, member, inputs, f"{where}.input_map", findings)
        _check_step_outputs(step, member, outputs, f"{where}.output_map", findings)


def _check_step_inputs(
    step: pb.ModelEnsembling.Step,
    member: ModelDescription,
    ensemble_inputs: Mapping[str, pb.ModelInput],
    where: str,
    findings: Findings,
) -> None:
    for model_input, tensor in step.input_map.items():
        spec = member.input(model_input)
        if spec is None:
            findings.add(where, f"'{model_input}' is not an input of model '{member.name}'")
            continue
        source = ensemble_inputs.get(tensor)
        if source is not None and pb.DataType.Name(source.data_type) != _config_type(spec.datatype):
            findings.add(
                where,
                f"ensemble input '{tensor}' is {pb.DataType.Name(source.data_type)} but input '{model_input}' "
                f"of model '{member.name}' is {_config_type(spec.datatype)}",
            )
    for spec in member.inputs:
        if not spec.optional and spec.name not in step.input_map:
            findings.add(where, f"required input '{spec.name}' of model '{member.name}' is not mapped")


def _check_step_outputs(
    step: pb.ModelEnsembling.Step,
    member: ModelDescription,
    ensemble_outputs: Mapping[str, pb.ModelOutput],
    where: str,
    findings: Findings,
) -> None:
    for model_output, tensor in step.output_map.items():
        spec = member.output(model_output)
        if spec is None:
            findings.add(where, f"'{model_output}' is not an output of model '{member.name}'")
            continue
        target = ensemble_outputs.get(tensor)
        if target is not None and pb.DataType.Name(target.data_type) != _config_type(spec.datatype):
            findings.add(
                where,
                f"ensemble output '{tensor}' is {pb.DataType.Name(target.data_type)} but output "
                f"'{model_output}' of model '{member.name}' is {_config_type(spec.datatype)}",
            )


def _config_type(wire: str) -> str:
    return wire_to_config(wire)
