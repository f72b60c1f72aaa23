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
    placement = choose_placement(pipeline())
    assert placement.mode == "colocate"
    assert {g: [s.model_name for s in steps] for g, steps in placement.groups().items()} == {
        "cpu": ["pre", "label"],
        "gpu": ["net", "post"],
    }
    assert routes(placement) == {"a": Route.HOST, "b": Route.IN_PROCESS, "c": Route.HOST}


def test_separate_puts_each_model_alone_and_gpu_tensors_go_through_ipc() -> None:
    placement = choose_placement(pipeline({"placement": "separate"}))
    assert sorted(placement.groups()) == ["label", "net", "post", "pre"]
    assert routes(placement)["b"] is Route.CUDA_IPC


def test_per_model_override() -> None:
    placement = choose_placement(pipeline({"placement.pre": "gpu", "placement.label": "gpu"}))
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
    assert routes(placement)["b"] is Route.CUDA_IPC


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
    placement = choose_placement(build_graph(outer, table))
    assert [s.model_name for s in placement.steps] == ["pre", "net", "post", "label"]
    assert [s.path for s in placement.steps] == ["outer", "outer/core", "outer/core", "outer"]
    edges = {(e.producer, e.consumer): (e.tensor, e.route) for e in placement.edges}
    assert edges == {
        ("pre", "net"): ("a", Route.HOST),
        ("net", "post"): ("outer/core/m", Route.IN_PROCESS),
        ("post", "label"): ("b", Route.HOST),
    }


def test_description_names_groups_and_routes() -> None:
    lines = describe_placement(choose_placement(pipeline()))
    assert lines[0] == "ensemble 'pipe': placement colocate"
    assert "  group 'gpu' on gpu: net v1, post v1" in lines
    assert "  group 'cpu' on cpu: pre v1, label v1" in lines
    assert "  net -> post: 'b' in process (DLPack, zero copy)" in lines
    assert "  pre -> net: 'a' object store (host memory)" in lines
