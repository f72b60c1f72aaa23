"""Triton's counters exported through Ray's metrics API, for the replicas of a Ray Serve application.

The runtime sums its counters without knowing Ray (``deployments.runtime.metrics``); a
model replica calls :func:`export_to_ray` as it starts, so that the counters of every model
its process runs (an ensemble's hosted models included) go to Ray.
"""

from __future__ import annotations

from deployments.runtime import metrics


def ray_counters() -> metrics.CounterFactory | None:
    """Ray's counter constructor, or None where Ray is not running (then metrics are off)."""
    try:
        import ray
        from ray.util import metrics as ray_metrics
    except ImportError:
        return None
    if not ray.is_initialized():
        return None

    def make(name: str, description: str, tag_keys: tuple[str, ...]) -> metrics.Counter:
        return ray_metrics.Counter(name, description, tag_keys)

    return make


def export_to_ray() -> None:
    """Make the ``TritonMetrics`` this process builds from now on export through Ray."""
    metrics.use_counters(ray_counters)
