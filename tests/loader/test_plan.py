"""The deployment plan, computed from descriptions alone (no Ray)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from repository_loader.model import (
    DynamicBatching,
    EnsembleStep,
    InstanceGroup,
    InstanceKind,
    ModelDescription,
    TensorSpec,
)
from repository_loader.plan import (
    CONTROL_APP_CPUS,
    MIN_CPU_SHARE,
    MIN_ONGOING_REQUESTS,
    SCALE_HEADROOM,
    ClusterResources,
    cpu_share,
    is_group_app,
    keep_shares,
    plan_deployments,
    within_cpus,
)


def _model(
    name: str,
    groups: tuple[InstanceGroup, ...] = (),
    *,
    backend: str = "onnxruntime",
    platform: str = "onnxruntime_onnx",
    versions: tuple[int, ...] = (1,),
    max_batch_size: int = 8,
) -> ModelDescription:
    spec = TensorSpec("x", "FP32", (4,))
    return ModelDescription(
        name=name,
        path=Path("/repo") / name,
        platform=platform,
        backend=backend,
        max_batch_size=max_batch_size,
        inputs=(spec,),
        outputs=(spec,),
        versions=versions,
        instance_groups=groups,
        dynamic_batching=DynamicBatching(preferred_batch_size=(4,), max_queue_delay_microseconds=100),
    )


def test_gpu_group_spreads_count_over_each_gpu() -> None:
    model = _model("m", (InstanceGroup("g", InstanceKind.GPU, 2),))
    (entry,) = plan_deployments({"m": model}, ClusterResources(num_cpus=8, num_gpus=2)).entries
    assert entry.num_replicas == 4
    assert entry.resources.num_gpus == 0.5
    assert entry.replica_gpu_ids == (0, 0, 1, 1)
    assert entry.kind == "KIND_GPU"


def test_gpu_group_on_named_gpus() -> None:
    model = _model("m", (InstanceGroup("g", InstanceKind.GPU, 1, gpus=(1,)),))
    (entry,) = plan_deployments({"m": model}, ClusterResources(8, 2)).entries
    assert entry.num_replicas == 1 and entry.replica_gpu_ids == (1,) and entry.resources.num_gpus == 1.0


def test_gpu_group_on_missing_gpu_is_a_problem() -> None:
    model = _model("m", (InstanceGroup("g", InstanceKind.GPU, 1, gpus=(3,)),))
    plan = plan_deployments({"m": model}, ClusterResources(8, 2))
    assert plan.entries == () and "GPU(s) [3] do not exist" in plan.problems["m"][0]
    plan = plan_deployments(
        {"m": _model("m", (InstanceGroup("g", InstanceKind.GPU, 1),))}, ClusterResources(8, 0)
    )
    assert "the cluster has none" in plan.problems["m"][0]


def test_cpu_group_and_shares_that_fit_two_cores() -> None:
    models = {
        "a": _model("a", (InstanceGroup("a_0", InstanceKind.CPU, 3),)),
        "b": _model("b", (InstanceGroup("b_0", InstanceKind.CPU, 2),)),
    }
    plan = plan_deployments(models, ClusterResources(num_cpus=2, num_gpus=0))
    assert [e.num_replicas for e in plan.entries] == [3, 2]
    assert all(e.resources.num_gpus == 0 for e in plan.entries)
    assert plan.total_cpus <= (2 - CONTROL_APP_CPUS) / SCALE_HEADROOM
    assert plan.entries[0].resources.num_cpus == pytest.approx(0.19)  # 1.9 CPUs for 2 x 5 replicas


def test_a_model_loaded_later_fits_in_the_cpus_the_running_ones_left() -> None:
    running = plan_deployments(
        {"a": _model("a", (InstanceGroup("a_0", InstanceKind.CPU, 2),))}, ClusterResources(2)
    )
    assert running.total_cpus == pytest.approx(0.94)  # 0.47 each: room for 2 more beside the server app
    later = plan_deployments(
        {"a": _model("a", (InstanceGroup("a_0", InstanceKind.CPU, 2),)), "b": _model("b")},
        ClusterResources(2),
    ).for_model("b")
    assert later[0].resources.num_cpus == pytest.approx(0.23)  # what a fresh plan of both gives it
    fitted = within_cpus(later, 2 - CONTROL_APP_CPUS - 2 * running.total_cpus)  # a as if doubled
    assert [e.resources.num_cpus for e in fitted] == [0.01] * len(later)
    assert within_cpus(later, 0.0)[0].resources.num_cpus == MIN_CPU_SHARE
    half = within_cpus(later, 0.5)  # room for twice its two replicas at 0.12
    assert [e.resources.num_cpus for e in half] == [0.12]
    assert fitted[0].serve_options()["ray_actor_options"]["num_cpus"] == MIN_CPU_SHARE
    roomy = within_cpus(later, 10.0)  # room enough: the share is kept
    assert roomy == later


def test_cpu_share_is_capped_at_one() -> None:
    assert cpu_share(64, 3) == 1.0
    assert cpu_share(2, 100) == 0.01


def test_auto_kind_follows_the_cluster() -> None:
    model = _model("m", (InstanceGroup("g", InstanceKind.AUTO, 1),))
    assert plan_deployments({"m": model}, ClusterResources(4, 1)).entries[0].kind == "KIND_GPU"
    assert plan_deployments({"m": model}, ClusterResources(4, 0)).entries[0].kind == "KIND_CPU"


def test_default_instances_follow_triton() -> None:
    onnx = _model("onnx")
    python = _model("py", backend="python", platform="")
    on_gpus = plan_deployments({"onnx": onnx}, ClusterResources(8, 2)).entries[0]
    assert (on_gpus.kind, on_gpus.num_replicas, on_gpus.replica_gpu_ids) == ("KIND_GPU", 2, (0, 1))
    cpu_only = plan_deployments({"onnx": onnx, "py": python}, ClusterResources(8, 0))
    assert [(e.model, e.kind, e.num_replicas) for e in cpu_only.entries] == [
        ("onnx", "KIND_CPU", 2),
        ("py", "KIND_CPU", 1),
    ]


def test_model_kind_reserves_no_gpu() -> None:
    model = _model("m", (InstanceGroup("g", InstanceKind.MODEL, 2),))
    (entry,) = plan_deployments({"m": model}, ClusterResources(4, 1)).entries
    assert (entry.kind, entry.num_replicas, entry.resources.num_gpus) == ("KIND_MODEL", 2, 0.0)


def test_one_entry_per_instance_group_each_with_its_own_kind_and_resources() -> None:
    groups = (InstanceGroup("cpu", InstanceKind.CPU, 2), InstanceGroup("gpu", InstanceKind.GPU, 1))
    model = _model("m", groups, versions=(1, 2))
    plan = plan_deployments({"m": model}, ClusterResources(8, 1))
    cpu, gpu = plan.entries
    assert plan.for_model("m") == (cpu, gpu) and plan.entry("m") == cpu
    assert cpu.versions == gpu.versions == (1, 2) and cpu.version == 2
    assert [(e.group, e.group_index, e.kind) for e in plan.entries] == [
        ("cpu", 0, "KIND_CPU"),
        ("gpu", 1, "KIND_GPU"),
    ]
    # each group: its own count, resources and GPUs
    assert (cpu.num_replicas, gpu.num_replicas) == (2, 1)
    assert cpu.ray_actor_options == {"num_cpus": cpu.resources.num_cpus, "num_gpus": 0.0}
    assert gpu.ray_actor_options == {"num_cpus": gpu.resources.num_cpus, "num_gpus": 1.0}
    assert [(r.group, r.gpu) for r in cpu.replicas] == [("cpu", None), ("cpu", None)]
    assert [(r.group, r.gpu) for r in gpu.replicas] == [("gpu", 0)]
    assert (cpu.replica_gpu_ids, gpu.replica_gpu_ids) == ((), (0,))
    # ranked over the model's replicas of every group
    assert [(e.rank_offset, e.model_replicas) for e in plan.entries] == [(0, 3), (2, 3)]
    assert cpu.init_kwargs == {
        "instance_kind": "KIND_CPU",
        "replicas": 3,
        "rank_offset": 0,
        "gpu_ids": [None, None],
        "group_index": 0,
        "passive": False,
    }
    assert gpu.init_kwargs == {
        "instance_kind": "KIND_GPU",
        "replicas": 3,
        "rank_offset": 2,
        "gpu_ids": [0],
        "group_index": 1,
        "passive": False,
    }
    # group 0 is the model's own application and route; the others have their own, off the model's
    assert (cpu.app_name, cpu.route_prefix, cpu.deployment_name) == ("model-m", "/v2/models/m", "model")
    assert (gpu.app_name, gpu.route_prefix, gpu.deployment_name) == (
        "model-m--group-1",
        "/v2/-/instance-groups/model-m--group-1",
        "model",
    )
    assert gpu.serve_options()["num_replicas"] == 1
    assert plan.total_cpus == pytest.approx(3 * cpu.resources.num_cpus) and plan.total_gpus == 1.0
    data = gpu.to_dict()
    assert (data["group"], data["group_index"], data["rank_offset"], data["model_replicas"]) == (
        "gpu",
        1,
        2,
        3,
    )


def test_a_passive_group_is_deployed_after_the_others_unranked_and_off_the_models_route() -> None:
    groups = (
        InstanceGroup("idle", InstanceKind.CPU, 2, passive=True),
        InstanceGroup("a", InstanceKind.CPU, 1),
        InstanceGroup("b", InstanceKind.CPU, 2),
    )
    plan = plan_deployments({"m": _model("m", groups)}, ClusterResources(8, 0))
    a, b, idle = plan.for_model("m")
    assert [(e.group, e.group_index, e.passive) for e in (a, b, idle)] == [
        ("a", 1, False),
        ("b", 2, False),
        ("idle", 0, True),
    ]
    # the first group that takes requests holds the model's route; the passive one is loaded apart
    assert plan.entry("m") == a and (a.app_name, a.route_prefix) == ("model-m", "/v2/models/m")
    assert b.app_name == "model-m--group-1"
    assert idle.app_name == "model-m--passive-2" and idle.route_prefix.endswith("/model-m--passive-2")
    assert is_group_app(idle.app_name, "m") and not is_group_app(idle.app_name, "n")
    # sequences are owned by the replicas that take requests only
    assert [(e.rank_offset, e.model_replicas) for e in (a, b, idle)] == [(0, 3), (1, 3), (0, 3)]
    assert idle.init_kwargs["passive"] and idle.init_kwargs["group_index"] == 0
    assert idle.num_replicas == 2  # loaded as Triton loads it


def test_a_model_whose_groups_are_all_passive_keeps_its_own_application() -> None:
    groups = (
        InstanceGroup("p", InstanceKind.CPU, 1, passive=True),
        InstanceGroup("q", InstanceKind.CPU, 1, passive=True),
    )
    plan = plan_deployments({"m": _model("m", groups)}, ClusterResources(8, 0))
    p, q = plan.for_model("m")
    assert (p.app_name, p.passive, q.app_name, q.passive) == ("model-m", True, "model-m--passive-1", True)
    assert plan.entry("m") == p


def test_autoscaling_goes_to_the_first_group_that_takes_requests() -> None:
    groups = (
        InstanceGroup("idle", InstanceKind.CPU, 1, passive=True),
        InstanceGroup("a", InstanceKind.CPU, 1),
    )
    model = replace(
        _model("m", groups),
        parameters={"ray.autoscaling.min_replicas": "1", "ray.autoscaling.max_replicas": "3"},
    )
    a, idle = plan_deployments({"m": model}, ClusterResources(8, 0)).for_model("m")
    assert a.autoscaling is not None and idle.autoscaling is None


def test_cpu_shares_count_every_replica_of_every_group() -> None:
    groups = (InstanceGroup("a", InstanceKind.CPU, 2), InstanceGroup("b", InstanceKind.CPU, 3))
    plan = plan_deployments({"m": _model("m", groups)}, ClusterResources(2, 0))
    assert [e.num_replicas for e in plan.entries] == [2, 3]
    assert {e.resources.num_cpus for e in plan.entries} == {cpu_share(2, SCALE_HEADROOM * 5)}
    assert plan.total_cpus <= 2 - CONTROL_APP_CPUS


def test_gpu_groups_of_one_model_keep_their_gpus_and_ranks() -> None:
    groups = (
        InstanceGroup("first", InstanceKind.GPU, 2, gpus=(1,)),
        InstanceGroup("second", InstanceKind.GPU, 1, gpus=(0, 1)),
    )
    first, second = plan_deployments({"m": _model("m", groups)}, ClusterResources(8, 2)).entries
    assert (first.replica_gpu_ids, second.replica_gpu_ids) == ((1, 1), (0, 1))
    assert (first.rank_offset, second.rank_offset) == (0, 2)
    assert first.init_kwargs["gpu_ids"] == [1, 1] and second.init_kwargs["gpu_ids"] == [0, 1]
    # GPU 1 is asked for by three replicas: their fractions are scaled to fit it
    assert 2 * first.resources.num_gpus + second.resources.num_gpus <= 1.0
    assert second.app_name == "model-m--group-1"


def test_a_group_application_that_is_another_models_own_is_refused() -> None:
    groups = (InstanceGroup("a", InstanceKind.CPU, 1), InstanceGroup("b", InstanceKind.CPU, 1))
    models = {"x": _model("x", groups), "x--group-1": _model("x--group-1"), "y": _model("y", groups)}
    plan = plan_deployments(models, ClusterResources(4, 0))
    assert sorted(plan.problems) == ["x", "x--group-1"]
    assert "'model-x--group-1' is also that of model 'x--group-1'" in plan.problems["x"][0]
    assert [e.app_name for e in plan.entries] == ["model-y", "model-y--group-1"]


def test_entry_is_the_serve_deployment_spec() -> None:
    model = _model("m", (InstanceGroup("g", InstanceKind.GPU, 2),))
    (entry,) = plan_deployments({"m": model}, ClusterResources(num_cpus=8, num_gpus=2)).entries
    assert entry.serve_options() == {
        "name": "model",
        "num_replicas": 4,
        "max_ongoing_requests": entry.max_ongoing_requests,
        "ray_actor_options": {"num_cpus": entry.resources.num_cpus, "num_gpus": 0.5},
    }
    assert entry.init_kwargs == {
        "instance_kind": "KIND_GPU",
        "replicas": 4,
        "rank_offset": 0,
        "gpu_ids": [0, 0, 1, 1],
        "group_index": 0,
        "passive": False,
    }
    data = entry.to_dict()
    assert data["app_name"] == "model-m" and data["replica_groups"] == ["g"] * 4
    assert data["versions"] == [1] and data["replica_gpu_ids"] == [0, 0, 1, 1]
    assert (data["group"], data["group_index"], data["rank_offset"], data["model_replicas"]) == ("g", 0, 0, 4)


def test_ensemble_entry_runs_as_a_cpu_replica() -> None:
    (entry,) = plan_deployments(
        {"e": _model("e", backend="", platform="ensemble")}, ClusterResources(4, 1)
    ).entries
    assert entry.kind == "ensemble" and entry.init_kwargs["instance_kind"] == "KIND_CPU"
    assert entry.init_kwargs["gpu_ids"] == [None] and entry.resources.num_gpus == 0.0


def _ensemble_of(*steps: str, parameters: dict[str, str] | None = None) -> ModelDescription:
    return replace(
        _model("e", backend="", platform="ensemble"),
        ensemble_steps=tuple(EnsembleStep(name) for name in steps),
        parameters=parameters or {},
    )


def test_an_ensemble_of_gpu_steps_takes_a_share_of_their_gpu_to_run_them_in_process() -> None:
    gpu = (InstanceGroup("g", InstanceKind.GPU, 1, gpus=(1,)),)
    cpu = (InstanceGroup("c", InstanceKind.CPU, 1),)
    models = {
        "e": _ensemble_of("pre", "net"),
        "pre": _model("pre", cpu),
        "net": _model("net", gpu),
    }
    plan = plan_deployments(models, ClusterResources(8, 2))
    ens = plan.entry("e")
    assert ens is not None and ens.kind == "ensemble"
    assert ens.init_kwargs["instance_kind"] == "KIND_GPU" and ens.init_kwargs["gpu_ids"] == [1]
    on_gpu1 = [e for e in plan.entries if 1 in e.replica_gpu_ids]
    assert {e.model for e in on_gpu1} == {"e", "net"}
    assert ens.resources.num_gpus > 0 and sum(e.resources.num_gpus for e in on_gpu1) <= 1.0


@pytest.mark.parametrize(
    ("steps", "parameters", "gpus"),
    [
        ((InstanceGroup("c", InstanceKind.CPU, 1),), {}, 1),  # no GPU step
        ((InstanceGroup("g", InstanceKind.GPU, 1),), {"placement": "separate"}, 1),  # steps on their own
        ((InstanceGroup("g", InstanceKind.GPU, 1),), {}, 0),  # no GPU in the cluster
        ((InstanceGroup("m", InstanceKind.MODEL, 1),), {}, 1),  # places itself
    ],
)
def test_an_ensemble_runs_on_the_cpu_where_no_step_of_it_would_run_on_its_gpu(
    steps: tuple[InstanceGroup, ...], parameters: dict[str, str], gpus: int
) -> None:
    models = {"e": _ensemble_of("net", parameters=parameters), "net": _model("net", steps)}
    ens = plan_deployments(models, ClusterResources(8, gpus)).entry("e")
    assert ens is not None and ens.init_kwargs["instance_kind"] == "KIND_CPU"
    assert ens.resources.num_gpus == 0.0 and ens.init_kwargs["gpu_ids"] == [None]


def test_a_nested_ensembles_gpu_step_gives_the_outer_ensemble_a_gpu() -> None:
    models = {
        "outer": replace(_ensemble_of("inner"), name="outer"),
        "inner": replace(_ensemble_of("net"), name="inner"),
        "net": _model("net", ()),  # no instance_group: ONNX runs on the GPU where the cluster has one
    }
    plan = plan_deployments(models, ClusterResources(8, 1))
    for name in ("outer", "inner"):
        entry = plan.entry(name)
        assert entry is not None and entry.init_kwargs["instance_kind"] == "KIND_GPU", name
    python_step = {**models, "net": _model("net", (), backend="python", platform="")}
    outer = plan_deployments(python_step, ClusterResources(8, 1)).entry("outer")
    assert outer is not None and outer.init_kwargs["instance_kind"] == "KIND_CPU"


def test_unsafe_model_names_get_safe_application_names() -> None:
    (entry,) = plan_deployments({"a/b": _model("a/b")}, ClusterResources(4, 0)).entries
    assert entry.app_name.startswith("model-a_b-") and entry.route_prefix == "/v2/models/a/b"


def test_cpus_kept_for_the_server_app_are_a_parameter() -> None:
    model = _model("m", (InstanceGroup("g", InstanceKind.CPU, 1),))
    (entry,) = plan_deployments({"m": model}, ClusterResources(2, 0), control_app_cpus=1.0).entries
    assert entry.resources.num_cpus == 0.5  # the one CPU left, for twice the one replica
    assert (
        plan_deployments({"m": model}, ClusterResources(2, 0)).entry("m")
        == plan_deployments({"m": model}, ClusterResources(2, 0)).entries[0]
    )


def test_gpu_fractions_aimed_at_one_gpu_are_scaled_to_fit() -> None:
    models = {n: _model(n, (InstanceGroup("g", InstanceKind.GPU, 1, gpus=(0,)),)) for n in ("a", "b", "c")}
    plan = plan_deployments(models, ClusterResources(8, 1))
    assert sum(e.resources.num_gpus * e.num_replicas for e in plan.entries) <= 1.0
    assert all(e.resources.num_gpus > 0 for e in plan.entries)


def test_tensorrt_needs_a_gpu() -> None:
    model = _model(
        "t", (InstanceGroup("g", InstanceKind.CPU, 1),), backend="tensorrt", platform="tensorrt_plan"
    )
    assert "run only on GPUs" in plan_deployments({"t": model}, ClusterResources(4, 1)).problems["t"][0]


def test_ensemble_is_its_own_entry_with_batching_and_routes() -> None:
    ensemble = _model("e", backend="", platform="ensemble")
    member = _model("m", (InstanceGroup("g", InstanceKind.CPU, 1),), max_batch_size=32)
    plan = plan_deployments({"e": ensemble, "m": member}, ClusterResources(4, 0))
    ens = plan.for_model("e")[0]
    assert ens.kind == "ensemble" and ens.num_replicas == 1 and ens.group == ""
    assert plan.for_model("e") == (ens,) and (ens.group_index, ens.app_name) == (0, "model-e")
    entry = plan.for_model("m")[0]
    assert entry.batching.max_batch_size == 32
    assert entry.batching.dynamic is not None and entry.batching.dynamic.preferred_batch_size == (4,)
    assert entry.max_ongoing_requests >= MIN_ONGOING_REQUESTS and entry.max_ongoing_requests >= 8 * 32
    data = plan.to_dict()
    assert data["entries"][1]["batching"]["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert data["entries"][1]["route_prefix"] == "/v2/models/m"


def test_plan_is_pure_and_frozen() -> None:
    model = _model("m")
    first = plan_deployments({"m": model}, ClusterResources(2, 0))
    assert first == plan_deployments({"m": model}, ClusterResources(2, 0))
    with pytest.raises(AttributeError):
        first.entries[0].num_replicas = 9  # type: ignore[misc]


def test_group_applications_are_told_apart_from_models() -> None:
    assert is_group_app("model-m--group-1", "m") and is_group_app("model-m--group-12")
    assert not is_group_app("model-m--group-1", "m--group-1") and not is_group_app("model-m", "m")
    assert not is_group_app("model-m--group-01") and not is_group_app("model-m--group-x")


# --- model hosts (docs/hosts.md) ------------------------------------------------------------------


def _python(name: str, groups: tuple[InstanceGroup, ...] = (), **parameters: str) -> ModelDescription:
    from dataclasses import replace

    return replace(_model(name, groups, backend="python", platform=""), parameters=parameters)


def test_without_hosts_every_model_has_its_own_deployment() -> None:
    plan = plan_deployments({"a": _python("a")}, ClusterResources(2))
    assert plan.pooled == () and plan.host is None and [e.model for e in plan.entries] == ["a"]


def test_with_hosts_a_model_that_needs_no_replica_of_its_own_is_pooled() -> None:
    from repository_loader.plan import HOST_APP, HOST_ROUTE, HostPolicy

    models = {
        "plain": _python("plain"),
        "one": _python("one", (InstanceGroup("g", InstanceKind.CPU, 1),)),
        "two": _python("two", (InstanceGroup("g", InstanceKind.CPU, 2),)),  # several instances
        "gpu": _python("gpu", (InstanceGroup("g", InstanceKind.GPU, 1),)),
        "asked": _python("asked", **{"ray.placement": "dedicated"}),
        "scaled": _python("scaled", **{"ray.autoscaling.max_replicas": "3"}),
    }
    plan = plan_deployments(models, ClusterResources(4, 1), hosts=HostPolicy(replicas=2, num_cpus=0.5))
    assert plan.pooled == ("one", "plain")
    assert {e.model for e in plan.entries} == {"two", "gpu", "asked", "scaled"}
    assert plan.host is not None and plan.host.app_name == HOST_APP and plan.host.route_prefix == HOST_ROUTE
    assert plan.host.num_replicas == 2 and plan.host.resources.num_cpus == 0.5
    # the hosts' CPUs are kept out of the dedicated replicas' shares, and every replica fits
    assert plan.total_cpus <= 4 - CONTROL_APP_CPUS


def test_an_ensemble_is_pooled_when_every_model_it_reaches_is_pooled() -> None:
    """Its host then runs every step in its own process; a step with a replica of its own (or a nested
    ensemble that is not pooled, or a step it does not know) keeps the ensemble's deployment."""
    from repository_loader.plan import HostPolicy, pooled
    from tests.ensembles.helpers import ensemble, step

    spec = [("X", "FP32", (1,))]

    def chain(name: str, *steps: str, **parameters: str) -> ModelDescription:
        named = [step(s, {"X": "X"}, {"Y": "Y"}) for s in steps]
        return ensemble(name, spec, spec, named, parameters=parameters)

    models = {
        "a": _python("a"),
        "b": _python("b"),
        "own": _python("own", (InstanceGroup("g", InstanceKind.CPU, 2),)),
        "all_pooled": chain("all_pooled", "a", "b"),
        "nested": chain("nested", "all_pooled", "a"),
        "with_own": chain("with_own", "a", "own"),
        "outer": chain("outer", "with_own"),  # its nested ensemble reaches "own"
        "unknown": chain("unknown", "a", "missing"),
        "kept": chain("kept", "a", **{"ray.placement": "dedicated"}),
    }
    plan = plan_deployments(models, ClusterResources(4), hosts=HostPolicy(replicas=1, num_cpus=0.25))
    assert plan.pooled == ("a", "all_pooled", "b", "nested")
    assert {e.model for e in plan.entries} == {"own", "with_own", "outer", "unknown", "kept"}
    # the same answer one model at a time, as the server asks it on each load
    policy = HostPolicy(replicas=1)
    assert pooled(models["nested"], policy, models) and not pooled(models["outer"], policy, models)
    assert not pooled(models["all_pooled"], policy)  # its steps unknown: kept
    decoupled = replace(models["all_pooled"], decoupled=True)
    assert not pooled(decoupled, policy, models)
    # with hosts for the models that ask, an ensemble that asks is pooled where its steps are
    asking = HostPolicy(replicas=1, placement="dedicated")
    pooled_steps = {n: _python(n, **{"ray.placement": "pooled"}) for n in ("a", "b")}
    asked = chain("asked", "a", "b", **{"ray.placement": "pooled"})
    assert pooled(asked, asking, {**pooled_steps, "asked": asked})
    assert not pooled(asked, asking, {"a": _python("a"), "b": _python("b"), "asked": asked})


