"""Triton's rules for a model's inputs, outputs, reshapes and batch inputs/outputs.

Messages carry Triton's wording (``ValidateIOShape``, ``ValidateModelInput``,
``ValidateBatchIO``) after the field they are about, so a log line grepped for
Triton's text finds ours.
"""

from __future__ import annotations

from repository_loader import platforms
from repository_loader.findings import DIMS_RULE, Findings, ModelFiles, check_dims, check_unique
from repository_loader.proto import model_config_pb2 as pb

_BATCH_INPUT_TYPES = (pb.TYPE_INT32, pb.TYPE_FP32)
_ONE_SOURCE_KINDS = frozenset(pb.BatchInput.Kind.values())
_NCHW_FORMATS = (pb.ModelInput.FORMAT_NHWC, pb.ModelInput.FORMAT_NCHW)
Tensor = pb.ModelInput | pb.ModelOutput


def check_tensors(config: pb.ModelConfig, findings: Findings, files: ModelFiles) -> None:
    """Every input and output, one by one, then the names across them."""
    is_trt = platforms.backend_for(config.platform, config.backend) == "tensorrt"
    for kind, tensors in (("input", config.input), ("output", config.output)):
        check_unique((t.name for t in tensors), kind, findings)
        for index, tensor in enumerate(tensors):
            where = f"{kind}[{index}]" + (f" '{tensor.name}'" if tensor.name else "")
            check_io_shape(tensor, f"model {kind} ", config, where, findings)
            if tensor.is_shape_tensor and not is_trt:
                findings.add(
                    f"{where}.is_shape_tensor",
                    f"shape tensors are only supported for TensorRT platform for {config.name}",
                )
            _check_non_linear(tensor, kind, is_trt, config.name, where, findings)
    for index, tensor in enumerate(config.input):
        if tensor.format in _NCHW_FORMATS and len(tensor.dims) != 3:
            findings.add(
                f"input[{index}] '{tensor.name}'.format",
                f"model input NHWC/NCHW require 3 dims for {config.name} (got {list(tensor.dims)})",
            )
    for index, output in enumerate(config.output):
        if output.label_filename and not files.exists(output.label_filename):
            findings.add(
                f"output[{index}] '{output.name}'.label_filename",
                f"label file '{output.label_filename}' not found in the model folder",
            )


def check_io_shape(
    tensor: Tensor, prefix: str, config: pb.ModelConfig, where: str, findings: Findings
) -> None:
    """Triton's ``ValidateIOShape``: name, data type, dims and reshape of one tensor."""
    suffix = f" for {config.name}"
    if not tensor.name:
        findings.add(f"{where}.name", f"{prefix}must specify 'name'{suffix}")
    named = f"{prefix}'{tensor.name}' "
    if tensor.data_type == pb.TYPE_INVALID:
        findings.add(f"{where}.data_type", f"{named}must specify 'data_type'{suffix} (e.g. TYPE_FP32)")
    if not tensor.dims:
        findings.add(
            f"{where}.dims",
            f"{named}must specify 'dims'{suffix} (use dims: [ 1 ] with reshape: {{ shape: [ ] }} for scalars)",
        )
    check_dims(tensor.dims, f"{where}.dims", findings, named)
    if not tensor.HasField("reshape"):
        return
    shape = list(tensor.reshape.shape)
    if not shape and config.max_batch_size == 0:
        findings.add(
            f"{where}.reshape",
            f"{named}cannot have empty reshape for non-batching model as scalar tensors are not supported"
            + suffix,
        )
    if any(d == 0 or d < -1 for d in shape):
        findings.add(f"{where}.reshape.shape", f"{named}reshape {DIMS_RULE}{suffix} (got {shape})")
        return
    problem = reshape_problem(list(tensor.dims), shape)
    if problem:
        findings.add(
            f"{where}.reshape", f"{named}{problem}{suffix} (dims {list(tensor.dims)}, reshape {shape})"
        )


