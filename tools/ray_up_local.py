"""``ray up`` on Ray's ``local`` provider, against nodes in network namespaces on this machine.

    python -m tools.ray_up_local up [--workers 1] [--port 8090] [--model NAME ...] [--nodes-only]
    python -m tools.ray_up_local down

``up`` makes one namespace per node on a bridge (``tools.netns_cluster``'s network code:
``trubr0``, 10.214.0.0/24, names ``tru*``; the head at .10, workers from .11). Each node
behaves as a machine of its own: its own PID namespace (``ray down`` runs ``ray stop`` on the
head, which ends every Ray process it can see), its own ``/root``, ``/tmp`` and ``/run`` (bind
mounts in its own mount namespace, from the cluster's folder), the checkout linked at
``~/triton-ray-serve``, and an ``sshd`` on its address that lets root in with a key made for
the cluster. Then it fills a copy of ``examples/cluster_local.yaml`` in the cluster's folder with
the cluster's addresses and key, runs ``ray up`` on it (the head's autoscaler starts the workers over SSH), waits for
every node, runs ``ray exec <yaml> 'ray status'``, ``serve deploy``s the example repository
to the head's dashboard and waits until every node's ingress answers for the models.

``down`` runs ``ray down``, ends the SSH connections Ray keeps open, then every process in
the namespaces by pid (each node's sshd is the first process of its PID namespace: the
kernel ends the rest with it), deletes the namespaces, the bridge and the folders.
"""

from __future__ import annotations

import argparse
import getpass
import hashlib
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tools import netns_cluster
from tools.netns_cluster import ClusterError, ClusterState, Network, NodeSpec

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
EXAMPLE = ROOT / "examples" / "cluster_local.yaml"
# outside /tmp, which each node replaces with its own
DEFAULT_DIR = Path(os.environ.get("TRU_RAY_UP_DIR", "/var/tmp/tru_ray_up"))
NETWORK = Network("tru", "10.214.0")
SSHD = "/usr/sbin/sshd"
HTTP_PORT = 8090
DASHBOARD_PORT = 8265
CHECKOUT_LINK = "triton-ray-serve"  # in each node's home, where cluster.yaml's file_mounts put it
# Ray's SSH client options (SSHCommandRunner), and never a prompt
SSH_OPTIONS = [
    arg
    for option in ("StrictHostKeyChecking=no", f"UserKnownHostsFile={os.devnull}", "IdentitiesOnly=yes")
    + ("BatchMode=yes", "ConnectTimeout=5")
    for arg in ("-o", option)
]

# Each node's first process, in its own PID and mount namespaces: root's home ($2) from the node's folder
# ($1), with the folders of the real one that the checkout's virtual environment needs (its interpreter,
# where pyenv installs it) bound in; its own /tmp and /run (sshd's privilege separation folder is
# /run/sshd); then sshd in the foreground.
BOOT = """set -e
folder=$1 home=$2 root=$3
shift 3
mkdir -p "$folder/checkout"
mount --bind "$root" "$folder/checkout"
for keep in "$@"; do
  mkdir -p "$folder/home${{keep#"$home"}}"
  mount --bind "$keep" "$folder/home${{keep#"$home"}}"
done
mount --rbind "$folder/home" "$home"
mount --bind "$folder/tmp" /tmp
mkdir -p "$root"
mount --bind "$folder/checkout" "$root"
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -m 755 /run/sshd
exec {sshd} -D -e -f "$folder/sshd_config"
"""

SSHD_CONFIG = """ListenAddress {ip}
Port 22
HostKey {host_key}
PidFile /run/sshd.pid
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
"""


def nodes(workers: int) -> tuple[NodeSpec, ...]:
    """The head and ``workers`` worker nodes (one CPU each, as the example config starts them)."""
    head = NodeSpec("head", 10, num_cpus=1, resources={"head_node": 1}, net=NETWORK)
    return (head, *(NodeSpec(f"w{i + 1}", 11 + i, num_cpus=1, net=NETWORK) for i in range(workers)))


