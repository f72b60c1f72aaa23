"""``model_warmup``: the requests a model version runs before it reports ready."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from deployments.inference import InferRequest
from repository_loader import datatypes
from repository_loader.errors import ConfigError
from repository_loader.model import ModelDescription, WarmupInput, WarmupSample


def _tensor(model: ModelDescription, sample: WarmupSample, name: str, spec: WarmupInput) -> np.ndarray:
    shape = list(spec.dims)
    if model.max_batch_size > 0:
        shape = [max(sample.batch_size, 1), *shape]
    count = int(np.prod(shape)) if shape else 1
    if spec.datatype == "BYTES":
        if spec.source == "input_data_file":
            raw = _read_file(model, sample, spec)
            flat = datatypes.deserialize_bytes_tensor(raw)
            return np.resize(flat, count).reshape(shape)
        fill = b"" if spec.source == "zero_data" else b"warmup"
        out = np.empty(count, dtype=object)
        out[:] = [fill] * count
        return out.reshape(shape)
    dtype = datatypes.to_numpy_dtype(spec.datatype)
    if spec.source == "random_data":
        rng = np.random.default_rng(0)
        if dtype.kind == "f":
            return rng.random(shape).astype(dtype)
        if dtype.kind == "b":
            return rng.integers(0, 2, shape).astype(dtype)
        return rng.integers(0, 8, shape).astype(dtype)
    if spec.source == "input_data_file":
        raw = _read_file(model, sample, spec)
        arr = np.frombuffer(raw, dtype=dtype)
        if arr.size < count:
            raise ConfigError(
                f"model '{model.name}': warmup '{sample.name}' input '{name}': file "
                f"'{spec.input_data_file}' holds {arr.size} elements, {count} needed"
            )
        return arr[:count].reshape(shape)
    return np.zeros(shape, dtype=dtype)


def _read_file(model: ModelDescription, sample: WarmupSample, spec: WarmupInput) -> bytes:
    path = Path(model.path) / "warmup" / str(spec.input_data_file)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"model '{model.name}': warmup '{sample.name}': cannot read input_data_file '{path}': {exc}"
        ) from None


def warmup_requests(model: ModelDescription, version: int) -> list[InferRequest]:
    """Every warmup request of ``model``, each sample repeated ``count`` times."""
    requests = []
    for sample in model.warmup:
        inputs = {name: _tensor(model, sample, name, spec) for name, spec in sample.inputs.items()}
        for i in range(max(sample.count, 1)):
            requests.append(
                InferRequest(
                    model_name=model.name,
                    model_version=str(version),
                    inputs=dict(inputs),
                    id=f"warmup:{sample.name}:{i}",
                )
            )
    return requests
