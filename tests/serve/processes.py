"""The processes a test started, found by parentage (never by name), and the ports they listen on.

A pid is known here with the clock tick its process started at (:class:`Pid`): this machine's pids wrap
at 32,768, so a pid a test recorded minutes ago can name another program by the time it is checked or
signalled. A recorded process counts as alive, and is signalled, only while the same process holds it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


class Pid(int):
    """A pid with its process's start time (``/proc/<pid>/stat`` field 22): equal to the plain pid, so
    sets and ``os.kill`` take it as one, and told apart from a later process given the same number."""

    born: int | None

    def __new__(cls, pid: int, born: int | None = None) -> Pid:
        self = super().__new__(cls, pid)
        self.born = born
        return self


def _stat_fields(pid: int) -> list[str] | None:
    """Fields 3 onwards of ``/proc/<pid>/stat`` (state, ppid, ...), or None where it has ended."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def identify(pid: int) -> Pid:
    """``pid`` with the start time of the process that holds it now."""
    fields = _stat_fields(pid)
    return Pid(pid, int(fields[19]) if fields else None)


def _children() -> dict[int, list[Pid]]:
    kids: dict[int, list[Pid]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is None:
            continue
        kids.setdefault(int(fields[1]), []).append(Pid(int(entry.name), int(fields[19])))
    return kids


def descendants(root: int | None = None) -> set[int]:
    """Every live process below ``root`` (this process by default), each a :class:`Pid`."""
    kids = _children()
    found: set[int] = set()
    todo = [os.getpid() if root is None else root]
    while todo:
        for child in kids.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` still running (zombies count as ended); a :class:`Pid` whose number another
    process has taken since counts as ended."""
    live = set()
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is None or fields[0] == "Z":
            continue
        born = getattr(pid, "born", None)
        if born is not None and int(fields[19]) != born:
            continue
        live.add(pid)
    return live


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()
    except OSError:
        return ""


def spare_workers(pids: set[int], preload: str) -> set[int]:
    """Those of ``pids`` that are idle Ray workers whose environment names ``preload`` as the setup hook:
    the spares a server keeps (deployments/serve/spare.py)."""
    from deployments.serve import hooks

    mark = f"{hooks.SETUP_HOOK_ENV}={preload}\0".encode()
    found = set()
    for pid in alive(pids):
        if hooks.IDLE_WORKER_TITLE in command(pid):
            with contextlib.suppress(OSError):
                if mark in Path(f"/proc/{pid}/environ").read_bytes():
                    found.add(pid)
    return found


def end(pids: set[int], grace_s: float = 5.0) -> None:
    """SIGTERM each of ``pids`` still alive, then SIGKILL what remains after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in alive(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while alive(pids) and time.monotonic() < deadline:
            time.sleep(0.1)


def listening(pids: set[int]) -> list[tuple[int, str, int]]:
    """``(pid, address, port)`` of every TCP socket in LISTEN state held by ``pids``."""
    inodes: dict[str, int] = {}
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = pid
        except OSError:
            continue
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            parts = line.split()
            if parts[3] != "0A" or parts[9] not in inodes:
                continue
            addr_hex, port_hex = parts[1].split(":")
            found.append((inodes[parts[9]], _address(addr_hex, width), int(port_hex, 16)))
    return found


def _address(hex_addr: str, width: int) -> str:
    if width == 8:
        return ".".join(str(int(hex_addr[i : i + 2], 16)) for i in (6, 4, 2, 0))
    if hex_addr == "0" * 32:
        return "::"
    words = [hex_addr[i : i + 8] for i in range(0, 32, 8)]
    raw = b"".join(bytes.fromhex(w)[::-1] for w in words)
    if raw[:12] == b"\0" * 10 + b"\xff\xff":
        return ".".join(str(b) for b in raw[12:])
    return ":".join(raw[i : i + 2].hex() for i in range(0, 16, 2))


def _threads_alive(pid: int) -> bool:
    """Whether any thread of ``pid`` still runs. A killed process's main thread turns zombie before its
    other threads have exited, and its sockets close only with the last of them."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tasks:
        try:
            state = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            return True
    return False


def wait_gone(pid: int, timeout_s: float = 10.0) -> float:
    """``time.monotonic()`` once every thread of ``pid`` has ended (so its sockets are closed), or after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while _threads_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.001)
    return time.monotonic()