def test_a_stateless_models_cpu_instances_are_pooled_as_one_model_that_runs_them_at_once() -> None:
    """ONNX Runtime and TorchScript: an ``instance_group`` of N CPU instances (ONNX Runtime's default is
    2) is pooled, and the host runs up to N of its batches at once; a Python model's instances each hold
    state, so several keep a deployment, as do several GPU instances."""
    from repository_loader.plan import HostPolicy, pooled, pooled_instances

    cpu2 = (InstanceGroup("g", InstanceKind.CPU, 2),)
    models = {
        "onnx2": _model("onnx2", cpu2),
        "torch3": _model(
            "torch3", (InstanceGroup("g", InstanceKind.CPU, 3),), backend="pytorch", platform=""
        ),
        "python2": _python("python2", cpu2),
        "onnx_gpu2": _model("onnx_gpu2", (InstanceGroup("g", InstanceKind.GPU, 2),)),
        "onnx_two_groups": _model("onnx_two_groups", (*cpu2, InstanceGroup("h", InstanceKind.CPU, 1))),
    }
    policy = HostPolicy(replicas=1, num_gpus=1)
    plan = plan_deployments(models, ClusterResources(4, 1), hosts=policy)
    assert plan.pooled == ("onnx2", "torch3")
    assert [pooled_instances(models[n]) for n in ("onnx2", "torch3", "python2")] == [2, 3, 1]
    assert pooled_instances(_model("plain")) == 1
    assert not pooled(models["python2"], policy) and not pooled(models["onnx_gpu2"], policy)


