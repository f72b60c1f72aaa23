"""Choosing where ensemble steps run and how tensors travel between them."""

from __future__ import annotations

import pytest

from ensembles.graph import EnsembleGraph, build_graph
from ensembles.handoff import Route
from ensembles.placement import choose_placement, describe_placement, model_device
from repository_loader.errors import ConfigError
from repository_loader.model import InstanceGroup, InstanceKind
from tests.ensembles.helpers import ensemble, model, step

V = ("FP32", (4,))


def gpu(count: int = 1, gpus: tuple[int, ...] = ()) -> tuple[InstanceGroup, ...]:
    return (InstanceGroup("g", InstanceKind.GPU, count, gpus),)


def cpu() -> tuple[InstanceGroup, ...]:
    return (InstanceGroup("c", InstanceKind.CPU, 1),)


MODELS = {
    "pre": model("pre", [("X", *V)], [("Y", *V)], instance_groups=cpu()),
    "net": model("net", [("X", *V)], [("Y", *V)], backend="onnxruntime", instance_groups=gpu()),
    "post": model("post", [("X", *V)], [("Y", *V)], backend="pytorch", instance_groups=gpu()),
    "label": model("label", [("X", *V)], [("Y", *V)], instance_groups=cpu()),
}


def pipeline(parameters: dict[str, str] | None = None, name: str = "pipe") -> EnsembleGraph:
    ens = ensemble(
        name,
        [("IN", *V)],
        [("OUT", *V)],
        [
            step("pre", {"X": "IN"}, {"Y": "a"}),
            step("net", {"X": "a"}, {"Y": "b"}),
            step("post", {"X": "b"}, {"Y": "c"}),
            step("label", {"X": "c"}, {"Y": "OUT"}),
        ],
        parameters=parameters,
    )
    return build_graph(ens, MODELS)


def routes(placement) -> dict[str, Route]:
    return {e.tensor: e.route for e in placement.edges}


def test_default_colocates_models_on_the_same_device() -> None:
    placement = choose_placement(pipeline(), gpu_available=True)
    assert placement.mode == "colocate"
    assert {g: [s.model_name for s in steps] for g, steps in placement.groups().items()} == {
        "cpu": ["pre", "label"],
        "gpu": ["net", "post"],
    }
    assert placement.hosted == "gpu"
    assert placement.hosted_models() == {"net": "gpu", "post": "gpu"}
    assert routes(placement) == {"a": Route.REPLICA, "b": Route.IN_PROCESS, "c": Route.REPLICA}


def test_a_replica_without_gpu_hosts_no_gpu_group() -> None:
    """The GPU group stays on its deployments; the CPU group passes no tensor inside, so nothing is hosted."""
    placement = choose_placement(pipeline())
    assert placement.hosted is None and placement.hosted_models() == {}
    assert Route.IN_PROCESS not in routes(placement).values()
    assert routes(placement)["b"] is Route.REPLICA


def _two_chains(gpu_steps: int, cpu_steps: int, parameters: dict[str, str] | None = None) -> EnsembleGraph:
    """A chain of ``gpu_steps`` GPU models, then one of ``cpu_steps`` CPU models, both reading IN."""
    table = {
        f"g{i}": model(f"g{i}", [("X", *V)], [("Y", *V)], instance_groups=gpu()) for i in range(gpu_steps)
    }
    table.update(
        {f"c{i}": model(f"c{i}", [("X", *V)], [("Y", *V)], instance_groups=cpu()) for i in range(cpu_steps)}
    )
    steps = []
    for prefix, count in (("g", gpu_steps), ("c", cpu_steps)):
        for i in range(count):
            source = "IN" if i == 0 else f"{prefix}{i - 1}_out"
            steps.append(step(f"{prefix}{i}", {"X": source}, {"Y": f"{prefix}{i}_out"}))
    outputs = [(f"g{gpu_steps - 1}_out", *V), (f"c{cpu_steps - 1}_out", *V)]
    return build_graph(ensemble("chains", [("IN", *V)], outputs, steps, parameters=parameters), table)


def test_hosted_group_has_the_most_tensors_inside() -> None:
    assert choose_placement(_two_chains(2, 3), gpu_available=True).hosted == "cpu"
    assert choose_placement(_two_chains(3, 2), gpu_available=True).hosted == "gpu"
    assert choose_placement(_two_chains(3, 2)).hosted == "cpu"  # no GPU in the ensemble's replica


def test_hosted_group_ties_go_to_the_most_steps() -> None:
    """net -> post and pre -> label each pass one tensor inside; the CPU group has a third step."""
    table = dict(MODELS, extra=model("extra", [("X", *V)], [("Y", *V)], instance_groups=cpu()))
    ens = ensemble(
        "tie",
        [("IN", *V)],
        [("P", *V), ("L", *V), ("E", *V)],
        [
            step("net", {"X": "IN"}, {"Y": "n"}),
            step("post", {"X": "n"}, {"Y": "P"}),
            step("pre", {"X": "IN"}, {"Y": "a"}),
            step("label", {"X": "a"}, {"Y": "L"}),
            step("extra", {"X": "IN"}, {"Y": "E"}),
        ],
    )
    assert choose_placement(build_graph(ens, table), gpu_available=True).hosted == "cpu"
    tied = choose_placement(_two_chains(2, 2), gpu_available=True)
    assert tied.hosted == "gpu"  # equal tensors and steps: the first group


