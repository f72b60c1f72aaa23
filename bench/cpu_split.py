"""Where the machine's CPU goes while a scenario measures, by role, read from ``/proc``.

On a small machine the load generator, HAProxy, Ray's own processes and the model replicas all
share the same cores, so a served throughput is only explained once it is known who spent the
CPU. :func:`take_snapshot` reads every process's user + system CPU seconds; :func:`cores_by_role`
turns two snapshots into cores used per role over the interval between them:

- ``model replicas``: Serve replicas of model deployments (HTTP, batching and the framework);
- ``HAProxy``: Serve's HAProxy ingress;
- ``tritonserver``: the reference server, where it runs;
- ``bench client``: the processes the caller names (by default this one, the load generator) and
  their descendants (load-generating worker processes);
- ``everything else``: Ray's controller, raylet, GCS and dashboard, the kernel's own threads.

Processes that start between the snapshots count from zero; processes that end are not counted
(their CPU is no longer visible). Where ``/proc`` does not exist, snapshots are empty.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

REPLICAS = "model replicas"
HAPROXY = "HAProxy"
TRITONSERVER = "tritonserver"
CLIENT = "bench client"
OTHER = "everything else"
ROLES = (REPLICAS, HAPROXY, TRITONSERVER, CLIENT, OTHER)

_PROC = Path("/proc")
_MODEL_REPLICA_MARK = "ServeReplica:model-"


@dataclass(frozen=True)
class CpuSnapshot:
    """CPU seconds used so far by every process, and when they were read."""

    wall_s: float
    cpu_s: Mapping[int, float] = field(default_factory=dict)
    cmdlines: Mapping[int, str] = field(default_factory=dict)
    parents: Mapping[int, int] = field(default_factory=dict)

    def descendants(self, roots: Collection[int]) -> set[int]:
        """``roots`` and every process below them."""
        children: dict[int, list[int]] = {}
        for pid, parent in self.parents.items():
            children.setdefault(parent, []).append(pid)
        found, todo = set(roots), list(roots)
        while todo:
            for child in children.get(todo.pop(), ()):
                if child not in found:
                    found.add(child)
                    todo.append(child)
        return found


def _stat_fields(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, ppid, ..., utime, stime, ...)."""
    return (_PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()


def _cpu_s(fields: list[str]) -> float:
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads) so far."""
    return _cpu_s(_stat_fields(pid))


def _read_process(pid: int) -> tuple[str, float, int] | None:
    try:
        fields = _stat_fields(pid)
        cmdline = (_PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:  # it ended meanwhile
        return None
    return cmdline.strip(), _cpu_s(fields), int(fields[1])


def take_snapshot() -> CpuSnapshot:
    """The CPU seconds of every process now (empty where ``/proc`` is missing)."""
    wall = time.perf_counter()
    cpu: dict[int, float] = {}
    cmdlines: dict[int, str] = {}
    parents: dict[int, int] = {}
    if _PROC.is_dir():
        for entry in _PROC.iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            found = _read_process(pid)
            if found is not None:
                cmdlines[pid], cpu[pid], parents[pid] = found
    return CpuSnapshot(wall, cpu, cmdlines, parents)


def role_of(pid: int, cmdline: str, client_pids: Collection[int]) -> str:
    """The role of one process (see the module's description)."""
    if pid in client_pids:
        return CLIENT
    if _MODEL_REPLICA_MARK in cmdline:
        return REPLICAS
    program = cmdline.split(" ", 1)[0]
    if "haproxy" in program:
        return HAPROXY
    if program.endswith("tritonserver"):
        return TRITONSERVER
    return OTHER


def cores_by_role(
    before: CpuSnapshot,
    after: CpuSnapshot,
    client_pids: Collection[int] | None = None,
    server_pids: Collection[int] = (),
) -> dict[str, float]:
    """Cores each role used on average between two snapshots (every role present, 0.0 when idle).

    ``server_pids``: processes that, with their descendants, are never the client, though they may
    descend from it (a server the benchmark started).
    """
    roots = {os.getpid()} if client_pids is None else set(client_pids)
    clients = after.descendants(roots) - after.descendants(server_pids)
    wall = after.wall_s - before.wall_s
    cores = dict.fromkeys(ROLES, 0.0)
    if wall <= 0:
        return cores
    for pid, used in after.cpu_s.items():
        spent = used - before.cpu_s.get(pid, 0.0)
        if spent > 0:
            cores[role_of(pid, after.cmdlines.get(pid, ""), clients)] += spent / wall
    return cores


def per_request_ms(cores: Mapping[str, float], requests_per_s: float) -> dict[str, float]:
    """CPU milliseconds per request of each role, and their ``total``, at ``requests_per_s``."""
    if requests_per_s <= 0:
        return {}
    out = {role: 1000.0 * value / requests_per_s for role, value in cores.items()}
    out["total"] = sum(out.values())
    return out