def test_hosts_with_gpus_pool_single_instance_gpu_models_where_the_cluster_has_the_gpus() -> None:
    from repository_loader.plan import HostPolicy

    models = {
        "gpu": _python("gpu", (InstanceGroup("g", InstanceKind.GPU, 1, gpus=(1,)),)),
        "gpus": _python("gpus", (InstanceGroup("g", InstanceKind.GPU, 2),)),  # two instances: its own
        "both": _python("both", (InstanceGroup("g", InstanceKind.GPU, 1, gpus=(0, 1)),)),  # one on each
        "cpu": _python("cpu"),
    }
    hosts = HostPolicy(replicas=2, num_gpus=1, gpu_memory_bytes=2**30)
    plan = plan_deployments(models, ClusterResources(4, 2), hosts=hosts)
    assert plan.pooled == ("cpu", "gpu") and [e.model for e in plan.entries] == ["both", "gpus"]
    assert plan.host is not None and plan.host.resources.num_gpus == 1.0
    assert plan.host.serve_options()["ray_actor_options"]["num_gpus"] == 1.0
    assert plan.host.to_dict()["gpu_memory_bytes"] == 2**30
    # two host replicas of one GPU each do not fit one GPU: the hosts go without, GPU models keep theirs
    plan = plan_deployments(models, ClusterResources(4, 1), hosts=hosts)
    assert plan.pooled == ("cpu",) and [e.model for e in plan.entries] == ["gpus"]
    # placed as their own, where their groups say
    assert "GPU(s) [1] do not exist" in plan.problems["gpu"][0] and plan.problems.keys() == {"gpu", "both"}
    assert plan.host is not None and plan.host.resources.num_gpus == 0.0