HEAD = nodes(0)[0]


@dataclass
class LocalState(ClusterState):
    """What ``up`` created; ``pids``: node -> pid of the ``unshare`` that holds its namespaces."""

    workers: int = 1

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        return nodes(self.workers)

    @property
    def config(self) -> Path:
        return Path(self.dir) / "cluster.yaml"


def unavailable_reason() -> str | None:
    """Why the nodes cannot be made here (None when they can)."""
    reason = netns_cluster.unavailable_reason()
    if reason:
        return reason
    if not os.access(SSHD, os.X_OK):
        return f"no {SSHD} (openssh-server)"
    needed = {"ssh": "openssh-client", "ssh-keygen": "openssh-client", "rsync": "`ray up` copies with it"}
    for tool, why in {**needed, "unshare": "util-linux"}.items():
        if shutil.which(tool) is None:
            return f"no `{tool}` ({why})"
    return None


# ---------------------------------------------------------------- the nodes: namespaces and sshd


def make_keys(root: Path) -> Path:
    """The cluster's key (Ray's ``ssh_private_key``) and the nodes' host key, in ``root/ssh``."""
    keys = root / "ssh"
    keys.mkdir(mode=0o700)
    for name in ("id_ed25519", "host_ed25519_key"):
        subprocess.run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                f"ray-up-local {name}",
                "-f",
                str(keys / name),
            ],
            check=True,
            capture_output=True,
        )
    return keys


def prepare_node(node: NodeSpec, root: Path, keys: Path) -> Path:
    """The node's folder: its home (the authorized key, the checkout linked), its /tmp, its sshd config."""
    folder = root / node.name
    home = folder / "home"
    (home / ".ssh").mkdir(parents=True)
    home.chmod(0o700)
    (home / ".ssh").chmod(0o700)
    shutil.copy(keys / "id_ed25519.pub", home / ".ssh" / "authorized_keys")
    (home / ".ssh" / "authorized_keys").chmod(0o600)
    (home / CHECKOUT_LINK).symlink_to(ROOT)
    (home / ".bashrc").touch()  # Ray's shells source it
    (folder / "tmp").mkdir()
    (folder / "tmp").chmod(0o1777)
    (folder / "sshd_config").write_text(SSHD_CONFIG.format(ip=node.ip, host_key=keys / "host_ed25519_key"))
    return folder


def kept_in_home(home: Path) -> list[Path]:
    """What each node keeps of root's own home: the interpreter the virtual environment is built on,
    where it lies there (``~/.pyenv/versions/...``)."""
    base = Path(sys.base_prefix).resolve()
    return [base] if base.is_relative_to(home.resolve()) else []


