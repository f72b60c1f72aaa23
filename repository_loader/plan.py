"""The deployment plan: how the models of a repository map onto a cluster's CPUs and GPUs.

A pure function of the model descriptions and the cluster's resources, so it is
tested without Ray. Triton's instance groups become replicas:

* KIND_GPU, count c on g GPUs -> c*g replicas with 1/c GPU each, each aimed at one GPU;
* KIND_CPU, count c -> c replicas with a CPU share;
* KIND_AUTO -> KIND_GPU where the cluster has a GPU, else KIND_CPU;
* KIND_MODEL -> count replicas that place themselves (no GPU reserved);
* no instance_group -> Triton's default: one instance per GPU, or a CPU group
  (2 instances for ONNX Runtime, 1 otherwise) on a cluster without GPUs.

Each :class:`DeploymentEntry` is exactly one Serve deployment in its own Serve
application, applied as it is by the serving layer: one per instance group of a
model (an ensemble has one), each serving every selected version with its own
count, kind, GPUs and resources. The first group's application is the model's
own, at ``/v2/models/<name>``; group ``i > 0`` gets ``<model app>--group-<i>`` at
``/v2/-/instance-groups/<that app>``, a route no client uses: the serving layer
spreads the model's HTTP requests over every group behind the model's route
(HAProxy), and its handle calls over the groups' applications. The replicas of a
model are ranked over all its groups in config order (``rank_offset``), so
that a stateful model has one owner per sequence however many groups it has.

A ``passive`` instance group (Triton: loaded, never given a request by the scheduler) is deployed
and loaded like any other, after the model's other groups, as ``<model app>--passive-<i>``: no
route, rank or handle call reaches it. A model whose groups are all passive keeps its own
application, whose replicas answer every request UNAVAILABLE (``deployments.runtime.router``).

A model whose config ``parameters`` carry ``ray.autoscaling.*`` keys
(``repository_loader.autoscaling``) has its first group autoscaled by Serve between
``min_replicas`` and ``max_replicas``; the plan counts its start replicas.

With model hosts on (:class:`HostPolicy`, ``ServerSettings.model_hosts``), a model that needs nothing
a replica of its own gives (:func:`pooled`: one CPU instance, no autoscaling, no state, no stream;
an ensemble whose models are all pooled) is *pooled*: it gets no entry of its own and is served by the one shared
:class:`HostEntry`, a deployment whose replicas each hold many models, loaded on demand
(docs/hosts.md). A model's ``ray.placement`` parameter (``pooled`` or ``dedicated``) chooses either way.

CPU shares are sized so every replica fits at once: on a 2-core machine the
default of one CPU per replica would leave the third replica waiting forever.
They are sized for :data:`SCALE_HEADROOM` times the replicas there are, so that a
model's ``instance_group`` count may double in place (its running replicas keep
their share: Serve restarts a replica whose resources change, :func:`keep_shares`)
and a rolling update's new replicas fit beside the old ones (docs/compatibility.md,
Model updates). GPU fractions aimed at one GPU are scaled down the same way when
they add up to more than that GPU.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from repository_loader import platforms
from repository_loader.autoscaling import PREFIX as AUTOSCALING_PREFIX
from repository_loader.autoscaling import Autoscaling, autoscaling_of
from repository_loader.ensemble_rules import composing_models
from repository_loader.model import (
    DynamicBatching,
    InstanceGroup,
    InstanceKind,
    ModelDescription,
    SequenceBatching,
)

logger = logging.getLogger(__name__)

# CPUs kept free for the small server application at /v2 (health, metadata, repository API);
# the default of ``ServerSettings.control_app_cpus``.
CONTROL_APP_CPUS = 0.1
MIN_CPU_SHARE = 0.01
MIN_ONGOING_REQUESTS = 64
# CPU shares are planned for this many times the replicas there are: room to add instances in place
SCALE_HEADROOM = 2
ENSEMBLE_KIND = "ensemble"


SERVER_APP = "triton"
SERVER_ROUTE = "/v2"
MODEL_DEPLOYMENT = "model"
GROUP_APP_MARK = "--group-"
PASSIVE_APP_MARK = "--passive-"  # a passive instance group's application: loaded, never routed to
MODEL_APP_PREFIX = "model-"
GROUP_ROUTE = f"{SERVER_ROUTE}/-/instance-groups"
HOST_APP = "triton-hosts"
HOST_DEPLOYMENT = "host"
HOST_ROUTE = f"{SERVER_ROUTE}/models"  # the longest-prefix fallback of every model route
HOST_TARGET_ONGOING_REQUESTS = 8.0  # requests inside a host replica autoscaling aims at, unless told
PLACEMENT_PARAMETER = "ray.placement"
POOLED = "pooled"
DEDICATED = "dedicated"
POOLED_BACKENDS = frozenset({"python", "onnxruntime", "pytorch"})
# backends whose loaded model is stateless and safe to run from several threads: pooled with one CPU
# group of any count, as one loaded model that runs up to ``count`` batches at once (pooled_instances)
STATELESS_BACKENDS = frozenset({"onnxruntime", "pytorch"})
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def model_app_name(model: str) -> str:
    """The Serve application of ``model`` (safe for HAProxy backend names)."""
    safe = _UNSAFE.sub("_", model)
    if safe != model:
        safe += "-" + hashlib.sha1(model.encode()).hexdigest()[:8]
    return f"{MODEL_APP_PREFIX}{safe}"


def model_route(model: str) -> str:
    """The route prefix of ``model``'s application."""
    return f"{SERVER_ROUTE}/models/{model}"