def test_with_dedicated_placement_only_the_models_that_ask_are_pooled_and_hosts_spread() -> None:
    from repository_loader.plan import HostPolicy

    models = {
        "plain": _python("plain"),
        "asked": _python("asked", **{"ray.placement": "pooled"}),
        "kept": _python("kept", **{"ray.placement": "dedicated"}),
        "cannot": _python(
            "cannot", (InstanceGroup("g", InstanceKind.CPU, 2),), **{"ray.placement": "pooled"}
        ),
    }
    hosts = HostPolicy(replicas=2, num_cpus=0.25, placement="dedicated", max_per_node=1)
    plan = plan_deployments(models, ClusterResources(4), hosts=hosts)
    assert plan.pooled == ("asked",)
    assert sorted(e.model for e in plan.entries) == ["cannot", "kept", "plain"]
    assert plan.host is not None and plan.host.serve_options()["max_replicas_per_node"] == 1
    assert plan.host.to_dict()["max_per_node"] == 1
    # the defaults: every model that can be is pooled, and Serve places host replicas where it likes
    plan = plan_deployments(models, ClusterResources(4), hosts=HostPolicy(replicas=2))
    assert plan.pooled == ("asked", "plain")
    assert plan.host is not None and "max_replicas_per_node" not in plan.host.serve_options()


