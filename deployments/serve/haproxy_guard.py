"""Bring a killed HAProxy back at once, with the configuration it ran, until Serve replaces it.

Serve notices a dead HAProxy only through its proxy health check (every
``RAY_SERVE_PROXY_HEALTH_CHECK_PERIOD_S``, three failures in a row), then starts a new HAProxy
manager actor: the port refused connections for 6-8 s on this machine. The HAProxy shim
(``deployments.serve.haproxy_shim``) forks this guard just before it becomes HAProxy. The guard:

* waits for the HAProxy it guards to exit;
* if the manager runs another HAProxy on the same configuration (its child, read from ``/proc``), or
  another HAProxy answers the admin socket by then, that one took over (Serve's graceful reload
  starts a new process with ``-sf``, and the old one drains and exits): the guard ends;
* if nothing answers and Serve's HAProxy manager (the shim's parent) still lives, HAProxy was killed
  or crashed: the guard starts it again with the same arguments (less ``-sf``/``-st``/``-x``, which
  name processes that are gone) and guards that one, which answers the admin socket as before, so
  Serve's health check never fails;
* when Serve later reloads, its new HAProxy takes the admin socket over; the guard then soft-stops
  the HAProxy it started (``SIGUSR1``, as ``-sf`` would have) and ends;
* when the manager ends, the guard ends the HAProxy it started and itself.

Serve stops HAProxy with ``SIGKILL`` too; a stop with the manager alive (a node's proxy drained) is
followed by the manager's end, which ends what the guard started. ``TRITON_SERVE_HAPROXY_GUARD=0``
turns the guard off.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

GUARD_ENV = "TRITON_SERVE_HAPROXY_GUARD"
POLL_S = 0.1
GRACE_S = 0.25
"""How long after HAProxy's end the guard waits before starting it again: Serve stops HAProxy with
``SIGKILL`` as a fault would, and ends its manager within this time when it means it."""
_SOCKET = re.compile(r"^\s*stats\s+socket\s+(\S+)", re.MULTILINE)
_OLD_PROCESS_FLAGS = ("-sf", "-st")  # followed by one or more pids
_SOCKET_TRANSFER = "-x"  # followed by the old process's socket


def _say(message: str) -> None:
    """One line in the guard's log (its standard output): what it saw and did, with the time."""
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} haproxy-guard[{os.getpid()}]: {message}", flush=True)


def enabled() -> bool:
    return os.environ.get(GUARD_ENV, "1") not in ("0", "false", "no")


def config_path(args: Sequence[str]) -> str | None:
    """The configuration file after ``-f`` in ``args``."""
    return next((args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "-f"), None)


def admin_socket(args: Sequence[str]) -> str | None:
    """The admin socket the configuration after ``-f`` in ``args`` names."""
    config = config_path(args)
    if config is not None:
        with contextlib.suppress(OSError):
            found = _SOCKET.search(Path(config).read_text())
            if found:
                return found.group(1)
    return None


def fresh_args(args: Sequence[str]) -> list[str]:
    """``args`` without the flags that hand over from an earlier process (it is gone)."""
    out: list[str] = []
    skipping = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in _OLD_PROCESS_FLAGS:
            skipping = True
        elif arg == _SOCKET_TRANSFER:
            i += 2
            skipping = False
            continue
        elif skipping and arg.isdigit():
            pass
        else:
            skipping = False
            out.append(arg)
        i += 1
    return out


def answering_pid(path: str, timeout_s: float = 0.5) -> int | None:
    """The pid of the HAProxy answering the admin socket at ``path`` (None: none answers)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout_s)
            conn.connect(path)
            conn.sendall(b"show info\n")
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
    except OSError:
        return None
    for line in data.decode(errors="replace").splitlines():
        if line.startswith("Pid:"):
            with contextlib.suppress(ValueError):
                return int(line.split(":", 1)[1])
    return None


def _stat(pid: int | str) -> tuple[int, int]:
    """``pid``'s parent and start time (clock ticks since boot), from ``/proc/<pid>/stat`` (the fields
    after its command name, which may hold spaces); OSError or ValueError where it is gone."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[1]), int(fields[19])