def group_app_name(model: str, index: int, passive: bool = False) -> str:
    """The Serve application of the model's ``index``-th deployed instance group (the first's is the
    model's own); a ``passive`` group's past the first is marked so that no route takes it in."""
    base = model_app_name(model)
    if index == 0:
        return base
    return f"{base}{PASSIVE_APP_MARK if passive else GROUP_APP_MARK}{index}"


def is_group_app(app: str, model: str | None = None) -> bool:
    """Whether Serve application ``app`` is an instance group's past the first, passive or not (of
    ``model``, if given)."""
    for mark in (GROUP_APP_MARK, PASSIVE_APP_MARK):
        base, found, index = app.rpartition(mark)
        if found and index.isdigit() and not index.startswith("0"):
            return model is None or base == model_app_name(model)
    return False


def group_route(model: str, index: int, passive: bool = False) -> str:
    """The route prefix of the model's ``index``-th deployed instance group: the first answers the
    model's route, the others a route of their own that no client calls."""
    return model_route(model) if index == 0 else f"{GROUP_ROUTE}/{group_app_name(model, index, passive)}"


@dataclass(frozen=True)
class ClusterResources:
    """What the cluster offers: CPUs (may be fractional) and whole GPUs."""

    num_cpus: float
    num_gpus: int = 0


@dataclass(frozen=True)
class ReplicaResources:
    """Resources one replica asks Ray for."""

    num_cpus: float
    num_gpus: float = 0.0


@dataclass(frozen=True)
class BatchingPlan:
    """How requests are grouped for a model: Triton's batch limit and its scheduler settings."""

    max_batch_size: int
    dynamic: DynamicBatching | None = None
    sequence: SequenceBatching | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"max_batch_size": self.max_batch_size}
        if self.dynamic is not None:
            out["dynamic_batching"] = {
                "preferred_batch_size": list(self.dynamic.preferred_batch_size),
                "max_queue_delay_microseconds": self.dynamic.max_queue_delay_microseconds,
                "preserve_ordering": self.dynamic.preserve_ordering,
                "priority_levels": self.dynamic.priority_levels,
                "default_priority_level": self.dynamic.default_priority_level,
                "max_queue_size": self.dynamic.default_queue_policy.max_queue_size,
            }
        if self.sequence is not None:
            out["sequence_batching"] = {
                "strategy": self.sequence.strategy,
                "max_sequence_idle_microseconds": self.sequence.max_sequence_idle_microseconds,
            }
        return out


@dataclass(frozen=True)
class ReplicaSlot:
    """What replica ``rank`` of a deployment stands for: its instance group and the GPU it targets."""

    group: str
    gpu: int | None = None