def test_a_group_with_a_model_that_places_itself_is_never_hosted() -> None:
    table = dict(MODELS)
    table["post"] = model(
        "post", [("X", *V)], [("Y", *V)], instance_groups=(InstanceGroup("m", InstanceKind.MODEL, 1),)
    )
    graph = build_graph(pipeline().ensemble, table)
    placement = choose_placement(graph, gpu_available=True)
    assert placement.group_of("post") == "post" and placement.hosted is None
    joined = build_graph(pipeline({"placement.post": "gpu"}).ensemble, table)
    assert choose_placement(joined, gpu_available=True).hosted is None


def test_separate_hosts_only_groups_the_parameters_name() -> None:
    assert choose_placement(pipeline({"placement": "separate"}), gpu_available=True).hosted is None
    named = {"placement": "separate", "placement.net": "pair", "placement.post": "pair"}
    placement = choose_placement(pipeline(named), gpu_available=True)
    assert placement.hosted == "pair"
    assert routes(placement) == {"a": Route.REPLICA, "b": Route.IN_PROCESS, "c": Route.REPLICA}


def test_separate_puts_each_model_alone_and_gpu_tensors_go_over_http() -> None:
    placement = choose_placement(pipeline({"placement": "separate"}))
    assert sorted(placement.groups()) == ["label", "net", "post", "pre"]
    assert routes(placement)["b"] is Route.REPLICA


def test_per_model_override() -> None:
    placement = choose_placement(
        pipeline({"placement.pre": "gpu", "placement.label": "gpu"}), gpu_available=True
    )
    assert [s.model_name for s in placement.groups()["gpu"]] == ["pre", "net", "post", "label"]
    assert set(routes(placement).values()) == {Route.IN_PROCESS}


def test_plan_devices_and_auto_kind() -> None:
    auto = model("auto", [("X", *V)], [("Y", *V)], backend="onnxruntime")
    assert model_device(auto) == "cpu"
    assert model_device(auto, gpu_available=True) == "gpu"
    assert model_device(MODELS["pre"], gpu_available=True) == "cpu"
    assert model_device(model("m", [], [], instance_groups=gpu(2, (1, 0)))) == "gpu:0,1"
    placement = choose_placement(pipeline(), devices={"net": "gpu:1"})
    assert placement.group_of("net") == "gpu:1" and placement.group_of("post") == "gpu"
    assert routes(placement)["b"] is Route.REPLICA


def test_bad_parameters() -> None:
    with pytest.raises(
        ConfigError, match="parameter 'placement' is 'spread'; expected one of colocate, separate"
    ):
        choose_placement(pipeline({"placement": "spread"}))
    with pytest.raises(
        ConfigError, match="parameter 'placement.ghost' names model 'ghost', which is not a step"
    ):
        choose_placement(pipeline({"placement.ghost": "x"}))


def test_nested_ensembles_are_flattened() -> None:
    table = dict(MODELS)
    table["core"] = ensemble(
        "core",
        [("I", *V)],
        [("O", *V)],
        [step("net", {"X": "I"}, {"Y": "m"}), step("post", {"X": "m"}, {"Y": "O"})],
    )
    outer = ensemble(
        "outer",
        [("IN", *V)],
        [("OUT", *V)],
        [
            step("pre", {"X": "IN"}, {"Y": "a"}),
            step("core", {"I": "a"}, {"O": "b"}),
            step("label", {"X": "b"}, {"Y": "OUT"}),
        ],
    )
    placement = choose_placement(build_graph(outer, table), gpu_available=True)
    assert [s.model_name for s in placement.steps] == ["pre", "net", "post", "label"]
    assert [s.path for s in placement.steps] == ["outer", "outer/core", "outer/core", "outer"]
    edges = {(e.producer, e.consumer): (e.tensor, e.route) for e in placement.edges}
    assert edges == {
        ("pre", "net"): ("a", Route.REPLICA),
        ("net", "post"): ("outer/core/m", Route.IN_PROCESS),
        ("post", "label"): ("b", Route.REPLICA),
    }


def test_description_names_groups_and_routes() -> None:
    lines = describe_placement(choose_placement(pipeline(), gpu_available=True))
    assert lines[0] == "ensemble 'pipe': placement colocate"
    assert "  group 'gpu' on gpu: net v1, post v1" in lines
    assert "  group 'cpu' on cpu: pre v1, label v1" in lines
    assert "  net -> post: 'b' in process (DLPack, zero copy)" in lines
    # what serving does: a step off the ensemble's replica gets its tensors over HTTP
    assert (
        "  pre -> net: 'a' over HTTP between replicas (binary, host memory), copied off and onto the GPU"
        in lines
    )
    assert (
        "  the ensemble's replica hosts group 'gpu'; the other steps run on their models' deployments"
        in lines
    )
    alone = describe_placement(choose_placement(pipeline({"placement": "separate"})))
    assert "  the ensemble's replica hosts no group: every step runs on its model's deployment" in alone


def test_json_form() -> None:
    report = choose_placement(pipeline(), gpu_available=True).to_dict()
    assert report["mode"] == "colocate" and report["hosted_group"] == "gpu"
    gpu_group = next(g for g in report["groups"] if g["name"] == "gpu")
    assert gpu_group["hosted"] is True and gpu_group["devices"] == ["gpu"]
    assert [s["model"] for s in gpu_group["steps"]] == ["net", "post"]
    assert {"tensor": "b", "producer": "net", "consumer": "post", "route": "in_process"} in report["edges"]