def start_sshd(node: NodeSpec, state: LocalState, keys: Path) -> None:
    """The node's sshd: the first process of new PID and mount namespaces in its network namespace."""
    folder = prepare_node(node, Path(state.dir), keys)
    home = Path(pwd.getpwnam("root").pw_dir)
    keep = [str(p) for p in kept_in_home(home)]
    # the checkout stays at its own path in the node (under a /tmp or /root the node hides too): its
    # virtualenv's scripts and its editable install name it by that path
    boot = ["sh", "-c", BOOT.format(sshd=SSHD), "boot", str(folder), str(home), str(ROOT), *keep]
    log = open(folder / "sshd.log", "ab")  # noqa: SIM115 (the child holds it)
    proc = subprocess.Popen(
        ["ip", "netns", "exec", node.netns, "unshare", "--pid", "--fork", "--mount-proc", *boot],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    state.pids[node.name] = proc.pid
    state.save()


def ssh(state: LocalState, node: NodeSpec, command: str, timeout_s: float = 30.0) -> str:
    """``command`` on ``node`` over SSH, from here, with the cluster's key and Ray's client options."""
    key = Path(state.dir) / "ssh" / "id_ed25519"
    done = subprocess.run(
        ["ssh", "-i", str(key), *SSH_OPTIONS, f"root@{node.ip}", command],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if done.returncode != 0:
        raise ClusterError(f"ssh {node.ip} {command!r}: {done.stderr.strip()}")
    return done.stdout


def _port_open(ip: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((ip, port)) == 0


# ---------------------------------------------------------------- ray up / exec / down


def cluster_config(state: LocalState) -> dict[str, Any]:
    """``examples/cluster_local.yaml`` with this cluster's addresses and key."""
    config: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    head, *workers = state.nodes
    config["provider"].update({"head_ip": head.ip, "worker_ips": [w.ip for w in workers]})
    config["auth"]["ssh_private_key"] = str(Path(state.dir) / "ssh" / "id_ed25519")
    return config


def launcher_env(root: Path) -> dict[str, str]:
    """The environment of ``ray`` here: nothing of the caller's Ray; Ray's own files (the local
    provider's state and lock, its config cache, temporary files) in the cluster's folder, not in
    /tmp; the head's autoscaler v1 (``ray up`` starts v2 by default, which starts no worker of the
    local provider)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(
        {"TMPDIR": str(root / "launcher"), "RAY_UP_enable_autoscaler_v2": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    )
    return env


def ray(state: LocalState, *args: str, timeout_s: float = 300.0) -> str:
    """``ray <args>`` of the pinned Ray, here; its output (the error carries it on failure)."""
    done = subprocess.run(
        [str(BIN / "ray"), *args],
        env=launcher_env(Path(state.dir)),
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if done.returncode != 0:
        raise ClusterError(f"ray {' '.join(args)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done.stdout


def reported_nodes(status: str) -> int:
    """How many nodes ``ray status`` lists as active or idle."""
    count, counting = 0, False
    for line in status.splitlines():
        line = line.strip()
        if line.endswith(":"):
            counting = line in ("Active:", "Idle:")
        elif counting and line.split(" ", 1)[0].isdigit():
            count += int(line.split(" ", 1)[0])
    return count


def ray_status(state: LocalState) -> str:
    """What ``ray exec <config> 'ray status'`` prints, once it lists every node (else "")."""
    status = ray(state, "exec", str(state.config), "ray status", timeout_s=60)
    return status if reported_nodes(status) == len(state.nodes) else ""


def control_dir(cluster_name: str) -> Path:
    """Where Ray's SSH client keeps its shared connections to a cluster's nodes (SSHCommandRunner's
    ``ControlPath`` folder, always under /tmp; the connections outlive ``ray`` by ``ControlPersist``)."""
    user = hashlib.sha256(getpass.getuser().encode()).hexdigest()[:10]
    cluster = hashlib.sha256(cluster_name.encode()).hexdigest()[:10]
    return Path(f"/tmp/ray_ssh_{user}/{cluster}")


def close_connections(state: LocalState, cluster_name: str) -> None:
    """End Ray's shared SSH connections to the nodes (``ssh -O exit``) and remove their folder."""
    folder = control_dir(cluster_name)
    if not folder.is_dir():
        return
    for node in state.nodes:
        subprocess.run(
            ["ssh", "-o", f"ControlPath={folder}/%C", "-O", "exit", f"root@{node.ip}"],
            capture_output=True,
            timeout=10,
        )
    shutil.rmtree(folder, ignore_errors=True)
    if not any(folder.parent.iterdir()):
        folder.parent.rmdir()


def dashboard(path: str = "") -> str:
    return f"http://{HEAD.ip}:{DASHBOARD_PORT}{path}"


def ray_nodes() -> list[dict[str, Any]]:
    """Alive Ray nodes, from the head's state API."""
    reply = netns_cluster.http_json(dashboard("/api/v0/nodes?limit=100&detail=true"))
    return [n for n in reply["data"]["result"]["result"] if n.get("state") == "ALIVE"]


# ---------------------------------------------------------------- Serve


def write_serve_config(state: LocalState, model_repository: Path, models: list[str] | None) -> Path:
    """``tools.netns_cluster``'s Serve config (every node's ingress on its own address, the server
    application on the head); with ``models``, those alone are loaded."""
    path = netns_cluster.write_serve_config(state, model_repository)
    if models:
        config = yaml.safe_load(path.read_text())
        for app in config["applications"]:
            app["args"].update({"model_control_mode": "explicit", "load_model": models})
        path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def settled_models(state: LocalState) -> list[dict[str, Any]]:
    """The loaded models of the repository index, once each is READY or UNAVAILABLE (else [])."""
    loaded = [m for m in netns_cluster.model_index(state, HEAD) if m.get("state")]
    return loaded if all(m["state"] in ("READY", "UNAVAILABLE") for m in loaded) else []


def model_ready(state: LocalState, node: NodeSpec, model: str) -> bool:
    try:
        netns_cluster.http_json(f"http://{state.ingress(node)}/v2/models/{model}/ready", timeout_s=5)
    except (OSError, urllib.error.URLError, ValueError):
        return False
    return True


# ---------------------------------------------------------------- up / down


@dataclass
class Started:
    state: LocalState
    ray_status: str  # what `ray exec <yaml> 'ray status'` printed
    models: list[str]  # the models that answer through every node


def up(
    root: Path = DEFAULT_DIR,
    workers: int = 1,
    model_repository: Path = ROOT / "examples" / "model_repository",
    models: list[str] | None = None,
    http_port: int = HTTP_PORT,
    nodes_only: bool = False,
    timeout_s: float = 300.0,
    log: Any = print,
) -> Started:
    """The nodes with their sshd, then ``ray up``, ``ray exec 'ray status'``, ``serve deploy``, until
    every node's ingress answers for every model."""
    reason = unavailable_reason()
    if reason:
        raise ClusterError(reason)
    state = LocalState(dir=str(root), http_port=http_port, workers=workers)
    if _names(state) or netns_cluster.link_exists(NETWORK.bridge) or root.exists():
        raise ClusterError(f"a cluster is already up ({root}, {NETWORK.bridge}); run `down` first")
    start = time.monotonic()
    root.mkdir(parents=True)
    state.save()
    try:
        keys = make_keys(root)
        (root / "launcher").mkdir()  # the TMPDIR of `ray` (launcher_env)
        netns_cluster.make_network(state, state.nodes)
        for node in state.nodes:
            start_sshd(node, state, keys)
        for node in state.nodes:
            netns_cluster.wait_for(f"sshd on {node.ip}", lambda n=node: _port_open(n.ip, 22), 30)
            ssh(state, node, "true")
        state.config.write_text(yaml.safe_dump(cluster_config(state), sort_keys=False))
        serve_config = write_serve_config(state, model_repository, models)
        log(f"{len(state.nodes)} nodes with sshd in {time.monotonic() - start:.0f}s; config {state.config}")
        if nodes_only:
            return Started(state, "", [])
        ray(state, "up", "-y", "--no-config-cache", str(state.config), timeout_s=timeout_s)
        log(f"ray up done in {time.monotonic() - start:.0f}s")
        count = len(state.nodes)
        netns_cluster.wait_for(f"{count} Ray nodes", lambda: len(ray_nodes()) == count, 180)
        status = netns_cluster.wait_for(f"`ray status` to list {count} nodes", lambda: ray_status(state), 60)
        log(f"all {count} nodes up in {time.monotonic() - start:.0f}s")
        netns_cluster.serve_deploy(serve_config, dashboard(), token=False)
        index = netns_cluster.wait_for("the models to load", lambda: settled_models(state), timeout_s)
        ready = [m["name"] for m in index if m["state"] == "READY"]
        if not ready:
            raise ClusterError(f"no model is READY: {index}")
        netns_cluster.wait_for(
            "every node to route every model",
            lambda: all(model_ready(state, n, m) for n in state.nodes for m in ready),
            120,
        )
        log(f"serving {len(ready)} models through {count} nodes in {time.monotonic() - start:.0f}s")
        return Started(state, status, ready)
    except BaseException:
        log(f"start failed; logs in {root}_failed_logs; taking the cluster down")
        _copy_logs(state)
        down(root, log=log)
        raise


def _copy_logs(state: LocalState) -> None:
    """Keep each node's sshd log and Ray logs next to the cluster folder (``down`` deletes it)."""
    root = Path(state.dir)
    keep = root.with_name(root.name + "_failed_logs")
    shutil.rmtree(keep, ignore_errors=True)
    keep.mkdir(parents=True)
    for node in state.nodes:
        folder = root / node.name
        if (folder / "sshd.log").is_file():
            shutil.copy(folder / "sshd.log", keep / f"{node.name}_sshd.log")
        # session_latest links to the session by its path inside the node
        for logs in sorted((folder / "tmp" / "ray").glob("session_2*/logs"))[-1:]:
            shutil.copytree(logs, keep / node.name, ignore_dangling_symlinks=True, dirs_exist_ok=True)


def _names(state: LocalState) -> list[str]:
    """The cluster's namespaces: those of the state file, and any of the prefix (a lost state file)."""
    prefix = f"{NETWORK.prefix}-"
    return sorted(n for n in netns_cluster.existing_netns() if n in state.netns or n.startswith(prefix))


def namespace_init(pid: int) -> bool:
    """Whether ``pid`` is the first process of a PID namespace below this one (a node's sshd)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            ids = line.split()[1:]
            return len(ids) > 1 and ids[-1] == "1"
    return False


def down(root: Path = DEFAULT_DIR, log: Any = print) -> None:
    """``ray down``, then everything ``up`` started, by pid; the namespaces, the bridge, the folders."""
    state = LocalState.load(root)
    names = _names(state)
    if state.config.is_file():
        if names:
            try:
                ray(state, "down", "-y", str(state.config), timeout_s=120)
            except (ClusterError, subprocess.TimeoutExpired) as exc:
                log(f"ray down: {exc}")
        close_connections(state, yaml.safe_load(state.config.read_text())["cluster_name"])
    inits = {pid for name in names for pid in netns_cluster.netns_pids(name) if namespace_init(pid)}
    links = [*state.links, *(n.veth for n in state.nodes), NETWORK.bridge]
    left = netns_cluster.clear_network(names, links, inits, log)
    if not left:
        shutil.rmtree(root, ignore_errors=True)
    log(f"cluster down ({len(names)} namespaces removed)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.ray_up_local", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("up", "down"))
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="the cluster's own folder")
    parser.add_argument("--workers", type=int, default=1, help="worker nodes besides the head")
    parser.add_argument("--model-repository", type=Path, default=ROOT / "examples" / "model_repository")
    parser.add_argument("--model", action="append", help="load this model only (repeatable)")
    parser.add_argument("--port", type=int, default=HTTP_PORT, help="HTTP port of every node's ingress")
    parser.add_argument("--nodes-only", action="store_true", help="the nodes and their sshd, no `ray up`")
    args = parser.parse_args(argv)
    if args.command == "down":
        down(args.dir)
        return 0
    try:
        started = up(args.dir, args.workers, args.model_repository, args.model, args.port, args.nodes_only)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(started.ray_status)
    for node in started.state.nodes:
        print(
            f"{node.name:5} {node.ip}  ingress http://{started.state.ingress(node)}  namespace {node.netns}"
        )
    print(f"cluster config {started.state.config}, dashboard {dashboard()}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
