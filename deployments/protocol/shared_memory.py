"""Triton's system shared-memory extension: regions, their one record, and one process's mappings.

A client creates a POSIX shared-memory object (``/dev/shm/<key>``), registers a region of it under a
name (``POST /v2/systemsharedmemory/region/<name>/register``, gRPC ``SystemSharedMemoryRegister``),
and then names the region in a tensor's parameters (``shared_memory_region``,
``shared_memory_byte_size``, ``shared_memory_offset``): an input is read from it, a requested output
is written into it (the response then carries the output's name, data type and shape only).

Where each part lives:

* ``deployments.protocol.region_table``: the one record of the registered regions
  (:class:`~deployments.protocol.region_table.RegionTable`, in the server application), and how an
  unregister asks the processes that map regions which ones their requests use.
* :class:`SharedMemory` is one process's view: its ``RegionSource`` (the table itself in the
  server application, the server application's table through a call in a model replica) and the
  regions it has mapped. A process maps a region on its first use, only the region's bytes, and keeps
  the mapping until the region is unregistered; it counts the regions its requests in flight use.
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
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from deployments.protocol.region_table import (
    FOLLOW_TIMEOUT_S,
    Answer,
    Question,
    Region,
    RegionSource,
    RegionTable,
    fire,
    host_identity,
    key_path,
)
from repository_loader.errors import InternalError, InvalidArgument

REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"
_UINT64 = 2**64


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
        fire(self._lifted)
        self._lifted = None

    def drop(self) -> None:
        """Unmap every region (the table changed)."""
        mapped, self._mapped = self._mapped, {}
        for region in mapped.values():
            region.close()

    def close(self) -> None:
        """Stop following the table and unmap every region (the follow ends on the loop's next turn)."""
        if self._following is not None:
            self._following.cancel()
        self._lift()
        self.drop()

    async def aclose(self) -> None:
        """:meth:`close`, returning once the follow (and the table call it waits on) has ended."""
        following = self._following
        self.close()
        if following is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await following


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
    "MappedRegion",
    "SharedInput",
    "SharedMemory",
    "SharedRef",
    "grpc_ref",
    "json_input_ref",
    "json_output_ref",
    "local_shared_memory",
    "register_request",
    "write_into",
]