@dataclass(frozen=True)
class DeploymentEntry:
    """One deployed Serve deployment: one instance group of one model (every served version), in its
    own application.

    The serving layer applies an entry as it is (``deployments.serve.app.RayDeployer``): application
    ``app_name`` at ``route_prefix`` with one deployment ``deployment_name`` of ``num_replicas``
    replicas, each asking Ray for ``ray_actor_options`` and accepting ``max_ongoing_requests``, built
    with ``init_kwargs``.

    ``group_index`` is the group's place in the model's ``instance_group`` list. The model's first
    group that is not ``passive`` (its first group where all are) is the model's own application at
    ``/v2/models/<name>``. Replica ``r`` of this deployment (``replicas[r]``: its group and GPU) is
    replica ``rank_offset + r`` of the model's ``model_replicas`` replicas over all its groups that are
    not passive; a passive group's replicas hold no rank.
    """

    model: str
    versions: tuple[int, ...]
    group: str  # the instance group's name; "" for an ensemble
    group_index: int
    kind: str  # resolved: KIND_GPU, KIND_CPU, KIND_MODEL or "ensemble"
    num_replicas: int
    resources: ReplicaResources  # per replica
    replicas: tuple[ReplicaSlot, ...]  # by replica rank within this deployment
    rank_offset: int  # the model's rank of this deployment's replica 0 (replicas of earlier groups)
    model_replicas: int  # the model's replicas over all its groups
    batching: BatchingPlan
    app_name: str
    deployment_name: str
    route_prefix: str
    max_ongoing_requests: int
    passive: bool = False  # the group is passive (loaded, never scheduled)
    # Serve's autoscaling (the model's first group that is not passive only); ``num_replicas`` is then the start count
    autoscaling: Autoscaling | None = None

    @property
    def version(self) -> int:
        """The latest served version."""
        return max(self.versions)

    @property
    def routing_slots(self) -> int | None:
        """For a dynamically batched model with more than one replica, the requests HAProxy gives one
        replica before it sends the next to another (``balance first``; its largest batch): the
        model's requests meet in as few batchers as the load needs, as they meet in Triton's one
        queue per model, and under load every replica runs full batches. None: least connections."""
        if self.batching.dynamic is None or self.batching.max_batch_size < 2 or self.model_replicas < 2:
            return None
        return self.batching.max_batch_size

    @property
    def replica_gpu_ids(self) -> tuple[int, ...]:
        """The GPUs the replicas target (KIND_GPU only), in rank order."""
        return tuple(r.gpu for r in self.replicas if r.gpu is not None)

    @property
    def instance_kind(self) -> str:
        """The Triton instance kind the replicas run as (an ensemble's replica runs on the GPU it was
        given for its steps, :func:`ensemble_gpu`, else on the CPU)."""
        if self.kind == ENSEMBLE_KIND:
            return "KIND_GPU" if self.replica_gpu_ids else "KIND_CPU"
        return self.kind if self.kind in ("KIND_GPU", "KIND_CPU", "KIND_MODEL") else "KIND_CPU"

    @property
    def ray_actor_options(self) -> dict[str, float]:
        return {"num_cpus": self.resources.num_cpus, "num_gpus": self.resources.num_gpus}

    @property
    def init_kwargs(self) -> dict[str, Any]:
        """Arguments of the model deployment's constructor, besides the model description."""
        return {
            "instance_kind": self.instance_kind,
            "replicas": self.model_replicas,
            "rank_offset": self.rank_offset,
            "gpu_ids": [r.gpu for r in self.replicas],
            "group_index": self.group_index,
            "passive": self.passive,
        }

    def serve_options(self) -> dict[str, Any]:
        """The options of the Serve deployment (``Deployment.options(**...)``)."""
        options: dict[str, Any] = {
            "name": self.deployment_name,
            "max_ongoing_requests": self.max_ongoing_requests,
            "ray_actor_options": self.ray_actor_options,
        }
        if self.autoscaling is None:
            options["num_replicas"] = self.num_replicas
        else:
            options["autoscaling_config"] = self.autoscaling.serve_config()
        return options

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "versions": list(self.versions),
            "group": self.group,
            "group_index": self.group_index,
            "kind": self.kind,
            "app_name": self.app_name,
            "deployment_name": self.deployment_name,
            "num_replicas": self.num_replicas,
            "rank_offset": self.rank_offset,
            "model_replicas": self.model_replicas,
            "num_cpus_per_replica": self.resources.num_cpus,
            "num_gpus_per_replica": self.resources.num_gpus,
            "replica_gpu_ids": list(self.replica_gpu_ids),
            "replica_groups": [r.group for r in self.replicas],
            "route_prefix": self.route_prefix,
            "max_ongoing_requests": self.max_ongoing_requests,
            "passive": self.passive,
            "autoscaling": None if self.autoscaling is None else self.autoscaling.serve_config(),
            "batching": self.batching.to_dict(),
        }


@dataclass(frozen=True)
class DeploymentPlan:
    """Every deployment of the repository, the resources they use, and models that cannot be placed."""

    entries: tuple[DeploymentEntry, ...]
    resources: ClusterResources
    problems: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # model -> reasons
    pooled: tuple[str, ...] = ()  # models served by the model host
    host: HostEntry | None = None  # the model host deployment (None: hosts off)

    def for_model(self, name: str) -> tuple[DeploymentEntry, ...]:
        """The deployments of model ``name``, one per instance group: the model's own first, then its
        other groups that take requests in rank order (config order), then its passive ones."""
        return tuple(e for e in self.entries if e.model == name)

    def entry(self, name: str) -> DeploymentEntry | None:
        """The deployment at model ``name``'s own route: its first instance group that is not passive
        (None where it has none)."""
        own = model_app_name(name)
        return next((e for e in self.entries if e.model == name and e.app_name == own), None)

    @property
    def total_cpus(self) -> float:
        hosts = self.host.most_replicas * self.host.resources.num_cpus if self.host is not None else 0.0
        return round(sum(e.num_replicas * e.resources.num_cpus for e in self.entries) + hosts, 4)

    @property
    def total_gpus(self) -> float:
        return round(sum(e.num_replicas * e.resources.num_gpus for e in self.entries), 4)

    def to_dict(self) -> dict[str, Any]:
        return {
            "resources": {"num_cpus": self.resources.num_cpus, "num_gpus": self.resources.num_gpus},
            "total_cpus": self.total_cpus,
            "total_gpus": self.total_gpus,
            "entries": [e.to_dict() for e in self.entries],
            "problems": {model: list(reasons) for model, reasons in self.problems.items()},
            "pooled": list(self.pooled),
            "host": self.host.to_dict() if self.host is not None else None,
        }