def _element_count(dims: list[int]) -> int:
    """Triton's element count: -1 when any dimension is variable, 0 for an empty shape."""
    if not dims:
        return 0
    count = 1
    for dim in dims:
        if dim == -1:
            return -1
        count *= dim
    return count


def _chunks(dims: list[int]) -> list[int]:
    """Element counts of the runs of fixed dimensions between variable-size ones."""
    counts, current = [], 1
    for dim in dims:
        if dim == -1:
            counts.append(current)
            current = 1
        else:
            current *= dim
    return [*counts, current]


def reshape_problem(dims: list[int], shape: list[int]) -> str | None:
    """Why ``reshape`` cannot stand for ``dims`` (Triton's words), or None.

    Equal element counts, or an empty reshape for a one-element tensor; with
    variable-size dimensions, each run of fixed dimensions between them must
    hold as many elements on both sides ([2, 4, -1, 6] -> [8, -1, 1, 6] is fine).
    """
    dims_size, shape_size = _element_count(dims), _element_count(shape)
    if dims_size != shape_size and (shape_size != 0 or dims_size != 1):
        return "has different size for dims and reshape"
    if dims_size == -1:
        dim_chunks, shape_chunks = _chunks(dims), _chunks(shape)
        if len(dim_chunks) != len(shape_chunks):
            return "has different number of variable-size dimensions for dims and reshape"
        if dim_chunks != shape_chunks:
            return "has different size for dims and reshape"
    return None


def _check_non_linear(
    tensor: Tensor, kind: str, is_trt: bool, model: str, where: str, findings: Findings
) -> None:
    if not tensor.is_non_linear_format_io:
        return
    if not is_trt:
        findings.add(
            f"{where}.is_non_linear_format_io",
            f"Non-linear IO format is only supported for the TensorRT platform for {model}",
        )
    elif len(tensor.dims) != 3:
        findings.add(
            f"{where}.is_non_linear_format_io", f"Non-linear IO format {kind} requires 3 dims for {model}"
        )


def check_batch_io(config: pb.ModelConfig, findings: Findings) -> None:
    """Triton's ``ValidateBatchIO``: kinds, source inputs, target outputs and data types."""
    inputs = {t.name for t in config.input}
    outputs = {t.name for t in config.output}
    suffix = f" for {config.name}"
    if (config.batch_input or config.batch_output) and config.max_batch_size == 0:
        findings.add("batch_input", "batch inputs and outputs need max_batch_size > 0")
    for index, item in enumerate(config.batch_input):
        where = f"batch_input[{index}]"
        if not item.target_name:
            findings.add(f"{where}.target_name", "must name at least one input")
        if item.kind in _ONE_SOURCE_KINDS and len(item.source_input) != 1:
            findings.add(
                f"{where}.source_input",
                f"batch input kind '{pb.BatchInput.Kind.Name(item.kind)}' expects 1 source input, "
                f"got {len(item.source_input)}{suffix}",
            )
        if item.data_type not in _BATCH_INPUT_TYPES:
            findings.add(
                f"{where}.data_type", f"batch input data type must be TYPE_INT32 or TYPE_FP32{suffix}"
            )
        for source in item.source_input:
            if source not in inputs:
                findings.add(f"{where}.source_input", f"unknown source input name '{source}'{suffix}")
    for index, out in enumerate(config.batch_output):
        where = f"batch_output[{index}]"
        if out.kind in pb.BatchOutput.Kind.values() and len(out.source_input) != 1:
            findings.add(
                f"{where}.source_input",
                f"batch output kind '{pb.BatchOutput.Kind.Name(out.kind)}' expects 1 source input, "
                f"got {len(out.source_input)}{suffix}",
            )
        for source in out.source_input:
            if source not in inputs:
                findings.add(f"{where}.source_input", f"unknown source input name '{source}'{suffix}")
        seen: set[str] = set()
        for target in out.target_name:
            if target not in outputs:
                findings.add(f"{where}.target_name", f"unknown target output name '{target}'{suffix}")
            if target in seen:
                findings.add(
                    f"{where}.target_name",
                    f"target output name '{target}' can only be specified once{suffix}",
                )
            seen.add(target)
