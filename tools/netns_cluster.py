"""A multi-node Ray cluster on one machine: one Linux network namespace per node.

    python -m tools.netns_cluster up [--model-repository PATH] [--port 8090]
    python -m tools.netns_cluster status
    python -m tools.netns_cluster down

``up`` joins three namespaces by a bridge (one veth pair each, ``lo`` up in each),
starts a Ray head node in the first (no CPUs: it holds the Serve controller, the
server application and an ingress only) and two worker nodes in the others (one declares a GPU as a stand-in
GPU node), then deploys the server with ``serve deploy`` as a user of ``ray up``
would, and waits until every model answers through every node's ingress. Needs root
and ``ip`` (iproute2). Each node runs with the request-path environment of
``deployments.serve.launch`` and its own temp dir; HAProxy's files go to the cluster's
folder (Ray's default is a folder per node id under ``/tmp/haproxy-serve``; the Serve
controller's setting, the head's, applies to every node), so ``down`` leaves nothing
behind.

``down`` ends every process it started by pid: the ``ray start --block`` process of
each node and everything still running inside the namespaces (all of it started
here), then deletes the namespaces, the bridge and the cluster's folder. It never
runs ``ray stop``, which ends Ray processes by name machine-wide. Addresses stay in
one /24 that only the bridge and the namespaces use: the namespaces have no default
route, so their traffic goes to loopback and to each other only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from deployments.serve.request_path import haproxy_files_env

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the venv's bin: ray and serve of the pinned Ray
# short: Ray's socket paths under the temp dir must fit in 107 bytes
DEFAULT_DIR = Path(os.environ.get("TRS_NETNS_DIR", "/tmp/trs_netns"))
STATE_FILE = "state.json"
PREFIX = "trs"
SUBNET = "10.213.0"
GCS_PORT = 6379
DASHBOARD_PORT = 8265
HTTP_PORT = 8090
# The ports of each node's agents, fixed (every node has its own namespace): a raylet given a port uses
# it, where for a port left to the agent it waits for the agent to write the one it took to a file, and
# after 15 s aborts the node's start (``Timed out waiting for file .../metrics_agent_port_<node>``), which
# an agent still importing on a busy 2-core machine misses now and then (``ray start`` never tells the
# raylet the agent's listen port: ``triton-serve ray-start`` does, ``deployments.serve.hooks.ray_start``)
AGENT_PORTS = {
    "--dashboard-agent-grpc-port": 6391,
    "--dashboard-agent-listen-port": 6392,
    "--runtime-env-agent-port": 6393,
    "--metrics-export-port": 6394,
}
OBJECT_STORE_BYTES = 200 * 1024 * 1024
# CPUs the plan keeps free. It sizes each replica's CPU share from the cluster's total, not
# node by node, and Ray packs CPU-only replicas away from GPU nodes: without headroom the
# replicas that overflow onto the GPU node leave no room there for the KIND_GPU ones.
CPU_HEADROOM = 0.5


@dataclass(frozen=True)
class Network:
    """A bridge and the /24 its namespaces use; ``prefix`` starts every name (namespaces, links)."""

    prefix: str
    subnet: str  # the first three bytes of the addresses

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br0"

    @property
    def bridge_ip(self) -> str:
        return f"{self.subnet}.1"


NETWORK = Network(PREFIX, SUBNET)
BRIDGE = NETWORK.bridge
BRIDGE_IP = NETWORK.bridge_ip


@dataclass(frozen=True)
class NodeSpec:
    """One Ray node: its namespace, address and what it declares to the scheduler."""

    name: str
    host: int  # last byte of the address
    num_cpus: int
    num_gpus: int = 0
    resources: dict[str, float] = field(default_factory=dict)
    net: Network = NETWORK

    @property
    def head(self) -> bool:
        return self.name == "head"

    @property
    def netns(self) -> str:
        return f"{self.net.prefix}-{self.name}"

    @property
    def veth(self) -> str:
        return f"{self.net.prefix}v-{self.name}"  # the bridge's end; the namespace's end is eth0

    @property
    def ip(self) -> str:
        return f"{self.net.subnet}.{self.host}"


# 3 logical CPUs on this machine's 2 cores: replicas ask fractional shares (the plan sizes them).
NODES = (
    NodeSpec("head", 10, num_cpus=0, resources={"head_node": 1}),
    NodeSpec("cpu", 11, num_cpus=2, resources={"cpu_node": 1}),
    NodeSpec("gpu", 12, num_cpus=1, num_gpus=1, resources={"gpu_node": 1}),
)
HEAD = NODES[0]


_State = TypeVar("_State", bound="ClusterState")


@dataclass
class ClusterState:
    """What ``up`` created, written before each step so ``down`` undoes a partial start too."""

    dir: str
    http_port: int = HTTP_PORT
    netns: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    pids: dict[str, int] = field(default_factory=dict)  # node -> pid (= process group) of ray start

    @classmethod
    def load(cls: type[_State], root: Path) -> _State:
        path = root / STATE_FILE
        if not path.is_file():
            return cls(dir=str(root))
        return cls(**json.loads(path.read_text()))

    def save(self) -> None:
        Path(self.dir).mkdir(parents=True, exist_ok=True)
        (Path(self.dir) / STATE_FILE).write_text(json.dumps(asdict(self), indent=2))

    def ingress(self, node: NodeSpec) -> str:
        """``host:port`` of the node's HAProxy."""
        return f"{node.ip}:{self.http_port}"


