"""The multi-node cluster script's pieces that need no namespaces: quick, run everywhere."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from deployments.serve.launch import REQUEST_PATH_ENV
from deployments.serve.request_path import HAPROXY_FILES
from tools import netns_cluster
from tools.netns_cluster import HEAD, NODES, ClusterState, NodeSpec

ROOT = Path(__file__).resolve().parents[2]


def test_without_ip_or_root_the_reason_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns_cluster.shutil, "which", lambda _: None)
    assert "`ip`" in (netns_cluster.unavailable_reason() or "")
    monkeypatch.setattr(netns_cluster.shutil, "which", lambda _: "/usr/sbin/ip")
    monkeypatch.setattr(netns_cluster.os, "geteuid", lambda: 1000)
    assert "root" in (netns_cluster.unavailable_reason() or "")


def test_serve_config_is_the_shipped_one_reachable_from_other_nodes(tmp_path: Path) -> None:
    state = ClusterState(dir=str(tmp_path), http_port=8123)
    written = yaml.safe_load(
        netns_cluster.write_serve_config(state, Path("examples/model_repository")).read_text()
    )
    shipped = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    assert written["proxy_location"] == "EveryNode"
    assert written["http_options"] == {**shipped["http_options"], "host": "0.0.0.0", "port": 8123}
    (app,) = written["applications"]
    assert app["import_path"] == shipped["applications"][0]["import_path"]
    assert app["args"]["model_repository"] == str((ROOT / "examples" / "model_repository").resolve())


def test_nodes_start_through_launch_with_nothing_of_the_callers_ray(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    monkeypatch.setenv("RAY_SERVE_ENABLE_HA_PROXY", "0")
    env = netns_cluster.node_env(NODES[1], tmp_path)
    # `launch ray-start` sets the request path's variables where unset, then execs `ray start`
    assert netns_cluster.ray_start_args(NODES[1], tmp_path)[1:4] == [
        "-m",
        "deployments.serve.launch",
        "ray-start",
    ]
    assert not REQUEST_PATH_ENV.keys() & env.keys()
    assert "RAY_ADDRESS" not in env
    assert env["RAY_AUTH_MODE"] == "token" and env["PYTHONPATH"] == str(ROOT)
    folder = tmp_path / NODES[1].name / "haproxy"
    assert env["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"] == str(folder)
    assert all(Path(env[key]).parent == folder for key in HAPROXY_FILES if key.endswith("_FILE"))


def _args(node: NodeSpec, root: Path) -> dict[str, str]:
    pairs = (a.partition("=") for a in netns_cluster.ray_start_args(node, root)[4:])
    return {key: value for key, _, value in pairs}


def test_head_declares_no_cpus_and_workers_join_it(tmp_path: Path) -> None:
    head = _args(HEAD, tmp_path)
    assert "--head" in head and head["--num-cpus"] == "0" and "--address" not in head
    gpu_nodes = [n for n in NODES if n.num_gpus]
    assert len(gpu_nodes) == 1 and len(NODES) >= 3
    for node in NODES[1:]:
        args = _args(node, tmp_path)
        assert args["--address"] == f"{HEAD.ip}:{netns_cluster.GCS_PORT}"
        assert args["--node-ip-address"] == node.ip and args["--num-gpus"] == str(node.num_gpus)
        assert args["--temp-dir"].startswith(str(tmp_path / node.name)) and "--block" in args


def test_every_node_gives_its_agents_their_ports() -> None:
    # a port left to an agent makes the raylet wait 15 s for the agent's port file, then abort the node
    for node in NODES:
        args = _args(node, Path("/tmp/x"))
        for flag in (
            "--dashboard-agent-grpc-port",
            "--dashboard-agent-listen-port",
            "--runtime-env-agent-port",
        ):
            assert int(args[flag]) > 0, (node.name, flag)
        assert int(args["--metrics-export-port"]) > 0
    taken = {netns_cluster.GCS_PORT, netns_cluster.DASHBOARD_PORT, netns_cluster.HTTP_PORT}
    assert not taken & set(netns_cluster.AGENT_PORTS.values())


def test_interface_names_fit_the_kernels_limit() -> None:
    names = [netns_cluster.BRIDGE, *(n.veth for n in NODES)]
    assert all(len(name) <= 15 for name in names), names
    assert len({n.ip for n in NODES}) == len(NODES)


def test_a_failed_start_names_the_exception_each_node_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(netns_cluster, "serve_details", lambda: {"applications": {}})
    logs = tmp_path / HEAD.name / "ray" / "session_latest" / "logs" / "serve"
    logs.mkdir(parents=True)
    (logs / "controller_1.log").write_text(
        "INFO starting\n"
        "RuntimeError: Traceback (most recent call last):\n"
        '  File "app.py", line 453, in __init__\n'
        "RuntimeError: failed to load all models (exit_on_error): 'two_groups': no node has\n"
    )
    said = netns_cluster.diagnosis(tmp_path)
    assert "controller_1.log: RuntimeError: failed to load all models" in said
    assert "Traceback" not in said
