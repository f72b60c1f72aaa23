"""cluster.yaml passes Ray's own cluster-config schema and validation, offline."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from deployments.serve.launch import REQUEST_PATH_ENV
from tests.examples.conftest import ROOT
from tools.netns_cluster import AGENT_PORTS

# Every request-path variable the local launcher sets, except those sized for one machine.
SERVE_ENV = tuple(
    f"{key}={value}"
    for key, value in REQUEST_PATH_ENV.items()
    if key not in ("RAY_SERVE_HAPROXY_NBTHREAD", "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S")
)


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "cluster.yaml").read_text())


@pytest.fixture(scope="module")
def prepared(raw: dict[str, Any]) -> dict[str, Any]:
    """The config as `ray up` sees it: merged with the AWS defaults, then validated."""
    config = prepare_config(copy.deepcopy(raw))
    validate_config(config)
    return config


def _joined(commands: list[str]) -> str:
    return "\n".join(commands)


def test_aws_cluster_with_a_cpu_head_and_gpu_workers(prepared: dict[str, Any]) -> None:
    assert (prepared["provider"]["type"], prepared["provider"]["region"]) == ("aws", "us-west-2")
    types = prepared["available_node_types"]
    head = types[prepared["head_node_type"]]["node_config"]["InstanceType"]
    workers = [
        spec["node_config"]["InstanceType"]
        for name, spec in types.items()
        if name != prepared["head_node_type"]
    ]
    assert not head.startswith(("g", "p")), head
    assert workers and all(kind.split(".")[0] in {"g4dn", "g5", "g6", "p4d", "p5"} for kind in workers), (
        workers
    )
    assert sum(spec.get("min_workers", 0) for spec in types.values()) <= prepared["max_workers"]


def test_head_installs_the_cpu_extra_and_workers_the_gpu_extra(prepared: dict[str, Any]) -> None:
    # After prepare_config, head_setup_commands and worker_setup_commands include the common setup_commands.
    head, worker = _joined(prepared["head_setup_commands"]), _joined(prepared["worker_setup_commands"])
    assert '.[cpu]"' in head and '.[gpu]"' not in head
    assert '.[gpu]"' in worker and '.[cpu]"' not in worker
    for text in (head, worker):
        assert "pip install -e ." in text  # the project itself


def test_start_commands_set_the_serve_environment(prepared: dict[str, Any]) -> None:
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        text = _joined(prepared[key])
        assert "ray start" in text, key
        for setting in SERVE_ENV:
            assert setting in text, f"{key} lacks {setting}"
    assert "--head" in _joined(prepared["head_start_ray_commands"])


def test_every_node_gives_its_agents_the_fixed_ports(prepared: dict[str, Any]) -> None:
    # the same ports as the test cluster's: a raylet left to wait for an agent's port file aborts after 15 s
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        text = _joined(prepared[key])
        for flag, port in AGENT_PORTS.items():
            assert f"{flag}={port}" in text, (key, flag)


def test_nodes_start_haproxy_through_the_shim_from_the_repository(prepared: dict[str, Any]) -> None:
    """serve_config.yaml names the HAProxy script and the example repository relative to the repository
    root: Ray starts there, and the node's own variables name the script and the Python it runs."""
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        text = _joined(prepared[key])
        assert text.index("cd ~/triton-ray-serve") < text.index("ray start"), key
        assert "RAY_SERVE_HAPROXY_BINARY_PATH=$HOME/triton-ray-serve/deployments/serve/bin/haproxy" in text
        assert "TRITON_SERVE_PYTHON=$HOME/venv/bin/python" in text
    assert (ROOT / "deployments/serve/bin/haproxy").is_file()


def test_file_mounts_point_at_the_repository_and_its_models(prepared: dict[str, Any]) -> None:
    local = {remote: (ROOT / path).resolve() for remote, path in prepared["file_mounts"].items()}
    assert ROOT.resolve() in local.values()
    model_repository = [path for path in local.values() if path.name == "model_repository"]
    assert model_repository and (model_repository[0] / "crnn" / "config.pbtxt").is_file()


def test_validation_rejects_what_ray_rejects(raw: dict[str, Any]) -> None:
    unknown_field = copy.deepcopy(raw) | {"head_node_kind": "cpu"}
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(unknown_field))
    missing_head = copy.deepcopy(raw)
    missing_head["head_node_type"] = "no.such.type"
    with pytest.raises(ValueError, match="head_node_type"):
        validate_config(prepare_config(missing_head))
