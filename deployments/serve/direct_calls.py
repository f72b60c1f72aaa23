"""Calls from inside the server to a model's replicas over their own HTTP ports, not deployment handles.

gRPC requests (answered by the server application), BLS and ensemble steps on other replicas reach a
model through :class:`deployments.serve.handles.HandleExecutor`. A unary call goes to one of the
model's replicas by its direct-ingress HTTP port, as an HTTP client would reach it through HAProxy
but without HAProxy: the request encoded with every tensor binary
(:func:`deployments.protocol.codec.encode_infer_request`), answered by the replica's HTTP app (the
same path, checks, statistics and sequence forwarding as any HTTP request), and decoded back.
Measured against a deployment handle call in ``bench/results/grpc_path`` (docs/grpc.md).

Replicas are chosen by the fewest calls in flight from this process; their addresses are those the
Serve controller gives HAProxy (``hooks.replica_http_targets``), kept for ``TARGETS_TTL_S`` and read
again when a replica refuses the connection; a replica on this node is called on loopback, as Serve's
HAProxy calls it (it answers there whether it binds loopback or every interface). A model with no direct-ingress port (Serve's own proxy
path), a name that is not a plain path segment, or a decoupled stream goes through the handle, as
before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any, TypeVar
from urllib.parse import quote

from deployments.inference import InferRequest, InferResponse
from deployments.protocol.codec import HEADER_LENGTH, decode_infer_response, encode_infer_request
from deployments.serve import hooks
from repository_loader.errors import ERROR_CODE_HEADER

logger = logging.getLogger("ray.serve")

TARGETS_TTL_S = 5.0
Address = tuple[str, int]
LOOPBACK = "127.0.0.1"


@cache
def _node_ip() -> str:
    import ray

    return str(ray.util.get_node_ip_address())


def reachable(ip: str) -> str:
    """The address to call a replica at whose node has ``ip``: loopback on this node (its address read
    once per process: a sequence forward asks on every call)."""
    return LOOPBACK if ip == _node_ip() else ip


K = TypeVar("K")


@contextmanager
def counting(in_flight: dict[K, int], key: K) -> Iterator[None]:
    """Count one call in flight under ``key`` while the block runs (keys at zero are dropped)."""
    in_flight[key] = in_flight.get(key, 0) + 1
    try:
        yield
    finally:
        left = in_flight[key] - 1
        if left:
            in_flight[key] = left
        else:
            del in_flight[key]


def infer_path(request: InferRequest) -> str | None:
    """The infer route of ``request``'s model, or None when its name is not a plain path segment."""
    name, version = request.model_name, request.model_version
    if not name or quote(name, safe="-_.~") != name or quote(version, safe="") != version:
        return None
    return f"/v2/models/{name}/versions/{version}/infer" if version else f"/v2/models/{name}/infer"


class ConnectFailed(Exception):
    """No replica of the application took the connection: the request never started."""


class DirectCalls:
    """Unary inference calls to model replicas over their direct-ingress HTTP ports."""

    def __init__(self) -> None:
        self._targets: dict[str, tuple[list[Address], float]] = {}  # application -> addresses, when read
        self.in_flight: dict[Address, int] = {}
        self._session: Any = None

    async def targets(self, app: str, fresh: bool = False) -> list[Address]:
        known = self._targets.get(app)
        if not fresh and known is not None and time.monotonic() - known[1] < TARGETS_TTL_S:
            return known[0]
        try:
            found = await hooks.replica_http_targets(app)
        except Exception as exc:  # the controller may be busy: the handle path serves meanwhile
            logger.debug("replica addresses of '%s' unavailable: %s", app, exc)
            found = {}
        addresses = sorted((reachable(ip), port) for ip, port in found.values())
        self._targets[app] = (addresses, time.monotonic())
        return addresses

    def _least_loaded(self, addresses: list[Address]) -> Address:
        return min(addresses, key=lambda a: self.in_flight.get(a, 0))

    async def infer(self, app: str, request: InferRequest) -> InferResponse | None:
        """The replica's answer to ``request``; None where it cannot go this way (use the handle)."""
        path = infer_path(request)
        addresses = await self.targets(app) if path is not None else []
        if path is None or not addresses:
            return None
        body, header_length = encode_infer_request(request)
        headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(header_length)}
        address = self._least_loaded(addresses)
        try:
            return await self._post(address, path, headers, body)
        except ConnectFailed:
            addresses = [a for a in await self.targets(app, fresh=True) if a != address]
            if not addresses:
                return None
            try:
                return await self._post(self._least_loaded(addresses), path, headers, body)
            except ConnectFailed:
                return None

    async def _post(self, address: Address, path: str, headers: dict[str, str], body: bytes) -> InferResponse:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
                timeout=aiohttp.ClientTimeout(total=None),
                # no Accept-Encoding: the replica would compress every answer (as it does for a
                # client that asks) and this side inflate it, on the same machine or network
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
            )
        url = f"http://{address[0]}:{address[1]}{path}"
        try:
            with counting(self.in_flight, address):
                async with self._session.post(url, data=body, headers=headers) as resp:
                    data = await resp.read()
                    length = resp.headers.get(HEADER_LENGTH)
                    code = resp.headers.get(ERROR_CODE_HEADER)
                    return decode_infer_response(resp.status, data, int(length) if length else None, code)
        except aiohttp.ClientConnectorError as exc:
            raise ConnectFailed(str(exc)) from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


__all__ = ["DirectCalls", "infer_path"]
