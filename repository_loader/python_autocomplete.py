"""Auto-complete for Python-backend models: ``TritonPythonModel.auto_complete_config``.

The user's ``model.py`` is imported under a private module name (its folder on
``sys.path`` only while importing) and its static ``auto_complete_config`` is
called with an :class:`AutoCompleteModelConfig`, the object Triton's Python
backend passes, offering the same methods.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import importlib.util
import itertools
import json
import re
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

from repository_loader.config import config_from_json, config_to_json
from repository_loader.errors import ConfigError
from repository_loader.proto import model_config_pb2 as pb

_INPUT_PROPERTIES = ("name", "data_type", "dims", "optional")
_OUTPUT_PROPERTIES = ("name", "data_type", "dims")
# What the ModelConfig methods change; anything else changed through as_dict() is refused.
_COMPLETABLE = frozenset(
    {"max_batch_size", "input", "output", "dynamic_batching", "model_transaction_policy"}
)
_counter = itertools.count()
# the version folder of the model whose auto_complete_config runs in this context (``get_model_dir()``)
COMPLETING_MODEL_DIR: contextvars.ContextVar[str] = contextvars.ContextVar("completing_model_dir", default="")
_IMPORTING = threading.RLock()  # held while a model.py is imported (see import_model_module)


class AutoCompleteModelConfig:
    """The model configuration a Python model's ``auto_complete_config`` may complete.

    Only ``max_batch_size``, inputs, outputs, dynamic batching and the
    transaction policy can change, as in Triton. Methods raise ``ValueError``
    where Triton's do.
    """

    def __init__(self, model_config: dict[str, Any] | str | bytes) -> None:
        # Triton's stub hands the configuration over as JSON text; a dict is accepted as well.
        config: dict[str, Any] = (
            json.loads(model_config) if isinstance(model_config, (str, bytes)) else model_config
        )
        self._model_config = copy.deepcopy(config)
        self._model_config.setdefault("max_batch_size", 0)
        self._model_config.setdefault("input", [])
        self._model_config.setdefault("output", [])

    def as_dict(self) -> dict[str, Any]:
        """The configuration as a dict in Triton's JSON form."""
        return self._model_config

    def get_max_batch_size(self) -> int:
        return int(self._model_config["max_batch_size"])

    def get_inputs(self) -> list[dict[str, Any]]:
        return list(self._model_config["input"])

    def get_outputs(self) -> list[dict[str, Any]]:
        return list(self._model_config["output"])

    @property
    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Set ``max_batch_size``; it may not go below a non-zero value the config file sets."""
        current = int(self._model_config["max_batch_size"])
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config "
                f"function for model '{self._name}' specified max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = int(max_batch_size)

    def set_dynamic_batching(self) -> None:
        """Use the dynamic batcher, unless another scheduler is configured (then raise)."""
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but auto-complete-config "
                    f"function for model '{self._name}' tries to set scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:  # noqa: A002 - Triton's parameter name
        """Add an input, or complete the config's input of the same name."""
        self._add_tensor("input", input, _INPUT_PROPERTIES)

    def add_output(self, output: dict[str, Any]) -> None:
        """Add an output, or complete the config's output of the same name."""
        self._add_tensor("output", output, _OUTPUT_PROPERTIES)

    def _add_tensor(self, kind: str, tensor: dict[str, Any], allowed: tuple[str, ...]) -> None:
        label = f"{kind} '{tensor.get('name', '')}' in auto-complete-config function for model '{self._name}'"
        extra = [key for key in tensor if key not in allowed]
        if extra:
            names = ", ".join(f"'{p}'" for p in allowed[:-1]) + f" and '{allowed[-1]}'"
            raise ValueError(f"{label} contains property other than {names}: {', '.join(extra)}")
        if "name" not in tensor:
            raise ValueError(
                f"{kind} in auto-complete-config function for model '{self._name}' is missing 'name' property."
            )
        for required in ("data_type", "dims"):
            if required not in tensor:
                raise ValueError(f"{label} is missing '{required}' property.")
        for current in self._model_config[kind]:
            if current.get("name") == tensor["name"]:
                self._merge(kind, current, tensor)
                return
        self._model_config[kind].append(dict(tensor, dims=list(tensor["dims"])))

    def _merge(self, kind: str, current: dict[str, Any], tensor: dict[str, Any]) -> None:
        name = tensor["name"]
        configured_type = current.get("data_type", "TYPE_INVALID")
        if configured_type != "TYPE_INVALID" and configured_type != tensor["data_type"]:
            raise ValueError(
                f"unable to load model '{self._name}', configuration expects datatype {configured_type} "
                f"for {kind} '{name}', model provides {tensor['data_type']}"
            )
        configured_dims = list(current.get("dims") or [])
        if configured_dims and configured_dims != list(tensor["dims"]):
            raise ValueError(
                f"model '{self._name}', tensor '{name}': the model expects dims {list(tensor['dims'])} "
                f"but the model configuration specifies dims {configured_dims}"
            )
        if "optional" in tensor and current.get("optional", tensor["optional"]) != tensor["optional"]:
            raise ValueError(
                f"model '{self._name}', {kind} '{name}': auto_complete_config gives optional "
                f"{tensor['optional']} but the configuration specifies {current['optional']}"
            )
        current["data_type"] = tensor["data_type"]
        current["dims"] = list(tensor["dims"])
        if "optional" in tensor:
            current["optional"] = tensor["optional"]

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        """Set ``model_transaction_policy`` (only ``decoupled``); it may not flip a configured value."""
        extra = [key for key in transaction_policy_dict if key != "decoupled"]
        if extra:
            raise ValueError(
                f"model transaction policy in auto_complete_config of model '{self._name}' has "
                f"properties other than 'decoupled': {', '.join(extra)}"
            )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = bool(transaction_policy_dict["decoupled"])
            # proto3 cannot tell an explicit "decoupled: false" from an absent one; only a
            # configured true is protected.
            if bool(policy.get("decoupled", False)) and not wanted:
                raise ValueError(
                    f"trying to change decoupled property in auto-complete-config for model "
                    f"'{self._name}', which is already set to {policy['decoupled']}"
                )
            policy["decoupled"] = wanted


