"""The test helpers that find, check and end a server's processes tell a process from a later one that
was given the same pid (this machine's pids wrap at 32,768, within one test run)."""

from __future__ import annotations

import subprocess
import sys

from tests.serve import processes


def test_a_recorded_pid_is_alive_only_while_the_same_process_holds_it() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (found,) = processes.descendants() & {child.pid}
        mine = next(p for p in processes.descendants() if p == found)
        assert isinstance(mine, processes.Pid) and mine.born is not None
        assert processes.alive({mine}) == {child.pid}
        # the same number, held by a process that started at another tick: not the one recorded
        impostor = processes.Pid(child.pid, mine.born + 1)
        assert processes.alive({impostor}) == set()
        processes.end({impostor}, grace_s=0.1)  # signals nothing: the recorded process is gone
        assert child.poll() is None
        assert processes.identify(child.pid).born == mine.born
    finally:
        processes.end({processes.identify(child.pid)}, grace_s=5)
        child.wait(10)
    assert child.returncode is not None
    assert processes.alive({mine}) == set()