@dataclass(frozen=True)
class HostPolicy:
    """Whether models may be pooled, and the host deployment's size (``ServerSettings``)."""

    replicas: int = 0  # host replicas; 0: no hosts, every model has its own deployment
    num_cpus: float = 0.5  # per host replica
    memory_bytes: int = 4 * 2**30  # per host replica: what its models may take, measured
    num_gpus: int = 0  # whole GPUs per host replica; with GPUs, single-instance KIND_GPU models pool too
    gpu_memory_bytes: int = 0  # per GPU of a host replica: what its models may take; 0: 90% of what is free
    # where a model whose ``ray.placement`` says nothing goes: POOLED (wherever it can) or DEDICATED
    placement: str = "pooled"
    max_per_node: int = 0  # host replicas one node may run; 0: no limit
    # Serve's autoscaling of the hosts (``replicas`` is then the start count); None: a fixed count
    autoscaling: Autoscaling | None = None

    @property
    def enabled(self) -> bool:
        return self.replicas > 0


@dataclass(frozen=True)
class HostEntry:
    """The shared model host deployment: ``num_replicas`` replicas, each holding any pooled model."""

    app_name: str
    deployment_name: str
    route_prefix: str
    num_replicas: int
    resources: ReplicaResources
    memory_bytes: int
    gpu_memory_bytes: int = 0  # per GPU of a replica; 0: 90% of what is free when the replica starts
    max_per_node: int = 0  # replicas one node may run (Serve's ``max_replicas_per_node``); 0: no limit
    # Serve's autoscaling between ``num_replicas`` and this many (None: ``num_replicas``, fixed)
    autoscaling: Autoscaling | None = None

    def serve_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "name": self.deployment_name,
            "ray_actor_options": {"num_cpus": self.resources.num_cpus, "num_gpus": self.resources.num_gpus},
            "max_ongoing_requests": MIN_ONGOING_REQUESTS * 16,
        }
        if self.autoscaling is None:
            options["num_replicas"] = self.num_replicas
        else:
            options["autoscaling_config"] = self.autoscaling.serve_config()
        if self.max_per_node > 0:
            options["max_replicas_per_node"] = self.max_per_node
        return options

    @property
    def most_replicas(self) -> int:
        """The host replicas there may be at once (what their CPUs are kept for)."""
        return self.num_replicas if self.autoscaling is None else self.autoscaling.max_replicas

    def to_dict(self) -> dict[str, Any]:
        return {
            "app_name": self.app_name,
            "deployment_name": self.deployment_name,
            "route_prefix": self.route_prefix,
            "num_replicas": self.num_replicas,
            "num_cpus": self.resources.num_cpus,
            "num_gpus": self.resources.num_gpus,
            "memory_bytes": self.memory_bytes,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "max_per_node": self.max_per_node,
            "autoscaling": None if self.autoscaling is None else self.autoscaling.serve_config(),
        }


def host_autoscaling(hosts: HostPolicy) -> Autoscaling | None:
    """Serve's autoscaling of the host replicas on the requests inside each, starting at ``replicas``
    (None: a fixed count). The target is :data:`HOST_TARGET_ONGOING_REQUESTS` unless told."""
    found = hosts.autoscaling
    if found is None:
        return None
    target = found.target_ongoing_requests or HOST_TARGET_ONGOING_REQUESTS
    return replace(found, initial_replicas=hosts.replicas, target_ongoing_requests=target)


def fitted(hosts: HostPolicy, resources: ClusterResources) -> HostPolicy:
    """``hosts`` as a cluster with ``resources`` can run them: without GPUs where it has too few."""
    if hosts.num_gpus and resources.num_gpus < hosts.replicas * hosts.num_gpus:
        return replace(hosts, num_gpus=0)
    return hosts


