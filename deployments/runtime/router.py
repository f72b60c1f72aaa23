"""Where an inference runs: the one decision, for every way a request reaches a replica.

HTTP, gRPC (unary, streams, over HTTP/1.1), ``/generate``, BLS calls and ensemble steps all hand
their requests to a :class:`Router`; none of them chooses a destination. :meth:`Router.place`
is the decision and returns a :class:`Placement`:

* ``LOCAL``: a model this process runs (a replica's own model, or a composing model an
  ensemble hosts in process, handed tensors as the same objects);
* ``OWNER``: the replica holding a sequence's state, when this replica serves the model but
  another rank owns the sequence (:func:`owner_rank`); a sequence that its owner does not hold (it
  started before the model's replica count changed, under another owner) is asked of the other
  ranks (:meth:`Router.route`). An owner with no free slot for a new sequence lends it to a rank
  that has one and sends its later requests on there (:meth:`Router.route`);
* ``REMOTE``: any other model, through the serving layer's executor (another replica).

A replica of a passive instance group (``instance_group { passive: true }``) has its model loaded
but runs no request of it (:meth:`Router.place`): none is routed there, and one that comes all the
same goes on to a group that takes requests (``REMOTE``); where every group of the model is passive,
each request is refused UNAVAILABLE instead of waiting forever for an instance that never runs it.

The router is Ray-free: how an owner or another model is reached is given to it
(:class:`OwnerCalls`, a :class:`~deployments.inference.ModelExecutor`) by the serving layer
(``deployments.serve.peers``). An HTTP request may come with its body as it arrived
(:class:`RawRequest`); a request sent on to a sequence's owner then travels unchanged and the
owner's reply comes back as it is (:data:`RawReply`), the one fast path, decided here too.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from deployments.inference import InferRequest, InferResponse, ModelExecutor
from deployments.runtime.forward_order import SEQUENCE_ORDER, ArrivalGate, Order, PlacingLine, SendOrder
from deployments.tracing import TRACE_STEP_HEADER
from repository_loader.errors import NotFound, Unavailable, Unsupported

Headers = list[tuple[bytes, bytes]]
RawReply = tuple[int, Headers, bytes]
"""An HTTP reply as another replica sent it: status, headers, body."""

FORWARDED = b"x-triton-sequence-owner"
"""Set on a request sent on to a sequence's owner (value: the owner's rank): it runs where it lands."""

REPLICA_SNAPSHOT = b"x-triton-replica-snapshot"
"""Set on a sibling's request for a replica's own counts now (its statistics and metrics, not summed
with other replicas'). HAProxy removes these and ``TRACE_STEP_HEADER`` from client requests."""

PROBE = b"x-triton-sequence-probe"
"""Set beside ``FORWARDED`` on a request asked of a replica that may hold its sequence: one that does
not answers :data:`ABSENT` at once instead of running it (or refusing it for its missing START). On a
START it is a full owner's offer: never run, answered :data:`TAKEN` or :data:`ABSENT`."""

ABSENT = b"x-triton-sequence-absent"
"""Set on a probed replica's answer where it does not hold the request's sequence."""

TAKEN = b"x-triton-sequence-taken"
"""Set on a probed replica's answer to a START where it kept a free slot for the new sequence (or
holds it already): the owner then sends the START on there, and the sequence's later requests after it."""

INTERNAL_HEADERS = (FORWARDED, PROBE, SEQUENCE_ORDER, REPLICA_SNAPSHOT, TRACE_STEP_HEADER)
"""Headers only replicas set on their calls to each other."""


class Runner(Protocol):
    """A model this process runs (``deployments.runtime.model.ModelRuntime``)."""

    async def infer(self, request: InferRequest) -> InferResponse: ...

    def infer_stream(self, request: InferRequest) -> AsyncGenerator[InferResponse, None]: ...


def _can_start(runner: Runner, request: InferRequest) -> bool:
    """Whether ``runner`` would give ``request``'s new sequence a slot now (its
    ``can_start_sequence``, which a stateful model's runtime has; True for one without it)."""
    can_start = getattr(runner, "can_start_sequence", None)
    return True if can_start is None else bool(can_start(request.model_version))


def _reserve(runner: Runner, request: InferRequest) -> bool:
    """Whether ``runner`` kept a free slot for ``request``'s new sequence (its ``reserve_sequence``,
    which a stateful model's runtime has; False for one without it)."""
    reserve = getattr(runner, "reserve_sequence", None)
    return False if reserve is None else bool(reserve(request.model_version, request.correlation_id))


def _keep_ns(runner: Runner) -> int:
    """How long an owner remembers a loan after the sequence's last request: twice the model's idle
    limit, by when the replica holding it has released it (an hour where it has none)."""
    idle = getattr(runner, "sequence_idle_ns", None)
    idle_ns = 0 if idle is None else int(idle())
    return 2 * idle_ns if idle_ns > 0 else LENT_KEEP_NS


LENT_KEEP_NS = 3_600 * 10**9
"""How long an owner remembers where it lent a sequence that has no idle limit, after its last request."""


def _holds(runner: Runner, correlation_id: int | str) -> bool:
    """Whether ``runner`` holds sequence ``correlation_id`` (a slot, or a place in the backlog): its
    ``holds_sequence``, which a stateful model's runtime has; True for one without it."""
    holds = getattr(runner, "holds_sequence", None)
    return True if holds is None else bool(holds(correlation_id))


@dataclass(frozen=True)
class RawRequest:
    """An HTTP request as it arrived (path, headers, body), for sending it on unchanged."""

    path: str
    headers: Headers
    body: bytes

    @property
    def forwarded(self) -> bool:
        """Whether another replica sent this request here as the sequence's owner."""
        return any(key == FORWARDED for key, _ in self.headers)

    @property
    def probe(self) -> bool:
        """Whether this request only asks whether this replica holds its sequence (:data:`PROBE`)."""
        return any(key == PROBE for key, _ in self.headers)

    @property
    def order(self) -> Order | None:
        """Its place among the sequence's requests sent here from the same replica, if it has one."""
        return next((Order.parse(value) for key, value in self.headers if key == SEQUENCE_ORDER), None)


class OwnerCalls(Protocol):
    """How a request reaches the replica that holds rank ``rank`` of stateful model ``model``."""

    async def forward(
        self,
        model: str,
        rank: int,
        request: InferRequest,
        raw: RawRequest | None,
        order: Order | None,
        probe: bool = False,
    ) -> InferResponse | RawReply:
        """The owner's answer: its reply as it came where ``raw`` is given, else a response. ``order``
        travels as the :data:`SEQUENCE_ORDER` header; with ``probe`` the request carries :data:`PROBE`
        and a rank that no replica holds answers :data:`ABSENT_REPLY`."""
        ...


def owner_rank(correlation_id: int | str, world_size: int) -> int:
    """The rank owning sequence ``correlation_id``; ``5`` and ``"5"`` are different sequences.

    Ranks (``0 .. world_size-1``) run over every replica of the model; Serve keeps them stable (a
    replacement takes the rank it replaces), so every replica computes the owner alone. An integer ID
    goes to rank ``ID mod world_size``: clients number their sequences one after another (perf_analyzer,
    Triton's own tests), and consecutive IDs then take the replicas in turn, as Triton's first free
    slots take its instances in turn; a string ID by its CRC-32."""
    if isinstance(correlation_id, str):
        return zlib.crc32(b"s" + correlation_id.encode()) % world_size
    return correlation_id % world_size


ABSENT_REPLY: RawReply = (404, [(ABSENT, b"1")], b"")
"""A probed replica's answer where it does not hold the sequence."""

TAKEN_REPLY: RawReply = (200, [(TAKEN, b"1")], b"")
"""A probed replica's answer where it kept a slot for the probed START's new sequence."""


def is_absent(answer: object) -> bool:
    """Whether ``answer`` is a probed replica's :data:`ABSENT` reply."""
    return isinstance(answer, tuple) and any(key == ABSENT for key, _ in answer[1])


def is_taken(answer: object) -> bool:
    """Whether ``answer`` is a probed replica's :data:`TAKEN` reply."""
    return isinstance(answer, tuple) and any(key == TAKEN for key, _ in answer[1])


@dataclass
class Ranks:
    """This replica's place among the replicas of a stateful model (docs/sequence.md). Both numbers
    follow the model: ``world_size`` a count change that keeps this replica, ``rank`` Serve
    renumbering its replicas after some were removed."""

    model: str
    rank: int
    world_size: int

    def owner(self, correlation_id: int | str) -> int:
        return owner_rank(correlation_id, self.world_size)


class Where(Enum):
    LOCAL = "local"
    OWNER = "owner"
    REMOTE = "remote"


@dataclass(frozen=True)
class Placement:
    where: Where
    rank: int = -1  # OWNER: the rank that holds the sequence


_LOCAL = Placement(Where.LOCAL)
_REMOTE = Placement(Where.REMOTE)


class Router:
    """Runs each inference where :meth:`place` says; a ``ModelExecutor`` for BLS and ensembles too.

    ``local`` maps model names to what runs them here (the mapping itself is kept: an ensemble fills
    it as its hosted models load); ``remote`` reaches every other model (None: they are unknown
    here), for an ensemble the router of its replica; ``ranks`` and ``owners`` are given for a
    stateful model with several replicas. ``passive``: the models this process loads as a passive
    instance, each with whether another of its instance groups takes requests.
    """

    def __init__(
        self,
        local: Mapping[str, Runner] | None = None,
        remote: ModelExecutor | None = None,
        ranks: Ranks | None = None,
        owners: OwnerCalls | None = None,
        passive: Mapping[str, bool] | None = None,
    ) -> None:
        self.local: Mapping[str, Runner] = {} if local is None else local  # kept, not copied
        self.remote = remote
        self.ranks = ranks
        self.owners = owners
        self.passive: Mapping[str, bool] = passive or {}  # loaded here as a passive instance: never run
        self.answered_here = 0  # a stateful model's sequence requests answered by this replica
        self.sent_to_owner = 0  # ... and sent on to their owner
        self.sending = SendOrder()  # the order of the requests sent on to owners
        self.arrivals = ArrivalGate()  # ... and of those other replicas sent here
        # sequences this owner lent to another rank (it had no free slot): rank, last request's time
        self.lent: dict[int | str, tuple[int, int]] = {}
        self.placing = PlacingLine()  # STARTs asking for a free slot, and their sequences' requests
        self.lent_count = 0  # new sequences this owner lent

    def serve(self, name: str, runner: Runner) -> None:
        """Run ``name`` here with ``runner`` from now on (a load, or a reload swapping it in)."""
        self.local = {**self.local, name: runner}

    def place(self, request: InferRequest, raw: RawRequest | None = None) -> Placement:
        """Where ``request`` runs: the one routing decision of the server."""
        if request.model_name not in self.local:
            return _REMOTE
        taken_elsewhere = self.passive.get(request.model_name)
        if taken_elsewhere is not None:
            if taken_elsewhere and self.remote is not None:
                return _REMOTE
            raise Unavailable(
                f"Request for model '{request.model_name}': every instance group of the model is "
                "passive (instance_group passive: true), so no instance is scheduled to run requests"
            )
        ranks = self.ranks
        if ranks is None or not request.correlation_id or (raw is not None and raw.forwarded):
            return _LOCAL
        if request.model_name != ranks.model or ranks.world_size <= 1:
            return _LOCAL
        owner = ranks.owner(request.correlation_id)
        return _LOCAL if owner == ranks.rank else Placement(Where.OWNER, owner)

    async def route(self, request: InferRequest, raw: RawRequest | None = None) -> InferResponse | RawReply:
        """The answer to ``request`` from where it runs (an owner's raw reply where ``raw`` is given)."""
        placement = self.place(request, raw)
        if placement.where is Where.LOCAL:
            runner = self.local[request.model_name]
            if self.ranks is not None and request.correlation_id and request.model_name == self.ranks.model:
                cid = request.correlation_id
                order = raw.order if raw is not None and raw.forwarded else None
                if order is not None:
                    # queued in the order the sender numbered them: turn() returns once the request
                    # before it passed, and the runner queues it before its first suspension
                    await self.arrivals.turn(cid, order)
                # its START is asking for a free slot: it goes where that does, after those before it
                await self.placing.wait(cid)
                probe = raw is not None and raw.probe
                if probe and request.sequence_start:  # a full owner offers its new sequence
                    return TAKEN_REPLY if _holds(runner, cid) or _reserve(runner, request) else ABSENT_REPLY
                if not _holds(runner, cid):
                    if probe:  # asked whether the sequence lives here
                        return ABSENT_REPLY
                    if (lender := self._loan(cid, runner)) is not None:
                        # lent before: it lives there (a START starts it again there)
                        answer = await self._send_on(request, raw, lender)
                        if request.sequence_end:
                            self.lent.pop(cid, None)
                        return answer
                    if request.sequence_start:
                        owner = self.ranks.owner(cid) == self.ranks.rank
                        if owner and not _can_start(runner, request):
                            lent = await self._lend(request, raw, runner)
                            if lent is not None:
                                return lent
                    else:
                        found = await self._held_elsewhere(request, raw)
                        if found is not None:
                            return found
                self.answered_here += 1
            return await runner.infer(request)
        if placement.where is Where.OWNER:
            return await self._send_on(request, raw, placement.rank)
        return await self._remote(request).infer(request)

    async def _send_on(
        self, request: InferRequest, raw: RawRequest | None, rank: int, order: Order | None = None
    ) -> InferResponse | RawReply:
        """The answer of the replica holding ``rank`` to ``request``, sent on to it (``order``: its
        place among the sequence's requests sent on, where already taken)."""
        if self.owners is None:
            raise self._owner_unreachable(request, rank)
        # sent at once, numbered in the order they came here (deployments/runtime/forward_order.py)
        if order is None:
            order = self.sending.next(request.correlation_id)
        try:
            answer = await self.owners.forward(request.model_name, rank, request, raw, order)
        finally:
            self.sending.answered(request.correlation_id, order)
        self.sent_to_owner += 1
        return answer

    def _loan(self, cid: int | str, runner: Runner) -> int | None:
        """The rank this owner lent sequence ``cid`` to, while the loan may still be live there (its END
        not yet sent on, and a request within twice the idle limit); forgotten otherwise."""
        loan = self.lent.get(cid)
        if loan is None:
            return None
        now = time.monotonic_ns()
        if now - loan[1] > _keep_ns(runner):
            del self.lent[cid]
            return None
        self.lent[cid] = (loan[0], now)
        return loan[0]

    async def _lend(
        self, request: InferRequest, raw: RawRequest | None, runner: Runner
    ) -> InferResponse | RawReply | None:
        """The answer of another rank that kept a free slot for ``request``'s new sequence, where this
        owner has none (it would wait in the backlog here while another replica could run it, which
        Triton's one set of slots over all instances never lets happen); None where every other rank
        is full too (it then waits here, queued before the requests that waited for it).

        The ranks are asked one at a time, so one takes it; the one that does keeps the slot and
        answers at once (:data:`TAKEN`), and the START is then sent on there like any later request
        of the sequence: those that came meanwhile wait only for the asking, not for the START's
        answer (which may itself wait, for a batch to fill)."""
        ranks, owners = self.ranks, self.owners
        if ranks is None or owners is None or ranks.world_size <= 1:
            return None
        cid = request.correlation_id
        self.placing.hold(cid)
        try:
            rank = await self._slot_elsewhere(request, raw, ranks, owners)
        except BaseException:
            self.placing.release(cid)
            raise
        if rank is None:
            self.placing.release(cid)  # queued here next, before those that waited for it
            return None
        self._forget_idle(runner)
        if not request.sequence_end:
            self.lent[cid] = (rank, time.monotonic_ns())
        self.lent_count += 1
        order = self.sending.next(cid)  # numbered before those that waited for it
        self.placing.release(cid)
        return await self._send_on(request, raw, rank, order)

    async def _slot_elsewhere(
        self, request: InferRequest, raw: RawRequest | None, ranks: Ranks, owners: OwnerCalls
    ) -> int | None:
        """The first other rank, from the next one on, that kept a slot for ``request``'s sequence."""
        for step in range(1, ranks.world_size):
            rank = (ranks.rank + step) % ranks.world_size
            try:
                answer = await owners.forward(request.model_name, rank, request, raw, None, probe=True)
            except Exception:  # gone, or not there yet: it has no slot to lend
                continue
            if is_taken(answer):
                return rank
        return None

    def _forget_idle(self, runner: Runner) -> None:
        """Drop the lent sequences whose replica has released them for going idle (bounds ``lent``)."""
        keep, now = _keep_ns(runner), time.monotonic_ns()
        for cid in [c for c, (_, last) in self.lent.items() if now - last > keep]:
            del self.lent[cid]

    async def _held_elsewhere(
        self, request: InferRequest, raw: RawRequest | None
    ) -> InferResponse | RawReply | None:
        """The answer of the replica that holds ``request``'s sequence where this one, its owner, does
        not; None where no other replica holds it (it then fails here for its missing START).

        Sequences start at their owner for the model's replica count then; after the count changed
        (the replicas serving on keep their sequences, docs/sequence.md) a sequence that started
        before lives at its owner of the old count, which this owner cannot name: every other rank is
        asked at once, and the one holding the sequence runs the request, the others answer
        :data:`ABSENT` without queuing it."""
        ranks = self.ranks
        if ranks is None or self.owners is None or ranks.world_size <= 1:
            return None
        owners = self.owners
        others = [r for r in range(ranks.world_size) if r != ranks.rank]

        async def ask(rank: int) -> InferResponse | RawReply | None:
            try:
                answer = await owners.forward(request.model_name, rank, request, raw, None, probe=True)
            except Exception:  # gone, or not there yet: it holds nothing this request could use
                return None
            return None if is_absent(answer) else answer

        for answer in await asyncio.gather(*(ask(r) for r in others)):
            if answer is not None:
                self.sent_to_owner += 1
                return answer
        return None

    async def infer(self, request: InferRequest) -> InferResponse:
        """``ModelExecutor.infer``: the response of ``request``, wherever it runs."""
        answer = await self.route(request)
        assert isinstance(answer, InferResponse)  # no raw request, so no raw reply
        return answer

    def stream(self, request: InferRequest) -> AsyncGenerator[InferResponse, None]:
        """Every response of ``request`` in order (a decoupled model: 0..N, the last ``final``)."""
        placement = self.place(request)
        if placement.where is Where.LOCAL:
            return self.local[request.model_name].infer_stream(request)
        if placement.where is Where.OWNER:
            raise self._owner_unreachable(request, placement.rank)
        remote = self._remote(request)
        streaming = getattr(remote, "stream", None)
        if streaming is not None:
            stream: AsyncGenerator[InferResponse, None] = streaming(request)
            return stream
        return _one(remote, request)

    # --- BLS model control (``ModelControlExecutor``): the server's, through the remote executor ---

    async def load_model(self, name: str, config: str, files: Mapping[str, bytes]) -> None:
        await self._control("load_model")(name, config, files)

    async def unload_model(self, name: str, unload_dependents: bool) -> None:
        await self._control("unload_model")(name, unload_dependents)

    async def is_model_ready(self, name: str, version: str) -> bool:
        return bool(await self._control("is_model_ready")(name, version))

    def _control(self, method: str) -> Any:
        call = getattr(self.remote, method, None)
        if call is None:
            raise Unsupported(f"{method} is not supported: this server gives models no model control")
        return call

    def _remote(self, request: InferRequest) -> ModelExecutor:
        if self.remote is None:
            raise NotFound(f"Request for unknown model: '{request.model_name}' is not found")
        return self.remote

    def _owner_unreachable(self, request: InferRequest, rank: int) -> Unavailable:
        """A sequence's request that cannot reach its owner: it never runs without its state."""
        return Unavailable(
            f"inference request for sequence {request.correlation_id} to model '{request.model_name}': "
            f"the replica holding the sequence (rank {rank}) cannot be reached this way"
        )


async def _one(executor: ModelExecutor, request: InferRequest) -> AsyncGenerator[InferResponse, None]:
    yield await executor.infer(request)


__all__ = [
    "ABSENT",
    "ABSENT_REPLY",
    "TAKEN",
    "TAKEN_REPLY",
    "FORWARDED",
    "INTERNAL_HEADERS",
    "OwnerCalls",
    "PROBE",
    "Placement",
    "Ranks",
    "RawReply",
    "RawRequest",
    "REPLICA_SNAPSHOT",
    "Router",
    "Runner",
    "Where",
    "is_absent",
    "is_taken",
    "owner_rank",
]