def test_autoscaled_hosts_start_at_model_hosts_and_keep_cpus_for_the_most() -> None:
    from repository_loader.autoscaling import Autoscaling
    from repository_loader.plan import HostPolicy

    scaling = Autoscaling(min_replicas=1, max_replicas=3, upscale_delay_s=2)
    hosts = HostPolicy(replicas=1, num_cpus=0.25, autoscaling=scaling)
    plan = plan_deployments(
        {"a": _python("a"), "own": _python("own", **{"ray.placement": "dedicated"})},
        ClusterResources(4),
        hosts=hosts,
    )
    assert plan.host is not None and plan.host.most_replicas == 3
    options = plan.host.serve_options()
    assert "num_replicas" not in options
    assert options["autoscaling_config"] == {
        "min_replicas": 1,
        "max_replicas": 3,
        "initial_replicas": 1,
        "target_ongoing_requests": 8.0,  # the hosts' default
        "upscale_delay_s": 2,
    }
    # three host replicas' CPUs are kept out of the dedicated replicas' shares
    assert plan.total_cpus == round(3 * 0.25 + plan.entries[0].resources.num_cpus, 4)
    assert plan.total_cpus <= 4 - CONTROL_APP_CPUS
    fixed = plan_deployments({"a": _python("a")}, ClusterResources(4), hosts=HostPolicy(replicas=2))
    assert fixed.host is not None and fixed.host.serve_options()["num_replicas"] == 2
    assert "autoscaling_config" not in fixed.host.serve_options()