def _pooled_kinds(policy: HostPolicy) -> tuple[InstanceKind, ...]:
    cpu = (InstanceKind.CPU, InstanceKind.AUTO)
    return (*cpu, InstanceKind.GPU) if policy.num_gpus > 0 else cpu


def pooled(
    model: ModelDescription, policy: HostPolicy, models: Mapping[str, ModelDescription] | None = None
) -> bool:
    """Whether ``model`` is served by the model host rather than a deployment of its own.

    Where hosts are on, a model is pooled unless it needs a replica of its own (state, streams,
    autoscaling, a GPU, several instances of a Python model, a backend hosts do not run, rate-limiter
    resources, a passive instance group) or its ``ray.placement``
    parameter says ``dedicated``; ``pooled`` there cannot pool a model that needs its own replica (it
    keeps its deployment). A model whose parameter says nothing goes where the policy's ``placement``
    says: with ``dedicated`` only the models that ask for it are pooled. Hosts with GPUs
    (``HostPolicy.num_gpus``) pool a single-instance ``KIND_GPU`` model too: it runs on the host
    replica's GPU, whichever its ``instance_group`` names.

    An ensemble is pooled when every model it reaches (nested ensembles' steps included) is pooled,
    looked up in ``models``: the host replica that answers it then runs every step in its own process
    (docs/hosts.md). An ensemble with a step that is not pooled, or not in ``models``, keeps its
    deployment, which hosts its steps in process as it places them.
    """
    asked = _asked(model, policy)
    if not policy.enabled or asked == DEDICATED:
        return False
    if model.is_ensemble:
        return not model.decoupled and asked == POOLED and _steps_pooled(model, policy, models or {})
    groups = model.instance_groups
    return (
        model.kind in POOLED_BACKENDS
        and not model.decoupled
        and model.sequence_batching is None
        and not any(str(key).startswith(AUTOSCALING_PREFIX) for key in (model.parameters or {}))
        and len(groups) <= 1
        and not any(g.rate_limiter.resources for g in groups)  # each instance holds its own (rate limiter)
        and not any(g.passive for g in groups)  # a host would run it; a passive instance runs nothing
        and all(_one_instance(model, g) and g.kind in _pooled_kinds(policy) for g in groups)
        and asked == POOLED
    )


def _one_instance(model: ModelDescription, group: InstanceGroup) -> bool:
    """Whether a host can run ``group`` as one loaded model: a group of one instance, or a CPU group of
    a stateless backend (its instances differ only in running at the same time)."""
    return group.count * max(len(group.gpus), 1) <= 1 or _stateless_cpu(model, group)


def _stateless_cpu(model: ModelDescription, group: InstanceGroup) -> bool:
    return model.kind in STATELESS_BACKENDS and group.kind in (InstanceKind.CPU, InstanceKind.AUTO)


def pooled_instances(model: ModelDescription) -> int:
    """How many batches a host runs at once for pooled ``model``: its CPU group's count for a stateless
    backend (Triton's instances of it), else 1 (one instance; a Python model's instances each hold
    state, so it is pooled only with one)."""
    groups = model.instance_groups
    if len(groups) == 1 and _stateless_cpu(model, groups[0]):
        return max(groups[0].count, 1)
    return 1


def _asked(model: ModelDescription, policy: HostPolicy) -> str:
    """Where ``model``'s ``ray.placement`` parameter asks to be served (the policy's default where it
    says nothing)."""
    return str((model.parameters or {}).get(PLACEMENT_PARAMETER, "")).strip().lower() or policy.placement


def _steps_pooled(
    ensemble: ModelDescription, policy: HostPolicy, models: Mapping[str, ModelDescription]
) -> bool:
    """Whether every model ``ensemble`` reaches is in ``models`` and pooled (nested ensembles as models:
    their own steps are among those reached)."""
    for name in composing_models(ensemble, models):
        step = models.get(name)
        if step is None or step.decoupled:
            return False
        if step.is_ensemble:
            if _asked(step, policy) != POOLED:
                return False
        elif not pooled(step, policy):
            return False
    return True


HOSTS_HINT_MODELS = 16  # without hosts, this many poolable models get a hint at start


def hosts_hint(models: Mapping[str, ModelDescription], policy: HostPolicy) -> str | None:
    """What to tell a user whose hosts are off while many of ``models`` could share them (a replica
    process per model costs memory and start time that one host replica does not); None otherwise."""
    if policy.enabled:
        return None
    one = replace(policy, replicas=1)
    poolable = [name for name, model in models.items() if pooled(model, one, models)]
    if len(poolable) < HOSTS_HINT_MODELS:
        return None
    return (
        f"{len(poolable)} of the {len(models)} models could share model hosts, where each now gets a "
        "replica process of its own (memory and start time per model); --model-hosts 1 "
        "(args: model_hosts: 1) pools them in one process (docs/hosts.md)"
    )


