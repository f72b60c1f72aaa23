"""How a replica follows the server's log settings (``deployments.serve.logs``), without Ray: it takes
the server's settings on its first call (a replica started after an update, or a server restarted with
kept settings), each later change as it is made, and keeps asking while the server cannot answer; the
settings a server keeps in the cluster come back over its flags, the file always from the flags."""

from __future__ import annotations

import asyncio

from deployments.protocol.log_settings import LogBoard
from deployments.serve import logs
from deployments.serve.server_api import ServerClient
from deployments.settings import LogSettings


class BoardServer(ServerClient):
    """The server application's side of the long poll, over a board; fails its first ``failures`` calls."""

    def __init__(self, board: LogBoard, failures: int = 0) -> None:
        super().__init__(handle=object())
        self.board = board
        self.failures = failures
        self.calls = 0

    async def log_settings(self, applied: LogSettings | None, timeout_s: float) -> LogSettings | None:
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError("the server is restarting")
        return await self.board.wait(applied, timeout_s)


async def _until(check, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "not applied in time"
        await asyncio.sleep(0.01)


def test_a_replica_takes_the_current_settings_then_every_change(monkeypatch) -> None:
    monkeypatch.setattr(logs, "RETRY_S", 0.01)
    applied: list[LogSettings] = []

    async def scenario() -> None:
        board = LogBoard(LogSettings(verbose_level=1))  # changed before this replica started
        server = BoardServer(board, failures=2)
        follower = asyncio.create_task(logs.follow(server, LogSettings(), applied.append, poll_timeout_s=5.0))
        try:
            await _until(lambda: applied == [LogSettings(verbose_level=1)])
            await board.update({"info": False})
            await _until(lambda: len(applied) == 2)
            assert applied[-1] == LogSettings(info=False, verbose_level=1)
        finally:
            follower.cancel()
        assert server.calls >= 4  # two failed, the first answer, the change

    asyncio.run(scenario())


def test_a_replica_started_with_the_current_settings_applies_nothing_again() -> None:
    applied: list[LogSettings] = []

    async def scenario() -> None:
        board = LogBoard(LogSettings(format="ISO8601"))
        follower = asyncio.create_task(
            logs.follow(BoardServer(board), LogSettings(format="ISO8601"), applied.append, 5.0)
        )
        await asyncio.sleep(0.05)
        follower.cancel()

    asyncio.run(scenario())
    assert applied == []


def test_kept_settings_come_back_over_the_flags() -> None:
    start = LogSettings(file="/var/log/server.log")
    kept = logs.encode(LogSettings(file="ignored.log", warning=False, verbose_level=2, format="ISO8601"))
    assert logs.decode(kept, start) == LogSettings(
        file="/var/log/server.log", warning=False, verbose_level=2, format="ISO8601"
    )
    assert logs.decode(None, start) == start
    assert logs.decode(b"not json", start) == start
