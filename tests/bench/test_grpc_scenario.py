"""The gRPC scenario's server loop: a server that dies during one mode is started again for the next.

Real processes (``sh``) stand in for the servers; nothing is measured.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.peers import ServerHandle, launch
from bench.results import Report, Run
from bench.scenarios import grpc as scenario


def _starter(tmp_path: Path, started: list[ServerHandle]):
    def start() -> ServerHandle:
        n = len(started)
        handle = launch(
            ["sh", "-c", f"echo 'started {n}'; exec sleep 60"],
            http_port=1,
            name=f"server {n}",
            log_path=tmp_path / "server.log",
        )
        started.append(handle)
        return handle

    return start


def _kill_once_logged(handle: ServerHandle) -> None:
    """SIGKILL the stand-in server once its first line is in its log."""
    assert handle.log_path is not None
    deadline = time.monotonic() + 10
    while "started" not in handle.log_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    handle.process.kill()
    handle.process.wait()


def test_a_server_that_dies_in_one_mode_is_recorded_and_started_again(tmp_path):
    started: list[ServerHandle] = []
    report = Report("grpc", {})
    seen: list[tuple[int, str]] = []

    def measure(handle: ServerHandle, run_label: str, protocol: str, extra: tuple[str, ...]) -> Run:
        seen.append((started.index(handle), run_label))
        if run_label == "peer (grpc streaming)":  # it crashes during this mode
            _kill_once_logged(handle)
        return Run(label=run_label, tool="perf_analyzer", model="m", url=handle.url)

    scenario.run_modes(report, "peer", _starter(tmp_path, started), measure)

    modes = [f"peer ({suffix})" for suffix, _, _ in scenario.MODES]
    assert [run_label for _, run_label in seen] == modes  # no mode lost
    assert seen[-1] == (1, "peer (http sync)")  # the mode after the crash ran on a new server
    assert all(index == 0 for index, _ in seen[:-1])
    (restart,) = report.notes["restarts"]["peer"]
    assert restart.startswith("exited with -9 before http sync")
    assert "started 0" in restart  # the dead server's log tail, read before the new one wrote over it
    assert all(h.process.poll() is not None for h in started)  # both stopped
    assert len(report.runs) == len(modes)


def test_a_server_that_cannot_start_again_ends_its_modes_with_a_note(tmp_path):
    started: list[ServerHandle] = []
    report = Report("grpc", {})
    start = _starter(tmp_path, started)

    def failing_second_start() -> ServerHandle:
        if started:
            raise scenario.PeerSetupError("no second start")
        return start()

    def measure(handle: ServerHandle, run_label: str, protocol: str, extra: tuple[str, ...]) -> Run:
        _kill_once_logged(handle)
        return Run(label=run_label, tool="perf_analyzer", model="m", url=handle.url)

    scenario.run_modes(report, "peer", failing_second_start, measure)

    assert len(report.runs) == 1
    second_mode = scenario.MODES[1][0]
    assert report.notes["skipped"] == {f"peer ({second_mode})": "no second start"}
    assert started[0].process.poll() is not None
