"""Triton's system shared-memory extension: regions, their one record, and one process's mappings.

A client creates a POSIX shared-memory object (``/dev/shm/<key>``), registers a region of it under a
name (``POST /v2/systemsharedmemory/region/<name>/register``, gRPC ``SystemSharedMemoryRegister``),
and then names the region in a tensor's parameters (``shared_memory_region``,
``shared_memory_byte_size``, ``shared_memory_offset``): an input is read from it, a requested output
is written into it (the response then carries the output's name, data type and shape only).

Where each part lives:

* :class:`RegionTable` is the one record of the registered regions: the server application holds
  it (HAProxy sends ``/v2/systemsharedmemory`` there). A registration is checked as Triton checks it
  (the key opens, the region lies inside the object) and remembers the host it was made on
  (:func:`host_identity`) and the object's identity (device and inode).
* :class:`SharedMemory` is one process's view: its :class:`RegionSource` (the table itself in the
  server application, the server application's table through a call in a model replica) and the
  regions it has mapped. A process maps a region on its first use, only the region's bytes, and keeps
  the mapping until the region is unregistered.
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
* A region is host-local: a process on another host than the one the region was registered on
  refuses it (the identity of ``/dev/shm``: the kernel's boot id and the device of the folder).

The codecs (HTTP and gRPC) only parse the parameters into a :class:`SharedRef` and leave a
:class:`SharedInput` in place of an input's data; ``deployments.protocol.inference_calls`` reads
the inputs before the request runs and writes the outputs after.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from repository_loader.errors import AlreadyExists, InternalError, InvalidArgument, NotFound

SHM_FOLDER = Path("/dev/shm")
REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"
SETTLE_TIMEOUT_S = 5.0
FOLLOW_TIMEOUT_S = 30.0
_UINT64 = 2**64


class AlreadyRegistered(AlreadyExists):
    """A region name registered twice: gRPC ``ALREADY_EXISTS``, HTTP 400 (as Triton answers both)."""

    @property
    def http_status(self) -> int:
        return 400


# --- what a tensor's parameters name ---------------------------------------------


@dataclass(frozen=True, slots=True)
class SharedRef:
    """Where a tensor's bytes lie: ``byte_size`` bytes at ``offset`` of region ``region`` (a
    ``byte_size`` of -1: not given)."""

    region: str
    byte_size: int
    offset: int = 0


class SharedInput:
    """An input whose data lies in shared memory, in place of the data until it is read."""

    __slots__ = ("ref", "datatype", "shape")

    def __init__(self, ref: SharedRef, datatype: str, shape: list[int]) -> None:
        self.ref = ref
        self.datatype = datatype
        self.shape = shape


def _json_unsigned(params: Mapping[str, Any], key: str, default: int) -> int:
    if key not in params:
        return default
    value = params[key]
    if type(value) is not int or value < 0 or value >= _UINT64:
        raise InternalError(
            f"Unable to parse '{key}': attempt to access JSON non-unsigned-integer as unsigned-integer"
        )
    return value


def json_ref(params: Mapping[str, Any]) -> SharedRef:
    """The region a JSON tensor's ``parameters`` name (they hold ``shared_memory_region``)."""
    region = params[REGION]
    if type(region) is not str:
        raise InternalError(f"Unable to parse '{REGION}': attempt to access JSON non-string as string")
    return SharedRef(region, _json_unsigned(params, BYTE_SIZE, -1), _json_unsigned(params, OFFSET, 0))


def json_input_ref(name: str, item: Mapping[str, Any], params: Mapping[str, Any]) -> SharedRef:
    """An HTTP input read from shared memory: its data may come from nowhere else."""
    given = ["data"] if "data" in item else []
    given += [field for field in ("binary_data_size", REGION) if field in params]
    if len(given) > 1:
        raise InvalidArgument(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
            f"'{REGION}' in 'parameters'. But set " + " ".join(f"'{g}'" for g in given)
        )
    return json_ref(params)


def json_output_ref(params: Mapping[str, Any]) -> SharedRef:
    """An HTTP output written into shared memory: not also in binary form."""
    if params.get("binary_data") is True:
        raise InvalidArgument(f"Output can't set both '{REGION}' and 'binary_data'")
    return json_ref(params)


