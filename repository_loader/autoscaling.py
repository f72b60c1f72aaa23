"""Autoscaling a model's replicas, from its config ``parameters`` (beyond Triton).

Triton's instance counts are fixed. On Ray a model can grow and shrink with its load: the keys
``ray.autoscaling.<field>`` of a model's ``parameters`` turn on Serve's autoscaling for the model's
first instance group (its own application; later groups keep their fixed counts)::

    parameters { key: "ray.autoscaling.min_replicas" value: { string_value: "1" } }
    parameters { key: "ray.autoscaling.max_replicas" value: { string_value: "4" } }
    parameters { key: "ray.autoscaling.target_ongoing_requests" value: { string_value: "8" } }

``min_replicas`` and ``max_replicas`` are required; the rest take Serve's defaults. The group's
``count`` is not used while autoscaling is on: the model starts with ``initial_replicas`` (default
``min_replicas``). A replica's ongoing requests (queued in its scheduler or executing) are what Serve
scales on (``deployments.serve.model_app``). Scaling to zero is refused: a model's HTTP route is
answered by its replicas, so a model without one would refuse requests instead of waking up.
A stateful model (``sequence_batching``) is refused too: a sequence's state lives in one replica,
which a scale-down would take away mid-sequence.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

PREFIX = "ray.autoscaling."


@dataclass(frozen=True)
class Autoscaling:
    """Serve's ``autoscaling_config`` for one deployment (``None`` fields take Serve's defaults)."""

    min_replicas: int
    max_replicas: int
    initial_replicas: int | None = None
    target_ongoing_requests: float | None = None
    upscale_delay_s: float | None = None
    downscale_delay_s: float | None = None
    metrics_interval_s: float | None = None
    look_back_period_s: float | None = None

    @property
    def start_replicas(self) -> int:
        """The replicas the deployment starts with."""
        return self.initial_replicas if self.initial_replicas is not None else self.min_replicas

    def serve_config(self) -> dict[str, Any]:
        """The deployment option ``autoscaling_config``."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


# key -> (whole number?, smallest value, whether the smallest value is allowed)
_KEYS: dict[str, tuple[bool, float, bool]] = {
    "min_replicas": (True, 1, True),
    "max_replicas": (True, 1, True),
    "initial_replicas": (True, 1, True),
    "target_ongoing_requests": (False, 0, False),
    "upscale_delay_s": (False, 0, True),
    "downscale_delay_s": (False, 0, True),
    "metrics_interval_s": (False, 0, False),
    "look_back_period_s": (False, 0, False),
}


def _value(key: str, raw: str) -> tuple[int | float | None, str | None]:
    whole, low, inclusive = _KEYS[key]
    text = raw.strip()
    try:
        value: int | float = int(text) if whole else float(text)
    except ValueError:
        value = float("nan")
    kind = "an integer" if whole else "a number"
    bound = f">= {low:g}" if inclusive else f"> {low:g}"
    if value != value or value < low or (value == low and not inclusive) or value == float("inf"):
        return None, f"must be {kind} {bound}, got '{raw}'"
    return value, None


def parse_autoscaling(
    parameters: Mapping[str, str], stateful: bool = False
) -> tuple[Autoscaling | None, list[tuple[str, str]]]:
    """The autoscaling a model's ``parameters`` ask for (None: none), and each problem found as
    ``(parameter key, what is wrong)``. ``stateful``: the model has ``sequence_batching``."""
    given = {k[len(PREFIX) :]: v for k, v in parameters.items() if k.startswith(PREFIX)}
    if not given:
        return None, []
    problems: list[tuple[str, str]] = []
    values: dict[str, int | float] = {}
    for key, raw in sorted(given.items()):
        if key not in _KEYS:
            known = ", ".join(PREFIX + k for k in _KEYS)
            problems.append((PREFIX + key, f"unknown autoscaling parameter (known: {known})"))
            continue
        value, problem = _value(key, str(raw))
        if problem is not None:
            problems.append((PREFIX + key, problem))
        elif value is not None:
            values[key] = value
    for key in ("min_replicas", "max_replicas"):
        if key not in given:
            problems.append((PREFIX + key, "is required when any ray.autoscaling parameter is set"))
    low, high = values.get("min_replicas"), values.get("max_replicas")
    if low is not None and high is not None and low > high:
        problems.append((PREFIX + "max_replicas", f"must be >= min_replicas ({low}), got {high}"))
    start = values.get("initial_replicas")
    if start is not None and low is not None and high is not None and not low <= start <= high:
        problems.append(
            (PREFIX + "initial_replicas", f"must be between min_replicas and max_replicas, got {start}")
        )
    if stateful:
        problems.append(
            (
                PREFIX.rstrip("."),
                "not supported with sequence_batching: a sequence's state lives in one replica",
            )
        )
    if problems:
        return None, problems
    return Autoscaling(**values), []  # type: ignore[arg-type]


def autoscaling_of(parameters: Mapping[str, str], stateful: bool = False) -> Autoscaling | None:
    """The autoscaling of a model already validated (problems were reported then): None when off or invalid."""
    found, _ = parse_autoscaling(parameters, stateful)
    return found


def parse_host_autoscaling(values: Mapping[str, Any], start: int) -> Autoscaling:
    """The model hosts' autoscaling from the server's ``model_host_autoscaling`` (the same fields,
    without the prefix); ``min_replicas`` defaults to ``start`` (``model_hosts``), which must lie
    between it and ``max_replicas``. :class:`ValueError` names every problem."""
    given = {PREFIX + k: str(v) for k, v in values.items()}
    given.setdefault(PREFIX + "min_replicas", str(start))
    found, problems = parse_autoscaling(given)
    if found is not None and not found.min_replicas <= start <= found.max_replicas:
        problems.append(("model_hosts", f"must be between min_replicas and max_replicas, got {start}"))
    if found is None or problems:
        raise ValueError(
            "; ".join(
                f"{key[len(PREFIX) :] if key.startswith(PREFIX) else key} {what}" for key, what in problems
            )
        )
    return found