def import_model_module(path: Path, model_name: str) -> ModuleType:
    """Import a user's ``model.py`` under a private name, without keeping it in ``sys.modules``."""
    safe = re.sub(r"\W", "_", model_name)
    module_name = f"_triton_serve_autocomplete_{safe}_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"model '{model_name}': cannot import '{path}'")
    module = importlib.util.module_from_spec(spec)
    folder = str(path.parent)
    # One import at a time: the server reads several models at once (in threads), and a folder on
    # ``sys.path`` is every thread's. Only this import's own entry is taken out again, so what other
    # code added meanwhile stays.
    with _IMPORTING:
        sys.path.insert(0, folder)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as exc:
            raise ConfigError(
                f"model '{model_name}': importing '{path}' failed: {type(exc).__name__}: {exc}"
            ) from None
        finally:
            with contextlib.suppress(ValueError):
                sys.path.remove(folder)
            sys.modules.pop(module_name, None)
    return module


def complete_python(
    config: pb.ModelConfig, model_file: Path, model_dir: Path | None = None
) -> pb.ModelConfig:
    """Run the model's ``auto_complete_config`` (when it has one) and return the completed config;
    ``model_dir`` (default: the file's folder) is what ``pb_utils.get_model_dir()`` answers meanwhile."""
    module = import_model_module(model_file, config.name)
    model_class = getattr(module, "TritonPythonModel", None)
    if model_class is None:
        raise ConfigError(f"model '{config.name}': '{model_file}' defines no class TritonPythonModel")
    hook = getattr(model_class, "auto_complete_config", None)
    if hook is None:
        return config
    before = config_to_json(config)
    wrapper = AutoCompleteModelConfig(copy.deepcopy(before))
    token = COMPLETING_MODEL_DIR.set(str(model_dir or model_file.parent))
    try:
        result = hook(wrapper)
    except Exception as exc:
        raise ConfigError(
            f"model '{config.name}': auto_complete_config failed: {type(exc).__name__}: {exc}"
        ) from None
    finally:
        COMPLETING_MODEL_DIR.reset(token)
    if not isinstance(result, AutoCompleteModelConfig):
        raise ConfigError(
            f"model '{config.name}' ({model_file.parent.name}/{model_file.name}): auto_complete_config: "
            f"auto_complete_config function for model '{config.name}' must return a valid "
            f"pb_utils.ModelConfig object, got {type(result).__name__} (return the object it was given)"
        )
    completed = result.as_dict()
    _check_untouched(config, before, completed, model_file)
    return config_from_json(completed, source=f"model '{config.name}' auto_complete_config result")


def _check_untouched(
    config: pb.ModelConfig, before: dict[str, Any], after: dict[str, Any], model_file: Path
) -> None:
    """auto_complete_config may change only what its methods change (as in Triton)."""
    changed = sorted(
        key for key in {*before, *after} if key not in _COMPLETABLE and before.get(key) != after.get(key)
    )
    if changed:
        raise ConfigError(
            f"model '{config.name}' ({model_file.parent.name}/{model_file.name}): auto_complete_config: "
            f"changes {', '.join(repr(k) for k in changed)}, which auto-complete may not set (only "
            f"{', '.join(sorted(_COMPLETABLE))}); set them in config.pbtxt"
        )