def grpc_ref(name: str, params: Mapping[str, Any]) -> SharedRef:
    """The region a gRPC tensor's parameters name (plain values: ``grpc_codec.parameters_dict``)."""
    region = params[REGION]
    if type(region) is not str:
        raise InvalidArgument(f"'{REGION}' of tensor '{name}' must be a string parameter")
    numbers = []
    for key, default in ((BYTE_SIZE, -1), (OFFSET, 0)):
        value = params.get(key, default)
        if key in params and (type(value) is not int or value < 0):
            raise InvalidArgument(f"'{key}' of tensor '{name}' must be a non-negative int64 parameter")
        numbers.append(value)
    return SharedRef(region, numbers[0], numbers[1])


def register_request(doc: Mapping[str, Any]) -> tuple[str, int, int]:
    """``key``, ``offset`` and ``byte_size`` of an HTTP register request's JSON, in Triton's words."""
    for field in ("key", "byte_size"):
        if field not in doc:
            raise InvalidArgument(f"Shared memory register request has no '{field}' field")
    key = doc["key"]
    if type(key) is not str:
        raise InternalError("attempt to access JSON non-string as string")
    numbers = [doc.get("offset", 0), doc["byte_size"]]
    if any(type(n) is not int or not 0 <= n < _UINT64 for n in numbers):
        raise InternalError("attempt to access JSON non-unsigned-integer as unsigned-integer")
    return key, numbers[0], numbers[1]


# --- regions and their record ------------------------------------------------------


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
        _fire(self._heard)
        self._heard = None
        if self.generation <= seen and (question is None or follower in self._answers):
            if self._moved is None:
                self._moved = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._moved.wait(), timeout_s)
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
            _fire(self._decided)
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
                await asyncio.wait_for(self._heard.wait(), left)

    def _wake(self) -> None:
        """Every follower waiting in :meth:`follow` returns the new state."""
        _fire(self._moved)
        self._moved = None


def _fire(event: asyncio.Event | None) -> None:
    if event is not None:
        event.set()


# --- one process's mappings -----------------------------------------------------------


class MappedRegion:
    """A region mapped into this process: exactly its bytes (from the page that holds its start)."""

    __slots__ = ("region", "_map", "view")

    def __init__(self, region: Region) -> None:
        if region.host != host_identity():
            raise InvalidArgument(
                f"shared memory region '{region.name}' was registered on another host than this model "
                "replica's: system shared memory is local to a host; send the tensor in the request, "
                "or reach a replica on the client's host"
            )
        try:
            fd = os.open(key_path(region.key), os.O_RDWR)
        except OSError:
            raise InternalError(f"Unable to open shared memory region: '{region.key}'") from None
        try:
            info = os.fstat(fd)
            if (
                info.st_dev,
                info.st_ino,
            ) != region.file_id or info.st_size < region.offset + region.byte_size:
                raise InvalidArgument(
                    f"shared memory key '{region.key}' no longer holds region '{region.name}' (it was removed "
                    "or made again since the region was registered): register the region again"
                )
            start = region.offset - region.offset % mmap.ALLOCATIONGRANULARITY
            lead = region.offset - start
            self._map = mmap.mmap(fd, lead + region.byte_size, offset=start)
        finally:
            os.close(fd)
        self.region = region
        self.view = memoryview(self._map)[lead : lead + region.byte_size]

    def span(self, ref: SharedRef) -> memoryview:
        """The bytes ``ref`` names, checked against the region as Triton checks them."""
        size = self.region.byte_size
        if ref.offset >= size:
            raise InvalidArgument(f"Invalid offset for shared memory region: '{ref.region}'")
        if ref.byte_size < 0 or ref.offset + ref.byte_size > size:
            raise InvalidArgument(f"Invalid offset + byte size for shared memory region: '{ref.region}'")
        return self.view[ref.offset : ref.offset + ref.byte_size]

    def close(self) -> None:
        """Unmap, or leave it to the last tensor still viewing it (it unmaps when that one goes)."""
        with contextlib.suppress(BufferError):
            self.view.release()
            self._map.close()


