"""Every request of a sequence reaches the replica that holds its state (docs/sequence.md).

HAProxy spreads a model's requests over its replicas (``leastconn``), so a
sequence's requests land anywhere. The owner of a sequence is a function of its
correlation ID and the replica *ranks* (``0 .. world_size-1``, which Serve keeps
stable: a replacement takes the rank of the replica it replaces), so every
replica computes it alone, with no lookup per request. A request that lands on
its owner runs there (one hop); any other replica forwards the request's HTTP
body as it came to the owner's own direct-ingress HTTP port (two hops) and
returns the owner's reply as it is.

Unary calls from inside the server (gRPC requests through the server
application, BLS, ensemble steps) reach a replica's HTTP port too
(``deployments.serve.direct_calls``), so they are forwarded the same way. A call
that arrives through a deployment handle instead (a decoupled stream, or Serve's
own proxy path) and is not the replica's own sequence is refused as UNAVAILABLE:
it never runs without its state.

The ranks' addresses live in the server deployment (``ServerDeployment``): each
replica registers ``rank -> (replica id, ip, port)`` once its port is
allocated, and every replica keeps a copy, read again when an owner is missing
or unreachable. A lost owner fails its sequences' later requests clearly:
UNAVAILABLE while the rank has no replica, then the replacement (without the
state) rejects them with Triton's missing-START error; they never run on a
replica that silently lacks their state.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from deployments.inference import InferRequest, InferResponse
from deployments.protocol.codec import HEADER_LENGTH, decode_infer_response, encode_infer_request
from deployments.serve import hooks
from deployments.serve.direct_calls import infer_path, reachable
from repository_loader.errors import ERROR_CODE_HEADER, Unavailable

logger = logging.getLogger("ray.serve")

FORWARDED = b"x-triton-sequence-owner"
"""Set on a forwarded request (value: the owner's rank); the receiver answers it itself."""

_PASSED = (b"content-type", b"inference-header-content-length", b"content-encoding", b"accept-encoding")
_RETURNED = ("content-type", "inference-header-content-length", "content-encoding", ERROR_CODE_HEADER)

Member = tuple[str, str, int]  # replica id, ip, port
Members = dict[int, Member]
RegisterFn = Callable[[int, Member], Awaitable[None]]
MembersFn = Callable[[], Awaitable[Members]]


def owner_rank(correlation_id: int | str, world_size: int) -> int:
    """The rank owning sequence ``correlation_id``; ``5`` and ``"5"`` are different sequences."""
    key = (b"s" + correlation_id.encode()) if isinstance(correlation_id, str) else b"i%d" % correlation_id
    return zlib.crc32(key) % world_size


class SequenceRouter:
    """One replica's view: its rank, and where the other ranks answer HTTP."""

    def __init__(
        self,
        model_name: str,
        app_name: str,
        rank: int,
        world_size: int,
        replica_id: str,
        actor_name: str,
        register: RegisterFn,
        members: MembersFn,
    ) -> None:
        self.model_name = model_name
        self.app_name = app_name
        self.rank = rank
        self.world_size = world_size
        self.replica_id = replica_id
        self.actor_name = actor_name
        self._register = register
        self._read_members = members
        self._members: Members = {}
        self._session: Any = None
        self.forwarded = 0
        self.local = 0

    async def publish(self, timeout_s: float = 120.0) -> None:
        """Register this replica's rank and direct-ingress address once Serve allocated its port."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                targets = await hooks.replica_http_targets(self.app_name)
            except Exception as exc:  # the controller may be busy; try again
                logger.debug("replica targets unavailable: %s", exc)
                targets = {}
            address = targets.get(self.actor_name)
            if address is not None:
                ip, port = address  # its node's address: callers on that node use loopback (reachable)
                await self._register(self.rank, (self.replica_id, ip, port))
                self._members = await self._read_members()
                return
            await asyncio.sleep(0.2)
        logger.error("model '%s': no direct-ingress address for rank %d", self.model_name, self.rank)

    async def forward(
        self, request: InferRequest, path: str, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes] | None:
        """The owner's reply to ``request``; None when this replica is its owner (or was sent it)."""
        owner = owner_rank(request.correlation_id, self.world_size)
        if owner == self.rank or any(key == FORWARDED for key, _ in headers):
            self.local += 1
            return None
        member = self._members.get(owner)
        if member is None:
            member = await self._refresh(owner)
        passed = {k.decode(): v.decode("latin-1") for k, v in headers if k in _PASSED}
        passed[FORWARDED.decode()] = str(owner)
        try:
            reply = await self._post(member, path, passed, body)
        except OSError as exc:  # connection refused/reset: the owner is gone or moved
            fresh = await self._refresh(owner)
            if fresh == member:
                raise self._lost(request, owner, exc) from None
            try:
                reply = await self._post(fresh, path, passed, body)
            except OSError as again:
                raise self._lost(request, owner, again) from None
        self.forwarded += 1
        return reply

    async def forward_infer(self, request: InferRequest) -> InferResponse | None:
        """The owner's response to ``request`` (arrived other than over HTTP: a gRPC call), sent to it
        over HTTP with every tensor binary; None when this replica is the owner."""
        if owner_rank(request.correlation_id, self.world_size) == self.rank:
            self.local += 1
            return None
        path = infer_path(request)
        if path is None:
            raise self._lost(
                request, owner_rank(request.correlation_id, self.world_size), "its name is not a path"
            )
        body, header_length = encode_infer_request(request)
        headers = [
            (b"content-type", b"application/octet-stream"),
            (HEADER_LENGTH.lower().encode(), str(header_length).encode()),
        ]
        reply = await self.forward(request, path, headers, body)
        if reply is None:  # pragma: no cover  (not the owner, checked above)
            return None
        status, returned, out = reply
        found = {k.decode(): v.decode("latin-1") for k, v in returned}
        length = found.get(HEADER_LENGTH.lower())
        return decode_infer_response(
            status, out, int(length) if length else None, found.get(ERROR_CODE_HEADER)
        )

    def refuse_elsewhere(self, request: InferRequest) -> None:
        """Raise UNAVAILABLE when ``request`` belongs to a sequence this replica does not own (a handle
        call that could not reach the owner): it must never run without the sequence's state."""
        if not request.correlation_id:
            return
        owner = owner_rank(request.correlation_id, self.world_size)
        if owner != self.rank:
            raise self._lost(request, owner, "it is not among the model's running replicas")

    def _lost(self, request: InferRequest, owner: int, exc: BaseException | str) -> Unavailable:
        return Unavailable(
            f"inference request for sequence {request.correlation_id} to model '{self.model_name}': "
            f"the replica holding the sequence (rank {owner}) is unavailable: {exc}"
        )

    async def _refresh(self, owner: int) -> Member:
        self._members = await self._read_members()
        member = self._members.get(owner)
        if member is None:
            raise Unavailable(
                f"model '{self.model_name}': no replica holds rank {owner} of its sequences now"
            )
        return member

    async def _post(
        self, member: Member, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
                timeout=aiohttp.ClientTimeout(total=None),
                auto_decompress=False,
                skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
            )
        _, ip, port = member
        try:
            async with self._session.post(
                f"http://{reachable(ip)}:{port}{path}", data=body, headers=headers
            ) as resp:
                out = await resp.read()
                returned = [
                    (k.encode(), resp.headers[k].encode("latin-1")) for k in _RETURNED if k in resp.headers
                ]
                return resp.status, returned, out
        except aiohttp.ClientConnectionError as exc:
            raise ConnectionError(str(exc)) from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


__all__ = ["FORWARDED", "SequenceRouter", "owner_rank"]