def test_stateful_streaming_and_ensemble_models_are_never_pooled() -> None:
    from dataclasses import replace

    from repository_loader.model import SequenceBatching
    from repository_loader.plan import HostPolicy, pooled

    policy = HostPolicy(replicas=1)
    base = _python("m", **{"ray.placement": "pooled"})
    assert pooled(base, policy)
    assert not pooled(replace(base, decoupled=True), policy)
    assert not pooled(replace(base, sequence_batching=SequenceBatching()), policy)
    assert not pooled(replace(base, backend="tensorrt"), policy)
    assert not pooled(base, HostPolicy(replicas=0))


def test_a_model_with_a_passive_group_is_never_pooled() -> None:
    from repository_loader.plan import HostPolicy, pooled

    policy = HostPolicy(replicas=1)
    base = _python("m", **{"ray.placement": "pooled"})
    idle = (InstanceGroup("p", InstanceKind.CPU, 1, passive=True),)
    assert pooled(base, policy) and not pooled(replace(base, instance_groups=idle), policy)


def test_a_batched_model_with_several_replicas_fills_one_replicas_batcher_first() -> None:
    """``routing_slots``: HAProxy gives a replica its largest batch before the next replica gets any,
    for a dynamically batched model with more than one replica (over all its groups)."""
    from dataclasses import replace

    two = (InstanceGroup("g", InstanceKind.CPU, 2),)
    split = (InstanceGroup("g", InstanceKind.CPU, 1), InstanceGroup("h", InstanceKind.CPU, 1))
    models = {
        "batched": _model("batched", two),
        "groups": _model("groups", split),
        "alone": _model("alone", (InstanceGroup("g", InstanceKind.CPU, 1),)),
        "plain": replace(_model("plain", two), dynamic_batching=None),
        "one": _model("one", two, max_batch_size=1),
    }
    plan = plan_deployments(models, ClusterResources(8))
    slots = {e.app_name: e.routing_slots for e in plan.entries}
    assert slots["model-batched"] == 8 and slots["model-groups"] == 8
    assert slots["model-alone"] is None and slots["model-plain"] is None and slots["model-one"] is None


