"""What a replica hands Ray's metrics for its gauges and custom metric families (without Ray)."""

from __future__ import annotations

from typing import Any

from deployments import custom_metrics
from deployments.serve.ray_metrics import RayGauges


class Recorder:
    """Stands for Ray's metrics: what was made, set and increased."""

    def __init__(self) -> None:
        self.made: dict[str, tuple[str, tuple[str, ...]]] = {}
        self.calls: list[tuple[str, str, float, dict[str, str]]] = []

    def factory(self, kind: str) -> Any:
        recorder = self

        class Metric:
            def __init__(self, name: str, description: str, keys: tuple[str, ...]) -> None:
                if name in recorder.made:
                    raise ValueError(f"{name} made twice")
                recorder.made[name] = (kind, keys)
                self.name = name

            def set(self, value: float, tags: dict[str, str]) -> None:
                recorder.calls.append(("set", self.name, value, tags))

            def inc(self, value: float, tags: dict[str, str]) -> None:
                recorder.calls.append(("inc", self.name, value, tags))

        return Metric


def _family(kind: str, name: str, *metrics: tuple[dict[str, str], float]) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"{name} help",
        "kind": kind,
        "metrics": [{"labels": labels, "value": value} for labels, value in metrics],
    }


def test_pending_requests_are_a_gauge_labelled_by_model_and_version() -> None:
    ray = Recorder()
    gauges = RayGauges(ray.factory("gauge"), ray.factory("counter"))
    gauges.export({("m", "1"): 3, ("m", "2"): 0}, [])
    assert ray.made == {"nv_inference_pending_request_count": ("gauge", ("model", "version"))}
    assert ray.calls == [
        ("set", "nv_inference_pending_request_count", 3.0, {"model": "m", "version": "1"}),
        ("set", "nv_inference_pending_request_count", 0.0, {"model": "m", "version": "2"}),
    ]


def test_custom_gauges_are_set_and_custom_counters_grow_by_what_they_grew() -> None:
    ray = Recorder()
    gauges = RayGauges(ray.factory("gauge"), ray.factory("counter"))
    labels = {"model": "m", "version": "1"}
    gauges.export(
        {},
        [
            _family(custom_metrics.GAUGE, "size", (labels, 7.0)),
            _family(custom_metrics.COUNTER, "requests", (labels, 2.0)),
            _family(custom_metrics.HISTOGRAM, "values", (labels, 0.0)),
        ],
    )
    gauges.export({}, [_family(custom_metrics.COUNTER, "requests", (labels, 2.0))])  # unchanged
    gauges.export({}, [_family(custom_metrics.COUNTER, "requests", (labels, 5.0))])
    assert ray.made == {
        "size": ("gauge", ("model", "version")),
        "requests": ("counter", ("model", "version")),
    }
    assert ray.calls == [
        ("set", "size", 7.0, labels),
        ("inc", "requests", 2.0, labels),
        ("inc", "requests", 3.0, labels),
    ]


def test_a_metric_with_other_label_names_than_its_familys_first_is_left_out() -> None:
    ray = Recorder()
    gauges = RayGauges(ray.factory("gauge"), ray.factory("counter"))
    family = _family(custom_metrics.GAUGE, "g", ({"a": "1"}, 1.0), ({"b": "2"}, 2.0), ({"a": "3"}, 3.0))
    gauges.export({}, [family])
    assert ray.calls == [("set", "g", 1.0, {"a": "1"}), ("set", "g", 3.0, {"a": "3"})]