class ClusterError(RuntimeError):
    pass


# ---------------------------------------------------------------- preflight and network


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here (None when they can)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    probe = f"{PREFIX}-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise ClusterError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def existing_netns() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


def make_network(state: ClusterState, nodes: tuple[NodeSpec, ...] = NODES) -> None:
    """The bridge (with an address, so this machine reaches the nodes) and one namespace per node, all
    on the network of ``nodes[0]``."""
    net = nodes[0].net
    _ip("link", "add", net.bridge, "type", "bridge")
    state.links.append(net.bridge)
    state.save()
    _ip("addr", "add", f"{net.bridge_ip}/24", "dev", net.bridge)
    _ip("link", "set", net.bridge, "up")
    for node in nodes:
        _ip("netns", "add", node.netns)
        state.netns.append(node.netns)
        state.save()
        _ip("link", "add", node.veth, "type", "veth", "peer", "name", "eth0", "netns", node.netns)
        state.links.append(node.veth)
        state.save()
        _ip("link", "set", node.veth, "master", net.bridge, "up")
        _ip("-n", node.netns, "link", "set", "lo", "up")
        _ip("-n", node.netns, "addr", "add", f"{node.ip}/24", "dev", "eth0")
        _ip("-n", node.netns, "link", "set", "eth0", "up")


# ---------------------------------------------------------------- Ray nodes


def auth_token() -> str:
    """Ray's token (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``); created if absent."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip()
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if not path.is_file():
        subprocess.run([str(BIN / "ray"), "get-auth-token", "--generate"], check=True, capture_output=True)
    return path.read_text().strip()


def node_env(node: NodeSpec, root: Path) -> dict[str, str]:
    """The environment of a node's Ray processes (and so of every replica on it), less the request
    path's variables, which ``launch ray-start`` adds as it does for a user."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "HAPROXY_"))}
    haproxy = root / node.name / "haproxy"
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "RAY_AUTH_MODE": "token",
            "RAY_USAGE_STATS_ENABLED": "0",
            # SIGTERM ends a node at once (no drain wait): `down` ends the whole cluster
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        }
    )
    env.update(haproxy_files_env(haproxy))  # in the cluster's folder instead of /tmp/haproxy-serve
    return env