class SharedMemory:
    """One process's view of the regions: register, status and unregister go to its source, and the
    regions its tensors use are mapped here on their first use and dropped when the table changes.
    It counts the regions its requests in flight use, to answer an unregister's question."""

    def __init__(self, source: RegionSource, follower: str = "") -> None:
        self.source = source
        self.follower = follower or f"{host_identity()}:{os.getpid()}:{id(self)}"
        self._mapped: dict[str, MappedRegion] = {}
        self._seen = -1  # the table's generation the mappings reflect (-1: not following yet)
        self._following: asyncio.Task[None] | None = None
        self._in_use: Counter[str] = Counter()  # region -> requests in flight that use it
        self._answered = 0  # the id of the last question answered
        self._fenced: frozenset[str] = frozenset()  # answered unused; first uses wait for the verdict
        self._lifted: asyncio.Event | None = None  # set when the fence is lifted (then replaced)

    async def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        await self.source.register(name, key, offset, byte_size)

    async def unregister(self, name: str = "") -> None:
        await self.source.unregister(name)

    async def status(self, name: str = "") -> list[dict[str, Any]]:
        return await self.source.status(name)

    @contextlib.contextmanager
    def using(self, names: Iterable[str]) -> Iterator[None]:
        """A request uses regions ``names`` while inside (from before it looks them up until its
        outputs are written): an unregister of one of them is refused meanwhile."""
        held = list(names)
        self._in_use.update(held)
        try:
            yield
        finally:
            self._in_use.subtract(held)
            for name in held:
                if self._in_use[name] <= 0:
                    del self._in_use[name]

    def in_use(self) -> list[str]:
        """The regions the requests in flight use now."""
        return sorted(self._in_use)

    async def mapped(self, name: str) -> MappedRegion:
        """Region ``name`` mapped here (mapped now on its first use)."""
        while name in self._fenced:
            if self._lifted is None:
                self._lifted = asyncio.Event()
            await self._lifted.wait()
        found = self._mapped.get(name)
        if found is not None:
            return found
        region, generation = await self.source.region(name, self.follower)
        mapped = MappedRegion(region)
        if generation >= self._seen:  # else the table moved on since: use it for this request only
            self._mapped[name] = mapped
            if self._seen < 0:
                self._seen = generation
                self._following = asyncio.get_running_loop().create_task(self._follow())
        return mapped

    async def _follow(self) -> None:
        answer: Answer | None = None
        while True:
            try:
                state = await self.source.follow(self.follower, self._seen, FOLLOW_TIMEOUT_S, answer)
            except asyncio.CancelledError:
                raise
            except Exception:  # the server application restarting: ask again
                self._lift()
                await asyncio.sleep(1.0)
                continue
            answer = None
            if state.generation > self._seen:
                self.drop()
                self._seen = state.generation
            question = state.question
            if question is None or question.id != self._answered:
                self._lift()
            if question is not None and question.id != self._answered:
                answer = self.answer(question)

    def answer(self, question: Question) -> Answer:
        """Which of the names asked this process's requests use; the others are fenced until the
        question closes."""
        in_use = tuple(n for n in question.names if n in self._in_use)
        self._answered = question.id
        self._fenced = frozenset(question.names).difference(in_use)
        return Answer(question.id, in_use)

    def _lift(self) -> None:
        self._fenced = frozenset()
        _fire(self._lifted)
        self._lifted = None

    def drop(self) -> None:
        """Unmap every region (the table changed)."""
        mapped, self._mapped = self._mapped, {}
        for region in mapped.values():
            region.close()

    def close(self) -> None:
        if self._following is not None:
            self._following.cancel()
        self._lift()
        self.drop()


def write_into(span: memoryview, data: Any, output: str) -> None:
    """``data`` (bytes-like) into ``span``, refused in Triton's words where it does not fit."""
    buf = memoryview(data).cast("B")
    size = buf.nbytes
    if size > len(span):
        raise InternalError(
            f"shared memory size specified with the request for output '{output}' ({len(span)} bytes) "
            f"should be at least {size} bytes to hold the results"
        )
    span[:size] = buf


def local_shared_memory() -> SharedMemory:
    """A process that holds the table itself (the server application; a server without Ray)."""
    return SharedMemory(RegionTable())


__all__ = [
    "AlreadyRegistered",
    "Answer",
    "MappedRegion",
    "Question",
    "Region",
    "RegionSource",
    "RegionTable",
    "SharedInput",
    "SharedMemory",
    "SharedRef",
    "TableState",
    "grpc_ref",
    "host_identity",
    "json_input_ref",
    "json_output_ref",
    "local_shared_memory",
    "open_region",
    "register_request",
    "write_into",
]
