"""Triton's trace settings: the global setting, each model's own, and Triton's rules for both.

A model's setting is the global one overlaid with the keys set for that model; a key set to null
(HTTP) or to no value (gRPC) is cleared, so the model follows the global value again, and a global
key cleared returns to what the server started with (``--trace-config``). ``trace_file`` cannot be
changed over the network. Every change gives a new :class:`TraceState` with a higher version: the
plain, picklable value every process decides from (``deployments.tracing.spans``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from deployments.tracing.config import LEVELS, TraceConfig
from repository_loader.errors import InvalidArgument, Unsupported

UINT32_MAX = 2**32 - 1
INT32_MAX = 2**31 - 1
KEYS = ("trace_level", "trace_rate", "trace_count", "log_frequency")


@dataclass(frozen=True)
class Setting:
    """One effective setting: what a model's requests are traced by."""

    level: tuple[str, ...]  # () = OFF
    rate: int
    count: int  # -1: no limit
    log_frequency: int


@dataclass(frozen=True)
class TraceState:
    """Everything a process needs to decide whether to trace a request; ``version`` orders them."""

    version: int = 0
    defaults: Setting = Setting((), 1000, -1, 0)
    global_values: Mapping[str, Any] = field(default_factory=dict)  # key -> value set over the defaults
    models: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # model -> its own keys

    def effective(self, model: str | None = None) -> Setting:
        values = {**_as_values(self.defaults), **self.global_values}
        if model:
            values.update(self.models.get(model, {}))
        return Setting(
            values["trace_level"], values["trace_rate"], values["trace_count"], values["log_frequency"]
        )

    def count_owner(self, model: str) -> str | None:
        """Whose ``trace_count`` a traced request of ``model`` uses up: the model's (its name) or the
        global one (None)."""
        return model if "trace_count" in self.models.get(model, {}) else None

    @property
    def any_on(self) -> bool:
        """Whether some setting (global or a model's) traces at any level."""
        if self.effective().level:
            return True
        return any(values.get("trace_level") for values in self.models.values())


def _as_values(setting: Setting) -> dict[str, Any]:
    return {
        "trace_level": setting.level,
        "trace_rate": setting.rate,
        "trace_count": setting.count,
        "log_frequency": setting.log_frequency,
    }


class TraceSettings:
    """The server's trace settings (the server application holds the one authoritative copy)."""

    def __init__(self, config: TraceConfig) -> None:
        self.config = config
        defaults = Setting(config.level, config.rate, config.count, config.log_frequency)
        self.state = TraceState(defaults=defaults)

    def document(self, model: str | None = None) -> dict[str, Any]:
        """The setting as Triton answers it (``GET v2[/models/<m>]/trace/setting``)."""
        return setting_document(self.state, self.config, model)

    def update(self, model: str | None, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Apply ``changes`` (already read by :func:`read_changes`); the resulting document."""
        if changes:
            scope = dict(self.state.models.get(model, {})) if model else dict(self.state.global_values)
            for key, value in changes.items():
                if value is None:
                    scope.pop(key, None)
                else:
                    scope[key] = value
            self._replace(model, scope)
        return self.document(model)

    def take(self, model: str) -> bool:
        """Use up one of the traces the count of ``model``'s setting allows; False where none is left."""
        count = self.state.effective(model).count
        if count < 0:
            return True
        if count == 0:
            return False
        owner = self.state.count_owner(model)
        scope = dict(self.state.models[owner]) if owner else dict(self.state.global_values)
        scope["trace_count"] = count - 1
        self._replace(owner, scope)
        return True

    def _replace(self, model: str | None, scope: dict[str, Any]) -> None:
        state = self.state
        if model:
            models = {**state.models, model: scope}
            if not scope:
                models.pop(model)
            self.state = TraceState(state.version + 1, state.defaults, state.global_values, models)
        else:
            self.state = TraceState(state.version + 1, state.defaults, scope, state.models)


def setting_document(state: TraceState, config: TraceConfig, model: str | None = None) -> dict[str, Any]:
    """Triton's answer: level, rate, count, the file and log frequency in ``triton`` mode, the mode, and
    the mode's own options (``opentelemetry``: url and the batch span processor's sizes)."""
    setting = state.effective(model)
    document: dict[str, Any] = {
        "trace_level": list(setting.level) or ["OFF"],
        "trace_rate": str(setting.rate),
        "trace_count": str(setting.count),
    }
    if not config.opentelemetry:
        document["log_frequency"] = str(setting.log_frequency)
        document["trace_file"] = config.file
    document["trace_mode"] = config.mode
    document.update(config.mode_options())
    return document


def read_changes(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The changes a trace setting request asks for, checked with Triton's rules and wording: key ->
    new value, or None to clear it. Keys Triton does not change are ignored, as it ignores them."""
    if "trace_file" in settings:
        raise Unsupported("trace file location can not be updated through network protocol")
    changes: dict[str, Any] = {}
    for key in KEYS:
        if key not in settings:
            continue
        value = settings[key]
        if value is None:
            changes[key] = None
        elif key == "trace_level":
            changes[key] = _levels(value)
        elif key == "trace_count":
            changes[key] = _number(key, value, -1, INT32_MAX)
        else:
            changes[key] = _number(key, value, 0, UINT32_MAX)
    return changes


def _levels(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        raise InvalidArgument("trace setting 'trace_level' must be an array of strings")
    names = [str(v) for v in value]
    if "OFF" in names:
        if len(names) != 1:
            raise InvalidArgument("Expect only one trace level 'OFF' is specified")
        return ()
    unknown = [n for n in names if n not in LEVELS]
    if unknown:
        raise InvalidArgument(f"unsupported trace level '{unknown[0]}': expected OFF, TIMESTAMPS or TENSORS")
    return tuple(level for level in LEVELS if level in names)


def _number(key: str, value: Any, least: int, most: int) -> int:
    text = str(value).strip()
    try:
        number = int(text)
    except ValueError:
        raise InvalidArgument(f"Unable to parse '{key}', got: {text}") from None
    if key == "trace_count" and -INT32_MAX - 1 <= number < least:
        raise InvalidArgument(f"Unable to parse 'trace_count'. Expecting value >= {least}, got:{text}")
    if not least <= number <= min(most, INT32_MAX):
        raise InvalidArgument(
            f"Unable to parse '{key}', value is out of range [ {least}, {most} ], got: {text}"
        )
    return number


__all__ = ["KEYS", "Setting", "TraceSettings", "TraceState", "read_changes", "setting_document"]
