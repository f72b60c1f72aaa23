"""Auto-complete: fill what a partial (or absent) config leaves out, as Triton does.

* platform/backend from the model file's name;
* ONNX: inputs, outputs and ``max_batch_size`` from the model file (read with
  onnxruntime). A model whose inputs and outputs all have a variable first
  dimension can batch: it gets ``max_batch_size`` 4 (Triton's
  ``default-max-batch-size``), and the dynamic batcher when that is above 1
  and no scheduler is configured;
* Python: the model's ``TritonPythonModel.auto_complete_config``;
* TorchScript files carry no signature, so such a model needs a config.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repository_loader import platforms
from repository_loader.describe import default_instance_count
from repository_loader.errors import ConfigError
from repository_loader.proto import model_config_pb2 as pb
from repository_loader.python_autocomplete import complete_python

DEFAULT_MAX_BATCH_SIZE = 4

_ORT_TYPES = {
    "tensor(bool)": pb.TYPE_BOOL,
    "tensor(uint8)": pb.TYPE_UINT8,
    "tensor(uint16)": pb.TYPE_UINT16,
    "tensor(uint32)": pb.TYPE_UINT32,
    "tensor(uint64)": pb.TYPE_UINT64,
    "tensor(int8)": pb.TYPE_INT8,
    "tensor(int16)": pb.TYPE_INT16,
    "tensor(int32)": pb.TYPE_INT32,
    "tensor(int64)": pb.TYPE_INT64,
    "tensor(float16)": pb.TYPE_FP16,
    "tensor(float)": pb.TYPE_FP32,
    "tensor(double)": pb.TYPE_FP64,
    "tensor(string)": pb.TYPE_STRING,
    "tensor(bfloat16)": pb.TYPE_BF16,
}


def normalize_platform(config: pb.ModelConfig) -> None:
    """Fill backend from platform and platform from backend (Triton does this even without auto-complete)."""
    if config.platform in platforms.PLATFORM_BACKEND and not config.backend:
        config.backend = platforms.PLATFORM_BACKEND[config.platform]
    if config.backend in platforms.BACKEND_PLATFORM and not config.platform:
        config.platform = platforms.BACKEND_PLATFORM[config.backend]


def normalize_instance_groups(config: pb.ModelConfig) -> None:
    """Triton's ``NormalizeInstanceGroup`` for counts: a count below 1 (left out, 0 or negative) becomes
    the default count, 1 (2 for ONNX Runtime on CPU). Ensembles have no instance groups."""
    if config.HasField("ensemble_scheduling"):
        return
    for group in config.instance_group:
        if group.count < 1:
            group.count = default_instance_count(group.kind, config.backend)


def detect_backend(config: pb.ModelConfig, version_entries: Sequence[str]) -> None:
    """Set backend/platform from the file names of a version folder when the config names neither."""
    if config.platform or config.backend:
        return
    names = [config.default_model_filename] if config.default_model_filename else list(version_entries)
    for name in names:
        backend = platforms.backend_from_filename(name)
        if backend:
            config.backend = backend
            normalize_platform(config)
            return


@dataclass(frozen=True)
class TensorSignature:
    """One input or output as the model file declares it (full shape, -1 where variable)."""

    name: str
    data_type: int
    shape: tuple[int, ...]


def complete(
    config: pb.ModelConfig,
    model_file: Callable[[], Path],
    *,
    has_config_file: bool,
    version_dir: Path | None = None,
) -> pb.ModelConfig:
    """Complete ``config`` for its backend; ``model_file`` gives the latest version's model file (a
    Python-based backend's ``model.py``, whose ``auto_complete_config`` completes it), ``version_dir``
    that version's folder."""
    backend = platforms.effective_backend(config)
    if backend == "pytorch" and not has_config_file:
        raise ConfigError(
            f"model '{config.name}': a TorchScript model needs a config.pbtxt listing its inputs and "
            "outputs (auto-complete cannot read them from model.pt)"
        )
    path = model_file()
    if not path.exists():
        return config  # reported as a missing model file by the loader
    if backend == "onnxruntime":
        source = f"{config.name}/{path.parent.name}/{path.name}"
        complete_onnx(config, read_onnx_signature(path, config.name), source)
    elif backend == "python":
        return complete_python(config, path, version_dir)
    return config


def read_onnx_signature(path: Path, model_name: str) -> tuple[list[TensorSignature], list[TensorSignature]]:
    """Inputs and outputs of an ONNX model file (or of ``model.onnx/model.onnx`` for a folder)."""
    if path.is_dir():
        path = path / "model.onnx"
    if not path.is_file():
        raise ConfigError(f"model '{model_name}': ONNX model file '{path}' not found")
    try:
        import onnxruntime as ort
    except ImportError:
        raise ConfigError(f"model '{model_name}': auto-complete of ONNX models needs onnxruntime") from None
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"model '{model_name}': '{path}' is not a valid ONNX model: {reason}") from None
    return (
        [_signature(arg, model_name) for arg in session.get_inputs()],
        [_signature(arg, model_name) for arg in session.get_outputs()],
    )


def _signature(arg: object, model_name: str) -> TensorSignature:
    type_name = str(getattr(arg, "type", ""))
    name = str(getattr(arg, "name", ""))
    if type_name not in _ORT_TYPES:
        raise ConfigError(
            f"model '{model_name}': tensor '{name}' has type {type_name}, which has no Triton data type"
        )
    shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (getattr(arg, "shape", None) or []))
    return TensorSignature(name, _ORT_TYPES[type_name], shape)


