"""Triton's ``--trace-config`` flags, read once at start (``ServerSettings.trace``).

Each flag is ``<setting>=<value>`` (a global setting: ``level``, ``rate``, ``count``, ``mode``) or
``<mode>,<setting>=<value>`` (``triton,file=...``, ``triton,log-frequency=...``,
``opentelemetry,url=...``, ``opentelemetry,resource=<key>=<value>``,
``opentelemetry,bsp_max_queue_size=...``, ``bsp_schedule_delay``, ``bsp_max_export_batch_size``).
``level`` may be given more than once (``TIMESTAMPS`` and ``TENSORS``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

MODES = ("triton", "opentelemetry")
LEVELS = ("TIMESTAMPS", "TENSORS")
DEFAULT_URL = "http://localhost:4318/v1/traces"
INT32_MAX = 2**31 - 1


class TraceConfigError(ValueError):
    """A ``--trace-config`` flag tritonserver would refuse; the message says which and why."""


@dataclass(frozen=True)
class TraceConfig:
    """The trace settings the server starts with (the global setting a clear returns to)."""

    level: tuple[str, ...] = ()  # () = OFF; else a subset of LEVELS, in LEVELS order
    rate: int = 1000
    count: int = -1
    mode: str = "triton"
    file: str = ""
    log_frequency: int = 0
    url: str = DEFAULT_URL
    resource: tuple[tuple[str, str], ...] = (("service.name", "triton-inference-server"),)
    bsp_max_queue_size: int = 2048
    bsp_schedule_delay: int = 5000  # milliseconds
    bsp_max_export_batch_size: int = 512
    flags: tuple[str, ...] = field(default=(), compare=False)  # as given, for ``to_args``

    @property
    def opentelemetry(self) -> bool:
        return self.mode == "opentelemetry"

    def mode_options(self) -> dict[str, str]:
        """What Triton lists of the mode's own options beside the settings (never file or frequency)."""
        if not self.opentelemetry:
            return {}
        return {
            "url": self.url,
            "bsp_max_queue_size": str(self.bsp_max_queue_size),
            "bsp_schedule_delay": str(self.bsp_schedule_delay),
            "bsp_max_export_batch_size": str(self.bsp_max_export_batch_size),
        }


def endpoint(url: str) -> str:
    """The OTLP/HTTP address to post to: ``url`` with ``http://`` where it names no scheme."""
    return url if "://" in url else f"http://{url}"


def parse_trace_config(flags: Iterable[str]) -> TraceConfig:
    """The :class:`TraceConfig` of ``--trace-config`` flags, in order (a later value wins)."""
    given = tuple(str(f) for f in flags)
    values: dict[str, object] = {}
    levels: list[str] = []
    resource: dict[str, str] = dict(TraceConfig().resource)
    for flag in given:
        mode, _, rest = flag.partition(",") if "," in flag.split("=", 1)[0] else ("", "", flag)
        key, sep, value = rest.partition("=")
        key = key.strip()
        if not sep or not key:
            raise TraceConfigError(
                f"--trace-config '{flag}': expected <setting>=<value> or <mode>,<setting>=<value>"
            )
        if mode and mode not in MODES:
            raise TraceConfigError(
                f"--trace-config '{flag}': unknown trace mode '{mode}'; expected {' or '.join(MODES)}"
            )
        if not mode:
            _global(flag, key, value, values, levels)
        elif mode == "triton":
            _triton(flag, key, value, values)
        else:
            _opentelemetry(flag, key, value, values, resource)
    if levels:
        values["level"] = () if levels == ["OFF"] else tuple(lv for lv in LEVELS if lv in levels)
    values["resource"] = tuple(resource.items())
    config = TraceConfig(flags=given, **values)  # type: ignore[arg-type]
    if config.bsp_max_export_batch_size > config.bsp_max_queue_size:
        raise TraceConfigError(
            "--trace-config opentelemetry,bsp_max_export_batch_size must not exceed bsp_max_queue_size"
        )
    return config


def _global(flag: str, key: str, value: str, values: dict[str, object], levels: list[str]) -> None:
    if key == "level":
        level = value.strip().upper()
        if level not in ("OFF", *LEVELS):
            raise TraceConfigError(f"--trace-config '{flag}': level must be OFF, TIMESTAMPS or TENSORS")
        levels.append(level)
    elif key == "rate":
        values["rate"] = _number(flag, value, 0)
    elif key == "count":
        values["count"] = _number(flag, value, -1)
    elif key == "mode":
        if value.strip() not in MODES:
            raise TraceConfigError(f"--trace-config '{flag}': mode must be {' or '.join(MODES)}")
        values["mode"] = value.strip()
    else:
        raise TraceConfigError(f"--trace-config '{flag}': unknown global trace setting '{key}'")


def _triton(flag: str, key: str, value: str, values: dict[str, object]) -> None:
    if key == "file":
        values["file"] = value
    elif key == "log-frequency":
        values["log_frequency"] = _number(flag, value, 0)
    else:
        raise TraceConfigError(f"--trace-config '{flag}': unknown triton trace setting '{key}'")


def _opentelemetry(
    flag: str, key: str, value: str, values: dict[str, object], resource: dict[str, str]
) -> None:
    if key == "url":
        values["url"] = value  # as given (Triton answers it so); ``endpoint`` adds a scheme
    elif key == "resource":
        name, sep, text = value.partition("=")
        if not sep or not name:
            raise TraceConfigError(f"--trace-config '{flag}': resource must be <key>=<value>")
        resource[name] = text
    elif key in ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size"):
        values[key] = _number(flag, value, 1 if key != "bsp_schedule_delay" else 0)
    else:
        raise TraceConfigError(f"--trace-config '{flag}': unknown opentelemetry trace setting '{key}'")


def _number(flag: str, value: str, least: int) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise TraceConfigError(f"--trace-config '{flag}': '{value}' is not an integer") from None
    if not least <= number <= INT32_MAX:
        raise TraceConfigError(f"--trace-config '{flag}': {number} is out of range [{least}, {INT32_MAX}]")
    return number


__all__ = [
    "DEFAULT_URL",
    "endpoint",
    "LEVELS",
    "MODES",
    "TraceConfig",
    "TraceConfigError",
    "parse_trace_config",
]