@dataclass(frozen=True)
class _Placement:
    """A resolved instance group before CPU shares are known."""

    group: str
    kind: str
    num_replicas: int
    gpus_per_replica: float
    gpu_ids: tuple[int, ...]
    passive: bool = False
    autoscaling: Autoscaling | None = None  # the model's first group that is not passive only
    index: int = 0  # the group's place in the model's ``instance_group`` list


def plan_deployments(
    models: Mapping[str, ModelDescription],
    resources: ClusterResources,
    control_app_cpus: float = CONTROL_APP_CPUS,
    hosts: HostPolicy = HostPolicy(),
) -> DeploymentPlan:
    """Plan one deployment per instance group of each model of ``models`` on a cluster with ``resources``;
    with ``hosts`` on, pooled models (:func:`pooled`) share the model host's deployment instead.

    ``control_app_cpus`` are kept free for the server application (``ServerSettings.control_app_cpus``).
    """
    placed: list[tuple[ModelDescription, list[_Placement]]] = []
    problems: dict[str, tuple[str, ...]] = {}
    pooled_names: list[str] = []
    if fitted(hosts, resources) != hosts:
        logger.warning(
            "model hosts ask for %d GPU(s) each (%d replicas) and the cluster has %d: the hosts run without "
            "GPUs, and KIND_GPU models keep deployments of their own",
            hosts.num_gpus,
            hosts.replicas,
            resources.num_gpus,
        )
        hosts = fitted(hosts, resources)
    for name in sorted(models):
        model = models[name]
        if pooled(model, hosts, models):
            pooled_names.append(name)
            continue
        try:
            placed.append((model, _placements(model, resources, models)))
        except _CannotPlace as exc:
            problems[name] = tuple(exc.reasons)
    host: HostEntry | None = None
    if hosts.enabled:
        host_cpus = min(hosts.num_cpus, max(resources.num_cpus - control_app_cpus, MIN_CPU_SHARE) / 2)
        host = HostEntry(
            app_name=HOST_APP,
            deployment_name=HOST_DEPLOYMENT,
            route_prefix=HOST_ROUTE,
            num_replicas=hosts.replicas,
            resources=ReplicaResources(num_cpus=round(host_cpus, 4), num_gpus=float(hosts.num_gpus)),
            memory_bytes=hosts.memory_bytes,
            gpu_memory_bytes=hosts.gpu_memory_bytes,
            max_per_node=hosts.max_per_node,
            autoscaling=host_autoscaling(hosts),
        )
        control_app_cpus += host.most_replicas * host.resources.num_cpus
    every = [p for _, placements in placed for p in placements]
    replicas = sum(p.num_replicas for p in every)
    share = cpu_share(resources.num_cpus, SCALE_HEADROOM * replicas, control_app_cpus)
    gpu_scale = _gpu_scale(every)
    entries = [
        entry for model, placements in placed for entry in _entries(model, placements, share, gpu_scale)
    ]
    problems.update(_application_clashes(entries))
    kept = tuple(e for e in entries if e.model not in problems)
    return DeploymentPlan(
        entries=kept, resources=resources, problems=problems, pooled=tuple(pooled_names), host=host
    )


def _application_clashes(entries: list[DeploymentEntry]) -> dict[str, tuple[str, ...]]:
    """Models whose application names meet (a group's ``<app>--group-<i>`` is another model's own):
    both are refused, so that neither replaces the other's application."""
    owners: dict[str, set[str]] = {}
    for entry in entries:
        owners.setdefault(entry.app_name, set()).add(entry.model)
    problems: dict[str, list[str]] = {}
    for app, models in sorted(owners.items()):
        if len(models) > 1:
            for model in sorted(models):
                others = ", ".join(f"'{m}'" for m in sorted(models - {model}))
                problems.setdefault(model, []).append(
                    f"model '{model}': its Serve application '{app}' is also that of model {others}; "
                    "rename one of them"
                )
    return {model: tuple(reasons) for model, reasons in problems.items()}


def _gpu_scale(placements: list[_Placement]) -> dict[int, float]:
    """Per GPU id, the factor that keeps the fractions of all replicas aimed at it within one GPU."""
    demand: dict[int, float] = {}
    for placement in placements:
        for gpu in placement.gpu_ids:
            demand[gpu] = demand.get(gpu, 0.0) + placement.gpus_per_replica
    return {gpu: min(1.0, 1.0 / total) for gpu, total in demand.items()}