def ray_start_args(node: NodeSpec, root: Path) -> list[str]:
    # `triton-serve ray-start`: `ray start` (in the same process) with the request-path environment
    args = [
        sys.executable,
        "-m",
        "deployments.serve.launch",
        "ray-start",
        "--block",
        f"--node-ip-address={node.ip}",
        f"--num-cpus={node.num_cpus}",
        f"--num-gpus={node.num_gpus}",
        f"--temp-dir={root / node.name / 'ray'}",
        f"--object-store-memory={OBJECT_STORE_BYTES}",
        "--disable-usage-stats",
        *(f"{flag}={port}" for flag, port in AGENT_PORTS.items()),
    ]
    if node.resources:
        args.append(f"--resources={json.dumps(node.resources)}")
    if node.head:
        args += [
            "--head",
            f"--port={GCS_PORT}",
            "--dashboard-host=0.0.0.0",
            f"--dashboard-port={DASHBOARD_PORT}",
        ]
    else:
        args.append(f"--address={HEAD.ip}:{GCS_PORT}")
    return args


def start_node(node: NodeSpec, state: ClusterState) -> None:
    """``ray start --block`` inside the node's namespace, as the leader of its own process group."""
    root = Path(state.dir)
    (root / node.name / "haproxy").mkdir(parents=True, exist_ok=True)
    log = open(root / f"{node.name}.log", "ab")  # noqa: SIM115 (the child holds it)
    proc = subprocess.Popen(
        ["ip", "netns", "exec", node.netns, *ray_start_args(node, root)],
        env=node_env(node, root),
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    state.pids[node.name] = proc.pid
    state.save()


def dashboard_url(path: str) -> str:
    return f"http://{HEAD.ip}:{DASHBOARD_PORT}{path}"


# the cluster's addresses are reached directly, never through a proxy the environment names
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_json(url: str, body: bytes | None = None, timeout_s: float = 10.0, auth: bool = False) -> Any:
    headers = {"Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = f"Bearer {auth_token()}"
    request = urllib.request.Request(url, data=body, headers=headers, method="POST" if body else "GET")
    with _DIRECT.open(request, timeout=timeout_s) as reply:
        return json.loads(reply.read() or b"null")


def ray_nodes() -> list[dict[str, Any]]:
    """Alive Ray nodes as the head's state API lists them (node_id, node_ip, resources_total, ...)."""
    reply = http_json(dashboard_url("/api/v0/nodes?limit=100&detail=true"), auth=True)
    return [n for n in reply["data"]["result"]["result"] if n.get("state") == "ALIVE"]


def serve_details() -> dict[str, Any]:
    """Serve's applications, deployments and replicas (with node ids), from the head's dashboard."""
    return http_json(dashboard_url("/api/serve/applications/"), auth=True)  # type: ignore[no-any-return]


def wait_for(what: str, check: Any, timeout_s: float, state: ClusterState | None = None) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        if state is not None:
            dead = [name for name, pid in state.pids.items() if not _alive(pid)]
            if dead:
                raise ClusterError(f"node(s) {dead} exited; see {state.dir}/<node>.log")
        try:
            last = check()
        except (OSError, urllib.error.URLError, KeyError, ValueError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(1.0)
    raise ClusterError(f"timed out after {timeout_s:.0f}s waiting for {what} (last: {last!r})")


def _port_open(ip: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((ip, port)) == 0


# ---------------------------------------------------------------- Serve


def write_serve_config(
    state: ClusterState, model_repository: Path, server_args: Mapping[str, Any] | None = None
) -> Path:
    """The shipped serve_config.yaml, with replicas and HAProxy reachable from other nodes, and
    ``server_args`` added to the server's ``args`` (``ServerSettings.from_args`` names)."""
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    config["proxy_location"] = "EveryNode"
    config["http_options"] = {**config.get("http_options", {}), "host": "0.0.0.0", "port": state.http_port}
    for app in config["applications"]:
        args = app.setdefault("args", {})
        args["model_repository"] = str(model_repository.resolve())
        args.setdefault("control_app_cpus", CPU_HEADROOM)
        args.update(server_args or {})
        # the control application (repository, index, gRPC) on the head, which the cluster cannot
        # lose anyway (its GCS is there): a lost worker node takes model replicas only
        app["deployments"] = [
            {"name": "server", "ray_actor_options": {"num_cpus": 0, "resources": {"head_node": 0.01}}}
        ]
    path = Path(state.dir) / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def serve_deploy(config: Path, dashboard: str | None = None, token: bool = True) -> None:
    """``serve deploy config`` to ``dashboard`` (this cluster's head by default), with Ray's token."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # `serve deploy` talks to the dashboard (RAY_DASHBOARD_ADDRESS / --address, default localhost:8265),
    # not to the GCS address that RAY_ADDRESS names for `serve run`
    env["RAY_DASHBOARD_ADDRESS"] = dashboard or dashboard_url("")
    if token:
        env["RAY_AUTH_MODE"] = "token"
    done = subprocess.run(
        [str(BIN / "serve"), "deploy", str(config)], env=env, capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise ClusterError(f"serve deploy failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def model_index(state: ClusterState, node: NodeSpec = HEAD) -> list[dict[str, Any]]:
    """The server's repository index through ``node``'s ingress."""
    return http_json(f"http://{state.ingress(node)}/v2/repository/index", body=b"{}")  # type: ignore[no-any-return]


def _settled(index: list[dict[str, Any]]) -> bool:
    return bool(index) and all(m.get("state") in ("READY", "UNAVAILABLE") for m in index)


def routed(state: ClusterState, models: list[str]) -> bool:
    """Every model reports ready through every node's ingress (HAProxy's routes lag readiness)."""
    for node in NODES:
        for model in models:
            try:
                with _DIRECT.open(f"http://{state.ingress(node)}/v2/models/{model}/ready", timeout=5):
                    pass
            except (OSError, urllib.error.URLError):
                return False
    return True


# ---------------------------------------------------------------- up / down / status


def up(
    root: Path = DEFAULT_DIR,
    model_repository: Path = ROOT / "examples" / "model_repository",
    http_port: int = HTTP_PORT,
    deploy: bool = True,
    timeout_s: float = 300.0,
    log: Any = print,
    server_args: Mapping[str, Any] | None = None,
) -> ClusterState:
    """Create the network, start the nodes, deploy the server (with ``server_args`` added to the shipped
    config's) and wait until every node serves every model."""
    reason = unavailable_reason()
    if reason:
        raise ClusterError(reason)
    leftovers = sorted(existing_netns() & {n.netns for n in NODES})
    if leftovers or link_exists(BRIDGE) or (root / STATE_FILE).exists():
        raise ClusterError(f"a cluster is already up ({leftovers or BRIDGE}); run `down` first")
    start = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
    state = ClusterState(dir=str(root), http_port=http_port)
    state.save()
    try:
        auth_token()  # every node reads it at start (a fresh machine has none yet)
        make_network(state)
        start_node(HEAD, state)
        wait_for("the head node", lambda: _port_open(HEAD.ip, DASHBOARD_PORT) and ray_nodes(), 120, state)
        for node in NODES[1:]:
            start_node(node, state)
        wait_for(f"{len(NODES)} nodes", lambda: len(ray_nodes()) == len(NODES), 120, state)
        log(f"nodes up in {time.monotonic() - start:.0f}s")
        if deploy:
            serve_deploy(write_serve_config(state, model_repository, server_args))
            wait_for("the repository to load", lambda: _settled(model_index(state)), timeout_s, state)
            ready = [m["name"] for m in model_index(state) if m.get("state") == "READY"]
            wait_for("every node to route every model", lambda: routed(state, ready), 120, state)
            log(f"serving {len(ready)} models through {len(NODES)} nodes in {time.monotonic() - start:.0f}s")
    except ClusterError as exc:
        log(f"start failed; logs in {root}_failed_logs; taking the cluster down")
        why = diagnosis(root)
        keep_logs(root)
        down(root, log=log)
        raise ClusterError(f"{exc}\n{why}") from exc
    except BaseException:
        log(f"start failed; logs in {root}_failed_logs; taking the cluster down")
        keep_logs(root)
        down(root, log=log)
        raise
    return state


def diagnosis(root: Path, lines: int = 12) -> str:
    """What a failed start leaves to read: each Serve application's status and message, and the last
    error lines of the Serve logs of every node (a CI run shows only the test's output)."""
    parts: list[str] = []
    try:
        for name, app in serve_details().get("applications", {}).items():
            message = (app.get("message") or "").strip().replace("\n", " ")[:300]
            parts.append(f"application {name}: {app.get('status')} {message}")
            for deployment, info in app.get("deployments", {}).items():
                states = [r.get("state") for r in info.get("replicas", [])]
                said = (info.get("message") or "").strip().replace("\n", " ")[:300]
                parts.append(f"  {deployment}: {info.get('status')} replicas {states} {said}".rstrip())
    except Exception as exc:  # the dashboard itself may be what failed
        parts.append(f"serve status unavailable: {exc!r}")
    for node in NODES:
        logs = root / node.name / "ray" / "session_latest" / "logs" / "serve"
        found: list[str] = []
        for path in sorted(logs.glob("*.log")) if logs.is_dir() else []:
            text = path.read_text(errors="replace").splitlines()
            found += [f"{path.name}: {line[:300]}" for line in text if " ERROR " in line or _raised(line)]
        if found:
            parts.append(f"node {node.name}, last errors in its Serve logs:")
            parts += [f"  {line}" for line in found[-lines:]]
    return "\n".join(parts)


_RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Unavailable|Exit|Interrupt): (?!Traceback)")


def _raised(line: str) -> bool:
    """Whether a log line is a traceback's last line, the exception that was raised (a traceback's
    first line says nothing)."""
    return bool(_RAISED.match(line))


def keep_logs(root: Path) -> Path:
    """Copy the node logs (Ray's, Serve's, HAProxy's and its guard's) next to the cluster folder,
    which ``down`` deletes: what a failed start or a failed test leaves to read. Answers the copy."""
    keep = root.with_name(root.name + "_failed_logs")
    shutil.rmtree(keep, ignore_errors=True)
    keep.mkdir(parents=True)
    for log_file in root.glob("*.log"):
        shutil.copy(log_file, keep / log_file.name)
    for node in NODES:
        logs = root / node.name / "ray" / "session_latest" / "logs"
        if logs.is_dir():
            shutil.copytree(logs, keep / node.name, ignore_dangling_symlinks=True, dirs_exist_ok=True)
        haproxy = root / node.name / "haproxy"  # a folder per node id of Serve's, under it
        for path in sorted(haproxy.rglob("*.log")) + sorted(haproxy.rglob("*.cfg")):
            target = keep / node.name / "haproxy" / path.relative_to(haproxy)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)
    return keep


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def netns_pids(netns: str) -> set[int]:
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout
    return {int(p) for p in out.split() if p.isdigit()}


def _ours(names: list[str]) -> set[int]:
    """Live processes inside the cluster's namespaces: all of them were started by ``up``."""
    pids: set[int] = set()
    for name in names:
        pids |= netns_pids(name)
    return {p for p in pids if _alive(p)}


def _signal(pids: set[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _wait_gone(names: list[str], timeout_s: float) -> set[int]:
    deadline = time.monotonic() + timeout_s
    left = _ours(names)
    while left and time.monotonic() < deadline:
        time.sleep(0.3)
        left = _ours(names)
    return left


def down(root: Path = DEFAULT_DIR, log: Any = print) -> None:
    """End every process started in the cluster's namespaces (by pid), delete the network and the folder.

    Only processes inside the namespaces are signalled (``ip netns pids``), so a recorded
    pid that was reused elsewhere is never touched.
    """
    state = ClusterState.load(root)
    # the fixed names too: a state file lost in a crash must not leave namespaces behind
    names = sorted((set(state.netns) | {n.netns for n in NODES}) & existing_netns())
    links = [*state.links, *(n.veth for n in NODES), BRIDGE]
    left = clear_network(names, links, set(state.pids.values()), log)  # ray start ends its node first
    if not left:
        shutil.rmtree(root, ignore_errors=True)
    log(f"cluster down ({len(names)} namespaces removed)")


def clear_network(names: list[str], links: list[str], first: set[int], log: Any = print) -> set[int]:
    """End every process inside namespaces ``names`` by pid (SIGTERM to ``first``, then to what is
    left, then SIGKILL), then delete the namespaces and ``links``. Returns the pids that outlived
    SIGKILL (their namespaces are kept)."""
    _signal(first & _ours(names), signal.SIGTERM)
    left = _wait_gone(names, 10.0)
    _signal(left, signal.SIGTERM)
    left = _wait_gone(names, 5.0)
    _signal(left, signal.SIGKILL)
    left = _wait_gone(names, 5.0)
    for name in names:
        if netns_pids(name) & left:
            log(f"keeping namespace {name}: processes {sorted(netns_pids(name) & left)} outlived SIGKILL")
            continue
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    for link in links:
        if link_exists(link):
            subprocess.run(["ip", "link", "del", link], capture_output=True)
    return left


def kill_node(node: NodeSpec) -> int:
    """Lose ``node`` at once, as a machine that dies: SIGKILL to every process in its namespace (its
    raylet, its replicas, its HAProxy). Returns how many processes were killed."""
    pids = _ours([node.netns])
    _signal(pids, signal.SIGKILL)
    left = _wait_gone([node.netns], 10.0)
    if left:
        raise ClusterError(f"node {node.name}: processes {sorted(left)} outlived SIGKILL")
    return len(pids)


def restart_node(state: ClusterState, node: NodeSpec, timeout_s: float = 120.0) -> None:
    """Start ``node`` again (``ray start`` in its namespace, as a replaced machine joins) and wait
    until the cluster lists every node alive."""
    start_node(node, state)
    wait_for(f"node {node.name} to rejoin", lambda: len(ray_nodes()) == len(NODES), timeout_s, state)


def status(root: Path = DEFAULT_DIR) -> dict[str, Any]:
    state = ClusterState.load(root)
    report: dict[str, Any] = {
        "dir": state.dir,
        "netns": sorted(existing_netns() & {n.netns for n in NODES}),
        "bridge": link_exists(BRIDGE),
        "nodes": {
            n.name: {"ip": n.ip, "pid": state.pids.get(n.name), "alive": _alive(state.pids.get(n.name, 0))}
            for n in NODES
        },
    }
    if not report["netns"]:
        return report
    try:
        report["ray_nodes"] = [
            {"node_ip": n["node_ip"], "head": n.get("is_head_node"), "resources": n.get("resources_total")}
            for n in ray_nodes()
        ]
        report["applications"] = {
            name: app.get("status") for name, app in serve_details().get("applications", {}).items()
        }
        report["models"] = {m["name"]: m.get("state") for m in model_index(state)}
    except (OSError, urllib.error.URLError, KeyError, ValueError) as exc:
        report["error"] = repr(exc)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.netns_cluster", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="the cluster's own folder")
    parser.add_argument("--model-repository", type=Path, default=ROOT / "examples" / "model_repository")
    parser.add_argument("--port", type=int, default=HTTP_PORT, help="HTTP port of every node's ingress")
    parser.add_argument("--no-deploy", action="store_true", help="start the nodes only")
    args = parser.parse_args(argv)
    if args.command == "down":
        down(args.dir)
        return 0
    if args.command == "status":
        print(json.dumps(status(args.dir), indent=2))
        return 0
    try:
        state = up(args.dir, args.model_repository, args.port, deploy=not args.no_deploy)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for node in NODES:
        print(f"{node.name:5} {node.ip}  ingress http://{state.ingress(node)}  namespace {node.netns}")
    print(f"dashboard http://{HEAD.ip}:{DASHBOARD_PORT}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
