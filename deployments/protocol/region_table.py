"""The one record of the registered system shared-memory regions, and how the processes that map
them follow it (``deployments.protocol.shared_memory``: the extension, and one process's mappings).

* :class:`RegionTable` is the one record of the registered regions: the server application holds
  it (HAProxy sends ``/v2/systemsharedmemory`` there). A registration is checked as Triton checks it
  (the key opens, the region lies inside the object) and remembers the host it was made on
  (:func:`host_identity`) and the object's identity (device and inode).
* A process that maps regions follows the table (:meth:`RegionTable.follow`, a long poll). An
  unregister first asks every follower which of its regions the requests in flight there use (a
  :class:`Question`; each answers with its next poll). A region in use stays registered, and the
  client is told so in Triton's words; for the others the table's generation moves, each follower
  drops every mapping and says so by asking again. The unregister answers only once every follower
  has answered and acknowledged (or did not answer within :data:`SETTLE_TIMEOUT_S`: a follower that
  went away, then forgotten), so a region registered again under the same name is never read
  through the old mapping.
* While a question is open, a region it names is fenced: the table holds lookups of it, and a
  follower holds its requests' first use of the regions it answered unused, until the unregister
  decided; a request counts as using its regions from before its first lookup until its outputs
  are written. So a request either made the answer say "in use", or it waits and then finds the
  region gone (Triton's "Unable to find") or kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from deployments.timeouts import within
from repository_loader.errors import AlreadyExists, InternalError, InvalidArgument, NotFound

SHM_FOLDER = Path("/dev/shm")
SETTLE_TIMEOUT_S = 5.0
FOLLOW_TIMEOUT_S = 30.0


class AlreadyRegistered(AlreadyExists):
    """A region name registered twice: gRPC ``ALREADY_EXISTS``, HTTP 400 (as Triton answers both)."""

    @property
    def http_status(self) -> int:
        return 400


@dataclass(frozen=True)
class Region:
    """A registered region: ``byte_size`` bytes at ``offset`` of the object ``/dev/shm/<key>`` of the
    host ``host``, whose device and inode were ``file_id`` when it was registered."""

    name: str
    key: str
    offset: int
    byte_size: int
    host: str
    file_id: tuple[int, int]

    def status(self) -> dict[str, Any]:
        """Triton's status entry."""
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


@lru_cache(maxsize=1)
def host_identity() -> str:
    """Which ``/dev/shm`` this process sees: the kernel's boot id and the folder's device. Two processes
    agree only where a key names the same memory for both (one host, one shared-memory mount)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = os.uname().nodename
    return f"{boot}:{os.stat(SHM_FOLDER).st_dev}"


def key_path(key: str) -> Path:
    return SHM_FOLDER / key.lstrip("/")


def open_region(name: str, key: str, offset: int, byte_size: int) -> Region:
    """Check a registration as Triton does (the key opens, the region lies inside the object) and
    describe it; nothing stays open."""
    path = key_path(key)
    try:
        if not key.strip("/") or "/" in key.strip("/"):
            raise FileNotFoundError(key)
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        raise InternalError(f"Unable to open shared memory region: '{key}'") from None
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    if offset + byte_size > info.st_size:
        raise InvalidArgument(f"failed to register shared memory region '{name}': invalid args")
    if byte_size == 0:
        raise InvalidArgument(
            f"failed to register shared memory region '{name}': unable to process address spaceInvalid argument"
        )
    return Region(name, key, offset, byte_size, host_identity(), (info.st_dev, info.st_ino))


@dataclass(frozen=True)
class Question:
    """An unregister asking each follower which of ``names`` its requests in flight use."""

    id: int
    names: tuple[str, ...]


@dataclass(frozen=True)
class Answer:
    """A follower's answer to question ``question``: the names asked that its requests use."""

    question: int
    in_use: tuple[str, ...]


@dataclass(frozen=True)
class TableState:
    """What a follower learns from the table: its generation, and the question open now (if any)."""

    generation: int
    question: Question | None = None


class RegionSource(Protocol):
    """Where a process finds the registered regions (the table, or the server application's table)."""

    async def region(self, name: str, follower: str) -> tuple[Region, int]:
        """Region ``name`` (NotFound) and the table's generation; ``follower`` follows the table from now."""
        ...

    async def follow(
        self, follower: str, seen: int, timeout_s: float, answer: Answer | None = None
    ) -> TableState:
        """The table's state once its generation is past ``seen`` or it asks a question ``follower``
        has not answered (or after ``timeout_s``); ``answer`` answers the question asked last."""
        ...

    async def register(self, name: str, key: str, offset: int, byte_size: int) -> None: ...

    async def unregister(self, name: str) -> None: ...

    async def status(self, name: str) -> list[dict[str, Any]]: ...


