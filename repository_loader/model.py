"""The typed, immutable description of one model of a repository.

Built by the loader from ``config.pbtxt`` (after validation and auto-complete);
consumed by the planner, the backends, the serving layer and the ensembles.
Each class mirrors a message of Triton's model configuration; the full,
completed configuration stays available as JSON (``config_json``), which is
what ``GET /v2/models/<m>/config`` returns.
"""

from __future__ import annotations

import copyreg
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import MappingProxyType
from typing import Any

EMPTY: Mapping[str, Any] = MappingProxyType({})


def frozen_mapping(items: Mapping[Any, Any] | None = None) -> Mapping[Any, Any]:
    """A read-only mapping (what every mapping field of a description holds)."""
    return MappingProxyType(dict(items or {}))


def _reduce_mappingproxy(m: MappingProxyType) -> tuple[Any, tuple[dict[Any, Any]]]:
    return frozen_mapping, (dict(m),)


# Descriptions travel to Ray replicas by pickle; read-only mappings must survive the trip.
copyreg.pickle(MappingProxyType, _reduce_mappingproxy)


class InstanceKind(str, Enum):
    """``ModelInstanceGroup.Kind``."""

    AUTO = "KIND_AUTO"
    GPU = "KIND_GPU"
    CPU = "KIND_CPU"
    MODEL = "KIND_MODEL"


class ModelState(str, Enum):
    """States the repository index reports, as Triton names them."""

    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"


@dataclass(frozen=True)
class TensorSpec:
    """``ModelInput`` / ``ModelOutput``. ``dims`` exclude the batch dimension."""

    name: str
    datatype: str  # wire name: "FP32", "BYTES", ...
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None = None
    optional: bool = False
    allow_ragged_batch: bool = False
    is_shape_tensor: bool = False
    label_filename: str | None = None
    format: str = "FORMAT_NONE"
    # an ensemble output that names no label file: the label file of the step output that produces it
    # (an absolute path; Triton's classification labels come with the tensor from the model that made it)
    step_labels: str | None = None

    def full_shape(self, max_batch_size: int) -> list[int]:
        """Shape as metadata reports it: ``[-1, *dims]`` for batching models."""
        return ([-1] if max_batch_size > 0 else []) + list(self.dims)


@dataclass(frozen=True)
class RateLimitResource:
    """``ModelRateLimiter.Resource``: ``count`` copies of ``name`` an instance holds while it executes;
    ``global_`` resources have one pool for the whole server, the others one per device."""

    name: str
    count: int
    global_: bool = False


@dataclass(frozen=True)
class RateLimiter:
    """``ModelRateLimiter``: what each instance of a group needs to execute (docs/rate_limiter.md), and
    its ``priority`` among instances waiting for the same resources (a weight: 2 runs half as often
    as 1 under contention; 0 counts as 1)."""

    resources: tuple[RateLimitResource, ...] = ()
    priority: int = 0


@dataclass(frozen=True)
class InstanceGroup:
    """``ModelInstanceGroup``."""

    name: str
    kind: InstanceKind
    count: int
    gpus: tuple[int, ...] = ()
    host_policy: str = ""
    passive: bool = False
    rate_limiter: RateLimiter = RateLimiter()


@dataclass(frozen=True)
class QueuePolicy:
    """``ModelQueuePolicy``. ``timeout_action`` is "REJECT" or "DELAY"."""

    timeout_action: str = "REJECT"
    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0


@dataclass(frozen=True)
class DynamicBatching:
    """``ModelDynamicBatching``."""

    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_microseconds: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy = QueuePolicy()
    priority_queue_policy: Mapping[int, QueuePolicy] = field(default_factory=frozen_mapping)


@dataclass(frozen=True)
class SequenceControl:
    """One control tensor of ``ModelSequenceBatching.ControlInput``."""

    input_name: str
    kind: str  # CONTROL_SEQUENCE_START / READY / END / CORRID
    datatype: str  # wire name of the tensor
    values: tuple[Any, ...] = ()  # false/true values (int or float), empty for CORRID


@dataclass(frozen=True)
class SequenceBatching:
    """``ModelSequenceBatching`` (the parts the scheduler acts on)."""

    strategy: str = "direct"  # "direct" or "oldest"
    max_sequence_idle_microseconds: int = 1_000_000
    controls: tuple[SequenceControl, ...] = ()
    max_candidate_sequences: int = 0
    max_queue_delay_microseconds: int = 0
    # every request is a sequence of its own, which the model runs over iterations (rescheduling it)
    iterative: bool = False