def _gpu_fraction(placement: _Placement, scale: Mapping[int, float]) -> float:
    if not placement.gpu_ids:
        return 0.0
    factor = min(scale[g] for g in placement.gpu_ids)
    return math.floor(placement.gpus_per_replica * factor * 10_000) / 10_000


def cpu_share(num_cpus: float, total_replicas: int, control_app_cpus: float = CONTROL_APP_CPUS) -> float:
    """CPUs per replica so that ``total_replicas`` replicas and the control application all fit."""
    if total_replicas <= 0:
        return 1.0
    available = max(num_cpus - control_app_cpus, 0.0)
    share = math.floor(available / total_replicas * 100) / 100
    return max(MIN_CPU_SHARE, min(1.0, share))


def within_cpus(entries: tuple[DeploymentEntry, ...], free_cpus: float) -> tuple[DeploymentEntry, ...]:
    """``entries`` (a model loaded beside running ones) with their CPU share lowered, where needed, so
    that :data:`SCALE_HEADROOM` times their replicas fit in the ``free_cpus`` the running models left
    (never below ``MIN_CPU_SHARE``): the running replicas keep their shares, and a share the cluster
    cannot give would leave the new replicas waiting forever."""
    replicas = sum(e.num_replicas for e in entries)
    if replicas <= 0:
        return entries
    share = max(MIN_CPU_SHARE, math.floor(max(free_cpus, 0.0) / (SCALE_HEADROOM * replicas) * 100) / 100)
    return tuple(
        e if e.resources.num_cpus <= share else replace(e, resources=replace(e.resources, num_cpus=share))
        for e in entries
    )


def keep_shares(
    running: tuple[DeploymentEntry, ...], planned: tuple[DeploymentEntry, ...], free_cpus: float
) -> tuple[DeploymentEntry, ...]:
    """``planned`` (a model redeployed, its ``running`` entries deployed now) with each group's CPU
    share that of its running group, where every replica of ``planned`` fits in ``free_cpus`` (what
    the other models left) at those shares; else ``planned`` as it is.

    A replica whose resources change is restarted by Serve, so a count change that keeps the running
    share adds or removes replicas and leaves the others serving; one that cannot keep it (the
    count grew past what the share leaves room for) restarts every replica at the planned share."""
    shares = {e.app_name: e.resources.num_cpus for e in running}
    kept = tuple(
        replace(e, resources=replace(e.resources, num_cpus=shares[e.app_name])) if e.app_name in shares else e
        for e in planned
    )
    needed = sum(e.num_replicas * e.resources.num_cpus for e in kept)
    return kept if needed <= free_cpus + 1e-9 else planned


def max_ongoing_requests(model: ModelDescription) -> int:
    """Concurrent requests one replica accepts: enough to fill batches under load."""
    return max(MIN_ONGOING_REQUESTS, 8 * max(1, model.max_batch_size))


class _CannotPlace(Exception):
    def __init__(self, reasons: list[str]) -> None:
        super().__init__("; ".join(reasons))
        self.reasons = reasons


def _placements(
    model: ModelDescription, resources: ClusterResources, models: Mapping[str, ModelDescription]
) -> list[_Placement]:
    if model.is_ensemble:
        gpu = ensemble_gpu(model, models, resources)
        placements = [
            _Placement(
                group="",
                kind=ENSEMBLE_KIND,
                num_replicas=1,
                gpus_per_replica=0.0 if gpu is None else 1.0,
                gpu_ids=() if gpu is None else (gpu,),
            )
        ]
    else:
        placements = _place_groups(model, resources)
    scaling = autoscaling_of(model.parameters or {}, stateful=model.sequence_batching is not None)
    if scaling is not None and not placements[0].passive:  # the first group autoscales, from its count
        first = placements[0]
        ids = first.gpu_ids
        count = scaling.start_replicas
        placements[0] = replace(
            first,
            num_replicas=count,
            gpu_ids=tuple(ids[i % len(ids)] for i in range(count)) if ids else (),
            autoscaling=scaling,
        )
    return placements


def ensemble_gpu(
    model: ModelDescription, models: Mapping[str, ModelDescription], resources: ClusterResources
) -> int | None:
    """The GPU an ensemble's replica takes, so that its ``KIND_GPU`` steps run in that replica and hand
    their device tensors on through DLPack rather than through host memory: the lowest GPU its GPU
    steps name (nested ensembles followed). None where the cluster has no GPU, where no step known in
    ``models`` runs on one, or where the ensemble's ``placement`` parameter is ``separate`` (each step
    then runs on its own model's replicas)."""
    if resources.num_gpus <= 0 or str(model.parameters.get("placement", "")).strip() == "separate":
        return None
    gpus: list[int] = []
    for name in composing_models(model, models):
        step = models.get(name)
        if step is None or step.is_ensemble:
            continue
        kinds = {g.kind for g in step.instance_groups} or {InstanceKind.AUTO}
        if InstanceKind.MODEL in kinds:
            continue  # places itself: never run in the ensemble's replica
        if InstanceKind.GPU in kinds or (InstanceKind.AUTO in kinds and step.kind != "python"):
            gpus.append(min((gpu for g in step.instance_groups for gpu in g.gpus), default=0))
    # a step on a missing GPU fails its own plan
    return min(gpus) if gpus and min(gpus) < resources.num_gpus else None