def complete_onnx(
    config: pb.ModelConfig,
    signature: tuple[list[TensorSignature], list[TensorSignature]],
    source: str = "model.onnx",
) -> None:
    """Fill max_batch_size, inputs, outputs and dynamic batching from an ONNX signature, then check
    the config against the model as Triton's ONNX Runtime backend does (its wording), raising one
    :class:`ConfigError` listing every disagreement."""
    inputs, outputs = signature
    everything = inputs + outputs
    batchable = bool(everything) and all(len(t.shape) >= 1 and t.shape[0] == -1 for t in everything)
    if config.max_batch_size == 0 and batchable and not _describes_full_shapes(config, everything):
        config.max_batch_size = DEFAULT_MAX_BATCH_SIZE
    problems: list[str] = []
    prefix = f"model '{config.name}' ({source})"
    if config.max_batch_size > 0 and not batchable:
        tensor = next(t for t in everything if not t.shape or t.shape[0] != -1)
        problems.append(
            f"{prefix}: max_batch_size: model '{config.name}', tensor '{tensor.name}': for the model to "
            "support batching the shape should have at least 1 dimension and the first dimension must be "
            f"-1; but shape expected by the model is {list(tensor.shape)}"
        )
    skip = 1 if config.max_batch_size > 0 else 0
    # The sequence batcher's control and state tensors are the model's too, never the config's inputs;
    # a state's output is the config's output only where it lists it (a client may then ask for it)
    seq = config.sequence_batching
    fed = {c.name for c in seq.control_input} | {s.input_name for s in seq.state}
    kept = {s.output_name for s in seq.state} - {o.name for o in config.output}
    inputs = [t for t in inputs if t.name not in fed]
    outputs = [t for t in outputs if t.name not in kept]
    _fill_tensors(config, config.input, inputs, skip, "input", prefix, problems)
    _fill_tensors(config, config.output, outputs, skip, "output", prefix, problems)
    if problems:
        raise ConfigError("\n".join(problems))
    if config.max_batch_size > 1 and config.WhichOneof("scheduling_choice") is None:
        config.dynamic_batching.SetInParent()


def _describes_full_shapes(config: pb.ModelConfig, signature: Sequence[TensorSignature]) -> bool:
    """True when the config lists tensors with the model's full rank (so it means no batching)."""
    ranks = {t.name: len(t.shape) for t in signature}
    listed = [*config.input, *config.output]
    return any(t.dims and len(t.dims) == ranks.get(t.name) and not t.HasField("reshape") for t in listed)


def _fill_tensors(
    config: pb.ModelConfig,
    tensors: Any,
    signature: list[TensorSignature],
    skip: int,
    kind: str,
    prefix: str,
    problems: list[str],
) -> None:
    by_name = {t.name: t for t in signature}
    listed = list(tensors)
    if not listed:
        for sig in signature:
            tensor = tensors.add()
            tensor.name, tensor.data_type = sig.name, sig.data_type
            tensor.dims.extend(sig.shape[skip:])
        return
    if len(listed) != len(signature) and (kind == "input" or len(listed) > len(signature)):
        problems.append(
            f"{prefix}: {kind}: unable to load model '{config.name}', configuration expects {len(listed)} "
            f"{kind}s, model provides {len(signature)}"
        )
    for index, tensor in enumerate(listed):
        where = f"{prefix}: {kind}[{index}] '{tensor.name}'"
        found = by_name.get(tensor.name)
        if found is None:
            names = ", ".join(sorted(by_name))
            problems.append(
                f"{where}: unexpected inference {kind} '{tensor.name}', allowed {kind}s are: {names}"
            )
            continue
        if tensor.data_type == pb.TYPE_INVALID:
            tensor.data_type = found.data_type
        elif tensor.data_type != found.data_type:
            problems.append(
                f"{where}.data_type: unable to load model '{config.name}', configuration expects datatype "
                f"{pb.DataType.Name(tensor.data_type)} for {kind} '{tensor.name}', model provides "
                f"{pb.DataType.Name(found.data_type)}"
            )
        if not tensor.dims:
            tensor.dims.extend(found.shape[skip:])
            continue
        problem = _compare_dims(config, tensor, found, skip)
        if problem:
            problems.append(f"{where}.dims: {problem}")


def _compare_dims(config: pb.ModelConfig, tensor: Any, found: TensorSignature, skip: int) -> str | None:
    """Triton's comparison of the model's shape with the config's (reshape when given)."""
    dims = list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)
    full = [-1] * skip + dims
    model = list(found.shape)
    head = f"model '{config.name}', tensor '{tensor.name}': the model expects"
    if len(full) != len(model):
        how = (
            "an initial batch dimension because max_batch_size > 0 followed by the explicit tensor shape, "
            f"making complete shape {full}"
            if skip
            else f"shape {full}"
        )
        return (
            f"{head} {len(model)} dimensions (shape {model}) but the model configuration specifies "
            f"{len(full)} dimensions ({how})"
        )
    if any(m != -1 and m != c for m, c in zip(model[skip:], dims, strict=True)):
        return f"{head} dims {model[skip:]} but the model configuration specifies dims {dims}"
    return None
