"""PyTorch backend for TorchScript models (``platform: "pytorch_libtorch"`` / ``backend: "pytorch"``).

Tensor naming follows Triton's libtorch backend: config inputs that name the
``forward`` arguments are passed by those names; otherwise names of the form
``<anything>__<index>`` give the argument position; otherwise the config order
is the argument order. Outputs: a dict maps by key; a tuple or list maps by the
``__<index>`` suffix of the output names (or config order); a single tensor is
the only output. BYTES tensors travel as ``List[str]``. The model runs on
``cuda:<device_id>`` for GPU instances, under ``torch.inference_mode()``.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch

from deployments import tensors
from deployments.backends.tensor import TensorBackend
from deployments.inference import Tensor
from repository_loader.errors import InternalError, InvalidArgument, Unavailable
from repository_loader.model import InstanceKind

_INDEXED = re.compile(r"^.*__(\d+)$")


def _index_of(name: str) -> int | None:
    match = _INDEXED.match(name)
    return int(match.group(1)) if match else None


def argument_order(config_names: list[str], forward_args: list[str]) -> list[str] | None:
    """Config input names in ``forward`` argument order, or ``None`` if they cannot be placed."""
    if forward_args and set(config_names) <= set(forward_args):
        return [a for a in forward_args if a in config_names]
    indexes = [_index_of(n) for n in config_names]
    if all(i is not None for i in indexes) and len(set(indexes)) == len(indexes):
        return [n for _, n in sorted(zip(indexes, config_names, strict=True))]
    return None


class PyTorchBackend(TensorBackend):
    """A TorchScript module on one device."""

    module: Any

    def load(self) -> None:
        path = self.model_path()
        if not path.exists():
            raise Unavailable(
                f"model '{self.model.name}' version {self.context.version}: no model file at {path}"
            )
        if self.context.instance_kind == InstanceKind.GPU:
            if not torch.cuda.is_available():
                raise Unavailable(
                    f"model '{self.model.name}' asks for a GPU instance but torch sees no CUDA device"
                )
            self.device = torch.device(f"cuda:{self.context.device_id}")
        else:
            self.device = torch.device("cpu")
        try:
            self.module = torch.jit.load(str(path), map_location=self.device)
        except Exception as error:
            raise Unavailable(
                f"model '{self.model.name}': torch.jit.load failed for {path}: {error}"
            ) from None
        self.module.eval()
        self._arg_names = self._forward_arguments()
        names = [i.name for i in self.model.inputs]
        order = argument_order(names, self._arg_names)
        self._order = order if order is not None else names
        self._bytes_inputs = {i.name for i in self.model.inputs if i.datatype == "BYTES"}

    def _forward_arguments(self) -> list[str]:
        try:
            return [a.name for a in self.module.forward.schema.arguments][1:]
        except AttributeError:
            return []

    def unload(self) -> None:
        self.__dict__.pop("module", None)

    def run(self, inputs: dict[str, Tensor], output_names: list[str]) -> dict[str, Tensor]:
        args = [self._argument(name, inputs[name]) for name in self._order if name in inputs]
        with torch.inference_mode():
            result = self.module(*args)
        return self._map_outputs(result)

    def _argument(self, name: str, array: Any) -> Any:
        if name in self._bytes_inputs:
            flat = np.asarray(array, dtype=object).reshape(-1)
            return [b.decode("utf-8") if isinstance(b, bytes) else str(b) for b in flat]
        return tensors.to_torch(array, self.device)

    def _map_outputs(self, result: Any) -> dict[str, Tensor]:
        names = [o.name for o in self.model.outputs]
        if isinstance(result, dict):
            mapped = {name: value for name, value in result.items() if name in names}
        elif isinstance(result, (tuple, list)) and not _is_string_list(result):
            mapped = {name: result[self._position(name, i, len(result))] for i, name in enumerate(names)}
        elif len(names) == 1:
            mapped = {names[0]: result}
        else:
            raise InternalError(
                f"model '{self.model.name}' returned one tensor but its config declares {len(names)} outputs"
            )
        return {name: self._shaped(name, _output(value)) for name, value in mapped.items()}

    def _shaped(self, name: str, value: Tensor) -> Tensor:
        """``List[str]`` outputs come flat: give them the configured dims."""
        spec = self.model.output(name)
        if spec is None or spec.datatype != "BYTES" or -1 in spec.dims or spec.reshape is not None:
            return value
        shape = (-1, *spec.dims) if self.model.max_batch_size > 0 else tuple(spec.dims)
        return value.reshape(shape)

    def _position(self, name: str, default: int, count: int) -> int:
        index = _index_of(name)
        position = index if index is not None else default
        if position >= count:
            raise InternalError(
                f"model '{self.model.name}' returned {count} outputs, none at position {position} for '{name}'"
            )
        return position


def _is_string_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _output(value: Any) -> Tensor:
    if isinstance(value, torch.Tensor):
        return value.numpy() if value.device.type == "cpu" and value.dtype != torch.bfloat16 else value
    if _is_string_list(value):
        out = np.empty(len(value), dtype=object)
        out[:] = [s.encode("utf-8") for s in value]
        return out
    raise InvalidArgument(f"a TorchScript output of type {type(value).__name__} has no tensor form")