class RegionTable:
    """The registered regions (the server application's record), with the generation that every
    unregister raises, the question an unregister asks, and the processes that follow it."""

    def __init__(self, settle_timeout_s: float = SETTLE_TIMEOUT_S) -> None:
        self._regions: dict[str, Region] = {}
        # starts at the clock, so a table made again (a restarted server application, which forgot
        # every region) is ahead of what any follower saw: followers drop their mappings
        self.generation = time.time_ns()
        self._acked: dict[str, int] = {}  # follower -> the generation it last acknowledged
        self._moved: asyncio.Event | None = None  # set when the state moves (then replaced)
        self._heard: asyncio.Event | None = None  # set when a follower acknowledges (then replaced)
        self._settle_timeout_s = settle_timeout_s
        self._unregistering = asyncio.Lock()  # one unregister at a time, as Triton's
        self._question: Question | None = None
        self._asked = time.time_ns()  # the last question's id (from the clock, as the generation)
        self._answers: dict[str, tuple[str, ...]] = {}  # follower -> its answer to the open question
        self._decided: asyncio.Event | None = None  # set when the open question closes

    async def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if name in self._regions:
            raise AlreadyRegistered(f"shared memory region '{name}' already in manager")
        region = await asyncio.to_thread(open_region, name, key, offset, byte_size)
        if name in self._regions:  # registered meanwhile
            raise AlreadyRegistered(f"shared memory region '{name}' already in manager")
        self._regions[name] = region

    async def unregister(self, name: str = "") -> None:
        """Unregister ``name`` (every region for ""): a name not registered is no error. A region that
        a request in flight uses stays registered (InternalError, Triton's words); the others are
        gone once every follower dropped its mappings."""
        async with self._unregistering:
            names = sorted(self._regions) if not name else [name] if name in self._regions else []
            if not names:
                return
            try:
                in_use = await self._ask(names)
                dropped = [n for n in names if n not in in_use]
                for n in dropped:
                    del self._regions[n]
                if dropped:
                    self.generation += 1
                    await self._settle()
            finally:
                self._close_question()
        if in_use and name:
            raise InternalError(f"Cannot unregister shared memory region '{name}', it is currently in use.")
        if in_use:
            raise InternalError(
                "Failed to unregister the following system shared memory regions: "
                + "".join(f"{n} ," for n in sorted(in_use))
            )

    async def status(self, name: str = "") -> list[dict[str, Any]]:
        if name:
            region = self._regions.get(name)
            if region is None:
                raise NotFound(f"Unable to find system shared memory region: '{name}'")
            return [region.status()]
        return [self._regions[n].status() for n in sorted(self._regions)]

    async def region(self, name: str, follower: str) -> tuple[Region, int]:
        while self._question is not None and name in self._question.names:  # fenced: wait for it
            if self._decided is None:
                self._decided = asyncio.Event()
            await self._decided.wait()
        found = self._regions.get(name)
        if found is None:
            raise NotFound(f"Unable to find shared memory region: '{name}'")
        self._acked.setdefault(follower, self.generation)
        return found, self.generation

    async def follow(
        self, follower: str, seen: int, timeout_s: float = FOLLOW_TIMEOUT_S, answer: Answer | None = None
    ) -> TableState:
        self._acked[follower] = seen
        question = self._question
        if answer is not None and question is not None and answer.question == question.id:
            self._answers[follower] = answer.in_use
        fire(self._heard)
        self._heard = None
        if self.generation <= seen and (question is None or follower in self._answers):
            if self._moved is None:
                self._moved = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await within(self._moved.wait(), timeout_s)
        return TableState(self.generation, self._question)

    async def _ask(self, names: list[str]) -> set[str]:
        """Which of ``names`` a request in flight uses, by every follower's answer (a follower that
        does not answer within the timeout is forgotten: it went away)."""
        if not self._acked:
            return set()
        self._asked += 1
        self._question = Question(self._asked, tuple(names))
        self._answers = {}
        self._wake()
        await self._wait_for(lambda: [f for f in self._acked if f not in self._answers])
        return {n for answer in self._answers.values() for n in answer if n in names}

    def _close_question(self) -> None:
        if self._question is not None:
            self._question = None
            self._answers = {}
            fire(self._decided)
            self._decided = None
            self._wake()

    async def _settle(self) -> None:
        """Until every follower acknowledged the current generation."""
        target = self.generation
        self._wake()
        await self._wait_for(lambda: [f for f, seen in self._acked.items() if seen < target])

    async def _wait_for(self, waiting: Callable[[], list[str]]) -> None:
        """Until ``waiting()`` names no follower; those it still names at the timeout are forgotten
        (were they alive they would have answered)."""
        deadline = time.monotonic() + self._settle_timeout_s
        while late := waiting():
            left = deadline - time.monotonic()
            if left <= 0:
                for follower in late:
                    self._acked.pop(follower, None)
                return
            if self._heard is None:
                self._heard = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await within(self._heard.wait(), left)

    def _wake(self) -> None:
        """Every follower waiting in :meth:`follow` returns the new state."""
        fire(self._moved)
        self._moved = None


def fire(event: asyncio.Event | None) -> None:
    if event is not None:
        event.set()


__all__ = [
    "FOLLOW_TIMEOUT_S",
    "SETTLE_TIMEOUT_S",
    "AlreadyRegistered",
    "Answer",
    "Question",
    "Region",
    "RegionSource",
    "RegionTable",
    "TableState",
    "fire",
    "host_identity",
    "key_path",
    "open_region",
]
