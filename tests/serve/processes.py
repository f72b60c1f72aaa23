"""The processes a test started, found by parentage (never by name), and the ports they listen on."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def descendants(root: int | None = None) -> set[int]:
    """Every live process below ``root`` (this process by default)."""
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
    """Those of ``pids`` still running (zombies count as ended)."""
    live = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            live.add(pid)
    return live


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()
    except OSError:
        return ""


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