def test_many_poolable_models_without_hosts_get_a_hint_naming_the_flag() -> None:
    from dataclasses import replace

    from repository_loader.model import SequenceBatching
    from repository_loader.plan import HOSTS_HINT_MODELS, HostPolicy, hosts_hint

    many = {f"m{i}": _python(f"m{i}") for i in range(HOSTS_HINT_MODELS)}
    stateful = {"s": replace(_python("s"), sequence_batching=SequenceBatching())}
    hint = hosts_hint({**many, **stateful}, HostPolicy())
    assert hint is not None
    assert hint.startswith(f"{HOSTS_HINT_MODELS} of the {HOSTS_HINT_MODELS + 1} models")
    assert "--model-hosts 1" in hint
    assert hosts_hint(dict(list(many.items())[1:]), HostPolicy()) is None  # too few to matter
    assert hosts_hint(many, HostPolicy(replicas=1)) is None  # hosts already on


def _counted(count: int, running: float | None = None, free: float = 1.9) -> tuple[float, ...]:
    """The CPU shares model m's one group gets at ``count`` instances, where it runs now at share
    ``running`` (None: not running) and the other models left ``free`` CPUs."""
    model = _model("m", (InstanceGroup("g", InstanceKind.CPU, count),))
    planned = within_cpus(plan_deployments({"m": model}, ClusterResources(2)).for_model("m"), free)
    if running is None:
        return tuple(e.resources.num_cpus for e in planned)
    current = _model("m", (InstanceGroup("g", InstanceKind.CPU, 1),))
    now = plan_deployments({"m": current}, ClusterResources(2)).for_model("m")
    now = tuple(replace(e, resources=replace(e.resources, num_cpus=running)) for e in now)
    return tuple(e.resources.num_cpus for e in keep_shares(now, planned, free))