@dataclass(frozen=True)
class EnsembleStep:
    """``ModelEnsembling.Step``. Maps are step tensor name -> ensemble tensor name."""

    model_name: str
    model_version: int = -1
    input_map: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    output_map: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    # the repository of the step's model where model namespacing is on (its path, or its namespace)
    model_namespace: str = ""


@dataclass(frozen=True)
class WarmupInput:
    """``ModelWarmup.Input``. ``source`` is "zero_data", "random_data" or "input_data_file"."""

    datatype: str
    dims: tuple[int, ...]
    source: str = "zero_data"
    input_data_file: str | None = None


@dataclass(frozen=True)
class WarmupSample:
    """``ModelWarmup``."""

    name: str
    batch_size: int
    inputs: Mapping[str, WarmupInput]
    count: int = 1


@dataclass(frozen=True)
class ModelDescription:
    """A validated, completed model of the repository."""

    name: str
    path: Path  # the model's folder
    platform: str  # "onnxruntime_onnx", "pytorch_libtorch", "tensorrt_plan", "ensemble", ""
    backend: str  # "onnxruntime", "pytorch", "tensorrt", "python", ""
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    versions: tuple[int, ...]  # versions the version policy selects, ascending
    instance_groups: tuple[InstanceGroup, ...] = ()
    dynamic_batching: DynamicBatching | None = None
    sequence_batching: SequenceBatching | None = None
    ensemble_steps: tuple[EnsembleStep, ...] = ()
    warmup: tuple[WarmupSample, ...] = ()
    parameters: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    default_model_filename: str = ""
    # model file per CUDA compute capability ("8.6" -> "model_a10g.plan"), for a GPU instance
    cc_model_filenames: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    decoupled: bool = False
    response_cache: bool = False
    optimization: Mapping[str, Any] = field(
        default_factory=lambda: EMPTY
    )  # JSON form of ModelOptimizationPolicy
    config_json: Mapping[str, Any] = field(default_factory=lambda: EMPTY, compare=False)
    # versions an earlier description of the model served and this one does not: Triton keeps them
    # known, so a request for one is "not at ready state" rather than "not found"
    retired_versions: tuple[int, ...] = field(default=(), compare=False)
    # a Python-based backend's model.py (``<backend directory>/<backend>/model.py``): the Python backend
    # runs the model with it, where ``backend`` names the Python-based backend
    python_runtime: str = ""

    @property
    def kind(self) -> str:
        """The backend that executes this model ("ensemble" for ensembles, "python" for a model of a
        Python-based backend)."""
        if self.platform == "ensemble":
            return "ensemble"
        if self.python_runtime:
            return "python"
        return self.backend or PLATFORM_BACKEND.get(self.platform, self.platform)

    @property
    def is_ensemble(self) -> bool:
        return self.platform == "ensemble"

    @property
    def folder_name(self) -> str:
        """The model's name in its repository (``name`` is its key where model namespacing gives the
        model of a name in several repositories a key of its own)."""
        return str(self.config_json.get("name") or self.name)

    @property
    def latest_version(self) -> int:
        return self.versions[-1]

    def version_path(self, version: int) -> Path:
        return self.path / str(version)

    def model_file(self, version: int, capability: tuple[int, int] | None = None) -> Path:
        """The model file (or folder) of ``version``: on a GPU of compute ``capability`` (major, minor)
        the one ``cc_model_filenames`` names for it, else ``default_model_filename`` or the default."""
        chosen = self.cc_model_filenames.get(f"{capability[0]}.{capability[1]}") if capability else None
        name = chosen or self.default_model_filename or DEFAULT_MODEL_FILENAME.get(self.kind, "")
        return self.version_path(version) / name

    def input(self, name: str) -> TensorSpec | None:
        return next((t for t in self.inputs if t.name == name), None)

    def output(self, name: str) -> TensorSpec | None:
        return next((t for t in self.outputs if t.name == name), None)


# platform -> the backend that runs it, for the platforms this server runs (one home: platforms.py
# and the backend registry read it from here)
PLATFORM_BACKEND: dict[str, str] = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorrt_plan": "tensorrt",
}

DEFAULT_MODEL_FILENAME = {
    "onnxruntime": "model.onnx",
    "pytorch": "model.pt",
    "tensorrt": "model.plan",
    "python": "model.py",
}
