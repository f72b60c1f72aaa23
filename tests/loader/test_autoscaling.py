"""Autoscaling from a model's config ``parameters``: parsed, refused with the key named, and planned."""

from __future__ import annotations

from pathlib import Path

import pytest

from repository_loader.autoscaling import Autoscaling, parse_autoscaling
from repository_loader.plan import ClusterResources, plan_deployments
from repository_loader.repository import load_repository

IO = """
    input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def _parameters(**values: str) -> str:
    return "\n".join(
        f'parameters {{ key: "ray.autoscaling.{k}" value: {{ string_value: "{v}" }} }}'
        for k, v in values.items()
    )


def test_no_autoscaling_keys_means_fixed_replicas() -> None:
    assert parse_autoscaling({"execution_timeout_ms": "10"}) == (None, [])


def test_every_key_is_parsed_into_serves_autoscaling_config() -> None:
    found, problems = parse_autoscaling(
        {
            "ray.autoscaling.min_replicas": "1",
            "ray.autoscaling.max_replicas": " 4 ",
            "ray.autoscaling.initial_replicas": "2",
            "ray.autoscaling.target_ongoing_requests": "2.5",
            "ray.autoscaling.upscale_delay_s": "0",
            "ray.autoscaling.downscale_delay_s": "3",
            "ray.autoscaling.metrics_interval_s": "0.5",
            "ray.autoscaling.look_back_period_s": "2",
        }
    )
    assert problems == []
    assert found == Autoscaling(1, 4, 2, 2.5, 0.0, 3.0, 0.5, 2.0)
    assert found.start_replicas == 2
    assert found.serve_config() == {
        "min_replicas": 1,
        "max_replicas": 4,
        "initial_replicas": 2,
        "target_ongoing_requests": 2.5,
        "upscale_delay_s": 0.0,
        "downscale_delay_s": 3.0,
        "metrics_interval_s": 0.5,
        "look_back_period_s": 2.0,
    }


@pytest.mark.parametrize(
    ("values", "key", "words"),
    [
        ({"max_replicas": "2"}, "min_replicas", "is required"),
        ({"min_replicas": "0", "max_replicas": "2"}, "min_replicas", "must be an integer >= 1, got '0'"),
        ({"min_replicas": "1", "max_replicas": "two"}, "max_replicas", "must be an integer >= 1, got 'two'"),
        ({"min_replicas": "3", "max_replicas": "2"}, "max_replicas", "must be >= min_replicas (3), got 2"),
        ({"min_replicas": "1", "max_replicas": "2", "initial_replicas": "3"}, "initial_replicas", "between"),
        (
            {"min_replicas": "1", "max_replicas": "2", "target_ongoing_requests": "0"},
            "target_ongoing_requests",
            "must be a number > 0, got '0'",
        ),
        (
            {"min_replicas": "1", "max_replicas": "2", "upscale_delay_s": "nan"},
            "upscale_delay_s",
            "number >= 0",
        ),
        (
            {"min_replicas": "1", "max_replicas": "2", "max_replica": "3"},
            "max_replica",
            "unknown autoscaling",
        ),
    ],
)
def test_a_bad_value_names_its_key(values: dict[str, str], key: str, words: str) -> None:
    found, problems = parse_autoscaling({f"ray.autoscaling.{k}": v for k, v in values.items()})
    assert found is None
    assert any(k == f"ray.autoscaling.{key}" and words in p for k, p in problems), problems


def test_a_stateful_model_cannot_autoscale() -> None:
    found, problems = parse_autoscaling(
        {"ray.autoscaling.min_replicas": "1", "ray.autoscaling.max_replicas": "2"}, stateful=True
    )
    assert found is None and "sequence_batching" in problems[0][1]


def test_the_repository_refuses_a_bad_autoscaling_parameter(repo: Path, write_model) -> None:
    write_model(
        "m",
        'backend: "pytorch"\nmax_batch_size: 8\n' + IO + _parameters(min_replicas="2", max_replicas="1"),
        {"1/model.pt": b""},
    )
    state = load_repository(repo)
    assert "m" not in state.models
    assert any(
        e.startswith("model 'm' (m/config.pbtxt): parameters 'ray.autoscaling.max_replicas': must be >=")
        for e in state.failed["m"]
    ), state.failed["m"]


def test_the_first_group_is_planned_as_an_autoscaled_deployment(repo: Path, write_model) -> None:
    groups = "instance_group [ { count: 3 kind: KIND_CPU }, { count: 1 kind: KIND_CPU } ]\n"
    write_model(
        "m",
        'backend: "pytorch"\nmax_batch_size: 8\n'
        + IO
        + groups
        + _parameters(min_replicas="1", max_replicas="4"),
        {"1/model.pt": b""},
    )
    state = load_repository(repo)
    assert "m" in state.models, state.failed
    first, second = plan_deployments(state.models, ClusterResources(num_cpus=2)).for_model("m")
    # the first group starts at min_replicas (its count of 3 is not used) and scales between 1 and 4
    assert first.num_replicas == 1 and first.autoscaling == Autoscaling(1, 4)
    options = first.serve_options()
    assert "num_replicas" not in options
    assert options["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4}
    assert first.to_dict()["autoscaling"] == {"min_replicas": 1, "max_replicas": 4}
    # a later group keeps its fixed count, ranked after the first group's start replicas
    assert second.autoscaling is None and second.serve_options()["num_replicas"] == 1
    assert second.rank_offset == 1 and first.model_replicas == 2