def test_a_count_change_keeps_the_running_share_while_the_new_count_fits() -> None:
    # planned alone on 2 CPUs, 1.9 beside the server: room for twice each count at its share
    assert [_counted(n)[0] for n in (1, 2, 3, 4, 8)] == [0.95, 0.47, 0.31, 0.23, 0.11]
    assert _counted(2, running=0.95) == (0.95,)  # 1 -> 2 in place: 1.9 CPUs
    assert _counted(4, running=0.31) == (0.31,)  # 3 -> 4 in place
    assert _counted(1, running=0.11) == (0.11,)  # 8 -> 1: the survivor keeps its share
    assert _counted(8, running=0.11) == (0.11,)  # and 1 -> 8 fits at it again
    # past what the running share leaves room for: the planned share (every replica restarts)
    assert _counted(3, running=0.95) == (0.31,)
    # the other models' CPUs count: no room for a second replica at 0.95 beside them
    assert _counted(2, running=0.95, free=1.0) == (0.25,)


def test_kept_shares_follow_each_group_by_its_application() -> None:
    groups = (InstanceGroup("a", InstanceKind.CPU, 2), InstanceGroup("b", InstanceKind.CPU, 1))
    running = plan_deployments({"m": _model("m", groups)}, ClusterResources(2)).for_model("m")
    running = (running[0], replace(running[1], resources=replace(running[1].resources, num_cpus=0.05)))
    grown = (InstanceGroup("a", InstanceKind.CPU, 3), *groups[1:], InstanceGroup("c", InstanceKind.CPU, 1))
    planned = plan_deployments({"m": _model("m", grown)}, ClusterResources(2)).for_model("m")
    kept = keep_shares(running, planned, 1.9)
    assert [e.resources.num_cpus for e in kept] == [
        running[0].resources.num_cpus,
        0.05,
        planned[2].resources.num_cpus,  # a new group: the planned share
    ]
    assert [e.num_replicas for e in kept] == [3, 1, 1]