def start_time(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (None: it is gone)."""
    try:
        return _stat(pid)[1]
    except (OSError, ValueError, IndexError):
        return None


def sibling_haproxy(manager: int, config: str, gone: int, started: int | None) -> int | None:
    """A live child of ``manager`` started after ``gone`` (at ``started``) running HAProxy (or the shim
    about to become it) on a configuration in ``config``'s folder: the HAProxy that Serve's reload
    started (the manager starts each one; one the guard starts is the guard's child, and an older one
    still draining after an earlier reload listens no more). Read from ``/proc``, so a busy admin
    socket cannot hide it."""
    if started is None:
        return None
    folder = os.path.dirname(config)
    try:
        entries = list(Path("/proc").iterdir())
    except OSError:  # no /proc (not Linux): the admin socket alone tells
        return None
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) == gone:
            continue
        try:
            parent, began = _stat(entry.name)
            if parent != manager or began <= started:
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        for i, arg in enumerate(argv[:-1]):
            if arg == b"-f" and os.path.dirname(os.fsdecode(argv[i + 1])) == folder:
                return int(entry.name)
    return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_exit(pid: int, still_wanted: Callable[[], bool]) -> bool:
    """Until ``pid`` exits (True) or ``still_wanted()`` turns false (False)."""
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        fd = None
    try:
        while True:
            if fd is not None:
                ready, _, _ = select.select([fd], [], [], POLL_S)
                if ready:
                    return True
            else:
                time.sleep(POLL_S)
                if not alive(pid):
                    return True
            if not still_wanted():
                return False
    finally:
        if fd is not None:
            os.close(fd)


class _Guard:
    def __init__(self, path: str, manager: int, argv: list[str], preexec: Callable[[], None] | None) -> None:
        self.path = path
        self.manager = manager
        self.argv = argv
        self.preexec = preexec
        self.ours: subprocess.Popen[bytes] | None = None  # the HAProxy the guard started, if any
        self.replaced = False

    def successor(self, pid: int) -> bool:
        """Whether another HAProxy than ``pid`` answers the admin socket."""
        answering = answering_pid(self.path)
        return answering is not None and answering != pid

    def wanted(self) -> bool:
        """Whether to go on guarding: the manager lives, and no HAProxy of Serve's replaced ours."""
        if not alive(self.manager):
            return False
        if self.ours is not None and self.successor(self.ours.pid):
            self.replaced = True
            return False
        return True

    def run(self, guarded: int) -> None:
        pid = guarded
        started = start_time(pid)
        _say(f"guarding HAProxy {pid} of manager {self.manager}")
        try:
            while True:
                if not _wait_exit(pid, self.wanted):
                    if self.replaced and self.ours is not None:
                        _say(f"Serve's HAProxy {answering_pid(self.path)} took over; soft-stopping {pid}")
                        self.ours.send_signal(signal.SIGUSR1)  # drain and exit, as -sf would have asked
                        with contextlib.suppress(subprocess.TimeoutExpired):
                            self.ours.wait(timeout=60)
                    else:
                        _say(f"manager {self.manager} ended; done")
                    return
                if self.ours is not None:
                    self.ours.wait()
                time.sleep(GRACE_S)  # Serve's own stop kills it too, and its manager right after
                if not alive(self.manager):
                    _say(f"HAProxy {pid} and its manager {self.manager} ended; done")
                    return
                config = config_path(self.argv)
                sibling = sibling_haproxy(self.manager, config, pid, started) if config else None
                if sibling is not None:
                    _say(
                        f"HAProxy {pid} exited; the manager runs HAProxy {sibling} on its configuration; done"
                    )
                    return
                answering = answering_pid(self.path)
                if answering is not None and answering != pid:
                    _say(f"HAProxy {pid} exited; {answering} answers the admin socket; done")
                    return
                self.ours = subprocess.Popen(self.argv, preexec_fn=self.preexec)
                _say(
                    f"HAProxy {pid} exited and none answers the admin socket: started it again as {self.ours.pid}"
                )
                pid, started = self.ours.pid, start_time(self.ours.pid)
        finally:
            if self.ours is not None and self.ours.poll() is None and not self.replaced:
                self.ours.kill()
                self.ours.wait()


def guard(
    guarded: int,
    manager: int,
    real: str,
    args: Sequence[str],
    preexec: Callable[[], None] | None = None,
) -> None:
    """Keep HAProxy answering while ``manager`` lives and no other HAProxy took over (see the module);
    ``preexec`` runs in each HAProxy the guard starts, before it runs."""
    path = admin_socket(args)
    if path is not None:
        _Guard(path, manager, [real, *fresh_args(args)], preexec).run(guarded)


def fork_guard(real: str, args: Sequence[str], preexec: Callable[[], None] | None = None) -> None:
    """In the shim, just before it becomes HAProxy: leave a guard of this process behind (its output,
    and that of an HAProxy it starts, in ``haproxy-guard.log`` beside the configuration)."""
    path = admin_socket(args)
    if not enabled() or path is None:
        return
    guarded, manager = os.getpid(), os.getppid()
    if os.fork() != 0:
        return
    # the guard: its own session, so that signals to HAProxy's group do not reach it; it must outlive
    # HAProxy (no parent-death signal) and end with the manager (it watches it). It lets go of the
    # manager's pipes, which the manager reads to their end when HAProxy fails to start.
    try:
        os.setsid()
        config = Path(config_path(args) or "")
        log = os.open(config.with_name("haproxy-guard.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, 65536)
        guard(guarded, manager, real, args, preexec)
    except BaseException:  # nothing to report to: the guard's log has the traceback
        import traceback

        traceback.print_exc()
    finally:
        os._exit(0)


__all__ = [
    "GUARD_ENV",
    "admin_socket",
    "answering_pid",
    "config_path",
    "fork_guard",
    "fresh_args",
    "guard",
    "sibling_haproxy",
    "start_time",
]