def _place_groups(model: ModelDescription, resources: ClusterResources) -> list[_Placement]:
    groups = model.instance_groups or (_default_group(model, resources),)
    reasons: list[str] = []
    placements = []
    for index, group in enumerate(groups):
        try:
            placements.append(replace(_place_group(model, group, resources), index=index))
        except _CannotPlace as exc:
            reasons.extend(exc.reasons)
    if reasons:
        raise _CannotPlace(reasons)
    # the groups that take requests first: the first of them holds the model's route, autoscaling
    # and rank 0 (a stable sort keeps config order within each kind)
    return sorted(placements, key=lambda p: p.passive)


def _default_group(model: ModelDescription, resources: ClusterResources) -> InstanceGroup:
    if resources.num_gpus > 0:
        return InstanceGroup(name=f"{model.name}_0", kind=InstanceKind.GPU, count=1)
    count = platforms.CPU_DEFAULT_COUNT.get(model.kind, 1)
    return InstanceGroup(name=f"{model.name}_0", kind=InstanceKind.CPU, count=count)


def _place_group(model: ModelDescription, group: InstanceGroup, resources: ClusterResources) -> _Placement:
    kind = group.kind
    if kind == InstanceKind.AUTO:
        kind = InstanceKind.GPU if resources.num_gpus > 0 else InstanceKind.CPU
    where = f"model '{model.name}' instance group '{group.name}'"
    if model.kind == "tensorrt" and kind != InstanceKind.GPU:
        raise _CannotPlace([f"{where}: TensorRT models run only on GPUs ({kind.value} requested)"])
    if kind == InstanceKind.GPU:
        return _place_gpu(group, resources, where)
    return _Placement(group.name, kind.value, group.count, 0.0, (), group.passive)


def _place_gpu(group: InstanceGroup, resources: ClusterResources, where: str) -> _Placement:
    if resources.num_gpus <= 0:
        raise _CannotPlace([f"{where}: KIND_GPU needs a GPU, and the cluster has none"])
    gpus = group.gpus or tuple(range(resources.num_gpus))
    missing = [g for g in gpus if g >= resources.num_gpus]
    if missing:
        raise _CannotPlace([f"{where}: GPU(s) {missing} do not exist (the cluster has {resources.num_gpus})"])
    replica_gpus = tuple(g for g in gpus for _ in range(group.count))
    return _Placement(
        group.name,
        InstanceKind.GPU.value,
        len(replica_gpus),
        round(1.0 / group.count, 6),
        replica_gpus,
        group.passive,
    )


def _entries(
    model: ModelDescription, placements: list[_Placement], share: float, gpu_scale: Mapping[int, float]
) -> list[DeploymentEntry]:
    """The model's deployments, one per instance group in ``placements``' order (those that take
    requests first), ranked over its groups that are not passive (over all where every one is)."""
    ranked = [p for p in placements if not p.passive] or placements
    total = sum(p.num_replicas for p in ranked)
    entries = []
    offset = 0
    for index, placement in enumerate(placements):
        marked = index > 0 and placement.passive  # the model's own application is never marked
        entries.append(
            DeploymentEntry(
                model=model.name,
                versions=tuple(model.versions),
                group=placement.group,
                group_index=placement.index,
                kind=placement.kind,
                num_replicas=placement.num_replicas,
                resources=ReplicaResources(num_cpus=share, num_gpus=_gpu_fraction(placement, gpu_scale)),
                replicas=tuple(
                    ReplicaSlot(placement.group, placement.gpu_ids[i] if placement.gpu_ids else None)
                    for i in range(placement.num_replicas)
                ),
                rank_offset=0 if placement.passive else offset,
                model_replicas=total,
                batching=BatchingPlan(model.max_batch_size, model.dynamic_batching, model.sequence_batching),
                app_name=group_app_name(model.name, index, marked),
                deployment_name=MODEL_DEPLOYMENT,
                route_prefix=group_route(model.name, index, marked),
                max_ongoing_requests=max_ongoing_requests(model),
                passive=placement.passive,
                autoscaling=placement.autoscaling,
            )
        )
        if not placement.passive:
            offset += placement.num_replicas
    return entries
