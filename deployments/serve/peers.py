"""How a process reaches other replicas: one address registry, one HTTP session, one executor.

The router (``deployments.runtime.router``) decides where an inference runs; this module carries
it there when that is another replica:

* :class:`ReplicaDirectory`: where replicas answer HTTP. Every application's replica addresses
  as the Serve controller hands them to HAProxy (``hooks.replica_http_targets``), kept for
  ``TARGETS_TTL_S`` and read again when a replica refuses the connection; and, for a stateful
  model, which replica holds each rank (registered with the server application). A replica on
  this node is called on loopback, as Serve's HAProxy calls it.
* :class:`ReplicaCalls`: unary calls to the replicas' own HTTP servers (on the local socket of a
  replica on this node, ``deployments.protocol.http1_client``; else over its direct-ingress TCP port
  in one ``aiohttp`` session): to the least loaded replica of an application (the request encoded with
  every tensor binary and answered by the replica's HTTP app, the same path and checks as any
  HTTP request), or to a sequence's owner (:class:`~deployments.runtime.router.OwnerCalls`, an
  HTTP request's body sent on unchanged).
* :class:`RemoteModels`: the router's ``remote`` executor. A call picks the model's instance group
  (:class:`GroupPicker`), then goes over :class:`ReplicaCalls`; a decoupled stream, or a model
  with no direct-ingress port (Serve's own proxy path), goes through the group's deployment handle.
* :class:`ServedElsewhere`: a model as the server application's registry holds it (metadata,
  readiness, statistics), its inference going through the router like any other (a pooled model:
  to a model host replica, ``deployments.serve.model_host``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from typing import Any, TypeVar
from urllib.parse import quote

from deployments.inference import InferRequest, InferResponse
from deployments.protocol.codec import HEADER_LENGTH, decode_infer_response, encode_infer_request
from deployments.protocol.dataplane import empty_model_statistics, model_metadata_document
from deployments.protocol.http1_client import Http1Pool, PeerClosed
from deployments.runtime.forward_order import SEQUENCE_ORDER, Order
from deployments.runtime.router import (
    ABSENT,
    ABSENT_REPLY,
    FORWARDED,
    PROBE,
    REPLICA_SNAPSHOT,
    TAKEN,
    RawReply,
    RawRequest,
    is_absent,
    is_taken,
    owner_rank,
)
from deployments.runtime.stats import merge_snapshots
from deployments.serve import hooks, local_sockets
from deployments.serve.names import hosted_key, hosting_ensemble, is_hosted_key, model_app_name, stats_path
from deployments.serve.server_api import (
    GroupApps,
    Member,
    ReplicaClient,
    ServerClient,
    replica_client,
    server_error,
)
from deployments.tracing import TRACE_STEP_HEADER, TraceParent
from repository_loader.errors import ERROR_CODE_HEADER, InvalidArgument, NotFound, ServerError, Unavailable
from repository_loader.model import ModelDescription

logger = logging.getLogger("ray.serve")

TARGETS_TTL_S = 5.0
SNAPSHOT_TIMEOUT_S = 1.0  # how long a statistics or metrics read waits for a sibling replica's counts
OWNER_WAIT_S = 3.0  # how long a registered sequence owner may be missing from Serve's targets
GROUP_APPS_REFRESH_S = 30.0  # how long a model replica trusts what the server said of a model's groups
GROUP_APPS_ASK_TIMEOUT_S = 2.0  # the server may be starting (its constructor deploys the models)
LOOPBACK = "127.0.0.1"

Address = tuple[str, int]
GroupAppsLookup = Callable[[str], Awaitable[GroupApps]]
Connect = Callable[[str], ReplicaClient]  # application name -> its model deployment's client

_PASSED = (b"content-type", b"inference-header-content-length", b"content-encoding", b"accept-encoding")
_RETURNED = (
    "content-type",
    "inference-header-content-length",
    "content-encoding",
    ERROR_CODE_HEADER,
    ABSENT.decode(),
    TAKEN.decode(),
)
_RETURNED_BYTES = frozenset(name.lower().encode() for name in _RETURNED)

K = TypeVar("K")


@cache
def _node_ip() -> str:
    import ray

    return str(ray.util.get_node_ip_address())


def reachable(ip: str) -> str:
    """The address to call a replica at whose node has ``ip``: loopback on this node."""
    return LOOPBACK if ip == _node_ip() else ip


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
    """The replica did not take the connection: the request never started there."""


class ReplicaDirectory:
    """Where replicas answer HTTP: each application's replicas by actor name, and each rank of a
    stateful model (its application and actor, registered with the server application)."""

    def __init__(self, server: ServerClient | None = None) -> None:
        self._server = server or ServerClient()
        self._targets: dict[str, tuple[dict[str, Address], float]] = {}  # app -> actor -> address
        self._ranks: dict[str, dict[int, Member]] = {}  # model -> rank -> (app, actor)

    async def targets(self, app: str, fresh: bool = False) -> dict[str, Address]:
        known = self._targets.get(app)
        if not fresh and known is not None and time.monotonic() - known[1] < TARGETS_TTL_S:
            return known[0]
        try:
            found = await hooks.replica_http_targets(app)
        except Exception as exc:  # the controller may be busy: the handle path serves meanwhile
            logger.debug("replica addresses of '%s' unavailable: %s", app, exc)
            found = {}
        addresses = {actor: (reachable(ip), port) for actor, (ip, port) in found.items()}
        self._targets[app] = (addresses, time.monotonic())
        return addresses

    async def register_rank(self, model: str, rank: int, member: Member) -> None:
        await self._server.sequence_register(model, rank, member)

    async def owner(self, model: str, rank: int, fresh: bool = False) -> Address:
        """The address of the replica holding ``rank`` of ``model`` (Unavailable while none does).
        What is known is used first; where it names no live replica, it is read again, for up to
        :data:`OWNER_WAIT_S` while a replica holds the rank that Serve does not list yet (one that just
        started: its registration comes before Serve's target list has it)."""
        deadline = time.monotonic() + OWNER_WAIT_S
        again = fresh
        while True:
            members = self._ranks.get(model)
            if again or members is None or rank not in members:
                members = self._ranks[model] = await self._server.sequence_members(model)
            member = members.get(rank)
            if member is not None:
                app, actor = member
                address = (await self.targets(app, again)).get(actor)
                if address is not None:
                    return address
            if again and (member is None or time.monotonic() >= deadline):
                break
            if again:
                await asyncio.sleep(0.2)
            again = True
        raise Unavailable(f"model '{model}': no replica holds rank {rank} of its sequences now")


class ReplicaCalls:
    """Unary calls to other replicas: on the local socket of one on this node, over the direct-ingress
    TCP port (one aiohttp session) of one elsewhere."""

    def __init__(self, directory: ReplicaDirectory) -> None:
        self.directory = directory
        self.in_flight: dict[Address, int] = {}
        self._session: Any = None
        self._local = local_sockets.enabled()
        self._sockets: dict[Address, bytes | None] = {}  # a replica's local socket, where it has one
        self._pool = Http1Pool()

    async def to_app(self, app: str, request: InferRequest) -> InferResponse | None:
        """The answer of ``app``'s least loaded replica; None where it cannot go this way."""
        path = infer_path(request)
        addresses = list((await self.directory.targets(app)).values()) if path is not None else []
        if path is None or not addresses:
            return None
        body, headers = _encoded(request)
        address = self._least_loaded(addresses)
        try:
            return _decoded(await self._post(address, path, headers, body))
        except ConnectFailed:
            fresh = await self.directory.targets(app, fresh=True)
            addresses = [a for a in fresh.values() if a != address]
            if not addresses:
                return None
            try:
                return _decoded(await self._post(self._least_loaded(addresses), path, headers, body))
            except ConnectFailed:
                return None

    async def forward(
        self,
        model: str,
        rank: int,
        request: InferRequest,
        raw: RawRequest | None,
        order: Order | None,
        probe: bool = False,
    ) -> InferResponse | RawReply:
        """``OwnerCalls.forward``: the owner's reply (as it came where ``raw`` is given, and a probed
        replica's :data:`ABSENT` or :data:`TAKEN` reply as it came always)."""
        if raw is not None:
            path, body = raw.path, raw.body
            headers = {k.decode(): v.decode("latin-1") for k, v in raw.headers if k in _PASSED}
        else:
            found = infer_path(request)
            if found is None:
                raise _lost(request, rank, "its name is not a path")
            path = found
            body, headers = _encoded(request)
        headers[FORWARDED.decode()] = str(rank)
        if order is not None:
            headers[SEQUENCE_ORDER.decode()] = order.header()
        if probe:
            headers[PROBE.decode()] = "1"
        if request.trace is not None:
            headers.update(trace_headers(request.trace))
        try:
            reply = await self._to_owner(model, rank, request, path, headers, body)
        except Unavailable:
            if probe:  # no replica holds the rank now: it holds no sequence either
                return ABSENT_REPLY
            raise
        if probe and (is_absent(reply) or is_taken(reply)):
            return reply
        return reply if raw is not None else _decoded(reply)

    async def _to_owner(
        self, model: str, rank: int, request: InferRequest, path: str, headers: dict[str, str], body: bytes
    ) -> RawReply:
        """Post to the replica holding ``rank``, once more at its address read again where it refused;
        Unavailable naming the sequence when no replica holding the rank answers."""
        address: Address | None = None
        for fresh in (False, True):
            try:
                found = await self.directory.owner(model, rank, fresh=fresh)
            except Unavailable as exc:
                raise _lost(request, rank, exc.message) from None
            if found == address:
                break  # the same address refused already
            address = found
            try:
                return await self._post(address, path, headers, body)
            except ConnectFailed as exc:  # the owner is gone or moved
                refused = exc
        raise _lost(request, rank, refused)

    def _least_loaded(self, addresses: list[Address]) -> Address:
        return min(addresses, key=lambda a: self.in_flight.get(a, 0))

    async def snapshots(
        self, apps: list[str], path: str, skip: str = "", timeout_s: float | None = None
    ) -> dict[str, dict[str, Any]]:
        """The own counts of every replica of ``apps`` but actor ``skip`` (the caller), by replica id,
        asked at ``path`` at once; a replica that does not answer within ``timeout_s`` (default
        :data:`SNAPSHOT_TIMEOUT_S`) is left out."""
        timeout_s = SNAPSHOT_TIMEOUT_S if timeout_s is None else timeout_s
        addresses = [
            address
            for app in apps
            for actor, address in (await self.directory.targets(app)).items()
            if actor != skip
        ]
        replies = await asyncio.gather(*(self._snapshot(a, path, timeout_s) for a in addresses))
        return {str(reply["replica"]): reply for reply in replies if reply is not None}

    async def _snapshot(self, address: Address, path: str, timeout_s: float) -> dict[str, Any] | None:
        import aiohttp

        url = f"http://{address[0]}:{address[1]}{path}"
        try:
            async with self._client().get(
                url,
                headers={REPLICA_SNAPSHOT.decode(): "1"},
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as resp:
                if resp.status != 200:
                    return None
                found = await resp.json(content_type=None)
        except Exception as exc:  # gone, starting or busy: its last push stands for it
            logger.debug("replica at %s:%d gave no counts: %s", address[0], address[1], exc)
            return None
        return found if isinstance(found, dict) and "replica" in found else None

    def _client(self) -> Any:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
                timeout=aiohttp.ClientTimeout(total=None),
                # a reply travels as the replica wrote it (compressed only where the client asked)
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            )
        return self._session

    def _local_socket(self, address: Address) -> bytes | None:
        """The local socket of the replica at ``address`` where it is on this node and has one (looked
        up once per address: a replica that starts again has a new port)."""
        if not self._local:
            return None
        if address not in self._sockets:
            found = local_sockets.local_address(*address) is not None
            self._sockets[address] = local_sockets.socket_name(address[1]) if found else None
        return self._sockets[address]

    async def _post(self, address: Address, path: str, headers: dict[str, str], body: bytes) -> RawReply:
        """One call to the replica at ``address``: on its local socket where it is on this node (this
        server's own HTTP/1.1 protocol there, as for HAProxy's requests), else over TCP."""
        name = self._local_socket(address)
        if name is None:
            return await self._post_tcp(address, path, headers, body)
        try:
            with counting(self.in_flight, address):
                status, returned, out = await self._pool.request(name, "POST", path, headers, body)
        except (PeerClosed, OSError) as exc:  # gone (a refused connect, a reset): as aiohttp's refusal
            self._pool.forget(name)
            self._sockets.pop(address, None)
            raise ConnectFailed(str(exc) or type(exc).__name__) from exc
        return status, [(k, v) for k, v in returned if k in _RETURNED_BYTES], out

    async def _post_tcp(self, address: Address, path: str, headers: dict[str, str], body: bytes) -> RawReply:
        import aiohttp

        url = f"http://{address[0]}:{address[1]}{path}"
        try:
            with counting(self.in_flight, address):
                async with self._client().post(url, data=body, headers=headers) as resp:
                    out = await resp.read()
                    returned = [
                        (k.lower().encode(), resp.headers[k].encode("latin-1"))
                        for k in _RETURNED
                        if k in resp.headers
                    ]
                    return resp.status, returned, out
        except aiohttp.ClientConnectionError as exc:
            raise ConnectFailed(str(exc)) from exc

    async def close(self) -> None:
        self._pool.close()
        if self._session is not None:
            await self._session.close()
            self._session = None


def _encoded(request: InferRequest) -> tuple[bytes, dict[str, str]]:
    body, header_length = encode_infer_request(request)
    headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(header_length)}
    if request.trace is not None:
        headers.update(trace_headers(request.trace))
    return body, headers


def trace_headers(parent: TraceParent) -> dict[str, str]:
    """A traced call's place in its trace, for the replica that runs it: W3C ``traceparent`` (the
    caller's span) and the internal step header (no root span there; the caller's Triton trace id)."""
    return {"traceparent": parent.header(), TRACE_STEP_HEADER.decode(): str(parent.triton_id)}


def _decoded(reply: RawReply) -> InferResponse:
    status, headers, body = reply
    found = {k.decode(): v.decode("latin-1") for k, v in headers}
    length = found.get(HEADER_LENGTH.lower())
    return decode_infer_response(status, body, int(length) if length else None, found.get(ERROR_CODE_HEADER))


def _lost(request: InferRequest, rank: int, why: BaseException | str) -> Unavailable:
    return Unavailable(
        f"inference request for sequence {request.correlation_id} to model '{request.model_name}': "
        f"the replica holding the sequence (rank {rank}) is unavailable: {why}"
    )


def own_app(model: str) -> GroupApps:
    """The model's own application alone (a model with one instance group, or none known)."""
    return ((model_app_name(model), 1),)


class GroupPicker:
    """Which instance group of a model takes the next call: the one with the fewest calls in flight
    from this process per replica of the group, the first on a tie."""

    def __init__(self) -> None:
        self.in_flight: dict[str, int] = {}  # application -> calls in flight through it

    def pick(self, apps: GroupApps, correlation_id: int | str = 0) -> str:
        """``correlation_id`` (a sequence's call, several groups): the group holding the owner's rank
        (ranks run over the groups in order)."""
        if len(apps) == 1:
            return apps[0][0]
        if correlation_id:
            rank = owner_rank(correlation_id, sum(max(1, n) for _, n in apps))
            for app, replicas in apps:
                if rank < max(1, replicas):
                    return app
                rank -= max(1, replicas)
        index = min(
            range(len(apps)), key=lambda i: (self.in_flight.get(apps[i][0], 0) / max(1, apps[i][1]), i)
        )
        return apps[index][0]


class RemoteModels:
    """The router's executor for models that run in other replicas (BLS, ensembles, gRPC streams'
    later requests, the server application's requests), and BLS model control.

    ``group_apps`` says which applications a model has (default: ask the server application, kept
    ``refresh_s``); ``connect`` makes an application's client; ``calls``, where given, carries
    unary calls over the replicas' own HTTP ports, the handle serving what it cannot.
    """

    def __init__(
        self,
        group_apps: GroupAppsLookup | None = None,
        refresh_s: float = GROUP_APPS_REFRESH_S,
        connect: Connect = replica_client,
        calls: ReplicaCalls | None = None,
        server: ServerClient | None = None,
    ) -> None:
        self.calls = calls
        self.server = server or ServerClient()
        self._lookup = group_apps or self._ask_server
        self._refresh_s = refresh_s
        self._connect = connect
        self._clients: dict[str, ReplicaClient] = {}  # application -> client
        self._groups: dict[str, tuple[GroupApps, float]] = {}  # model -> its applications, when asked
        self.picker = GroupPicker()

    def client(self, model: str, app: str | None = None) -> ReplicaClient:
        """The client of one of the model's applications (default: its own, the first group)."""
        app = app or model_app_name(model)
        client = self._clients.get(app)
        if client is None:
            try:
                client = self._connect(app)
            except Exception:
                raise NotFound(f"Request for unknown model: '{model}' is not found") from None
            self._clients[app] = client
        return client

    async def _group_apps(self, model: str) -> GroupApps:
        known = self._groups.get(model)
        now = time.monotonic()
        if known is not None and now - known[1] < self._refresh_s:
            return known[0]
        apps = await self._lookup(model) or own_app(model)
        self._groups[model] = (apps, now)
        return apps

    async def replica_snapshots(self, model: str, skip: str = "") -> dict[str, dict[str, Any]]:
        """What each replica of ``model`` (every instance group) counts now, by replica id: its
        ``ModelDeployment.metrics_snapshot()``, statistics included, asked over the replicas' own HTTP
        ports. ``skip``: the calling replica's actor name. Empty without that lane; a replica that
        does not answer is left out (what it pushed last stands for it)."""
        if self.calls is None:
            return {}
        apps = [app for app, _ in await self._group_apps(model)]
        return await self.calls.snapshots(apps, stats_path(model), skip)

    async def hosted_now(
        self, model: str, pushed: Mapping[str, list[dict[str, Any]]]
    ) -> dict[str, list[dict[str, Any]]]:
        """The statistics of the copies of ``model`` that ensembles host in their replicas, by hosted
        key: each ensemble replica named in ``pushed`` asked now (the snapshot it answers carries what
        it hosts), the last push of one that does not answer (of every one, where the ensembles'
        applications are not known now). ``pushed``: what is held for ``model``."""
        held = {key: s for key, s in pushed.items() if is_hosted_key(key)}
        if not held or self.calls is None:
            return held
        ensembles = sorted({hosting_ensemble(key) for key in held})
        try:
            apps = [[app for app, _ in await self._group_apps(e)] for e in ensembles]
            replies = await asyncio.gather(
                *(self.calls.snapshots(a, stats_path(e)) for e, a in zip(ensembles, apps, strict=True))
            )
        except Exception as exc:  # the server restarting: the last pushes stand
            logger.debug("hosted statistics of model '%s' not asked: %s", model, exc)
            return held
        for ensemble, found in zip(ensembles, replies, strict=True):
            for replica, snapshot in found.items():
                stats = snapshot.get("hosted", {}).get(model)
                if stats is not None:
                    held[hosted_key(replica, ensemble)] = stats
        return held

    async def _pick(self, model: str, correlation_id: int | str = 0) -> tuple[str, ReplicaClient]:
        app = self.picker.pick(await self._group_apps(model), correlation_id)
        return app, self.client(model, app)

    async def _ask_server(self, model: str) -> GroupApps:
        """The model's applications as the server's deployer holds them; the model's own alone while
        the server does not answer (it is starting), asked again after ``refresh_s``."""
        try:
            return await self.server.model_apps(model, timeout_s=GROUP_APPS_ASK_TIMEOUT_S)
        except Exception as exc:
            logger.debug("instance groups of model '%s' not known yet: %s", model, exc)
            return own_app(model)

    def forget(self, model: str) -> None:
        """Drop what is known of ``model``'s applications and their clients (asked again on next use)."""
        known = self._groups.pop(model, None)
        for app, _ in (*own_app(model), *(known[0] if known is not None else ())):
            self._clients.pop(app, None)

    async def infer(self, request: InferRequest) -> InferResponse:
        app, client = await self._pick(request.model_name, request.correlation_id)
        try:
            with counting(self.picker.in_flight, app):
                direct = await self.calls.to_app(app, request) if self.calls is not None else None
                return direct or await client.infer_internal(request)
        except Exception as exc:
            raise self._failure(request.model_name, exc) from None

    async def stream(self, request: InferRequest) -> AsyncGenerator[InferResponse, None]:
        """Every response of ``request`` from the model's replica, in order. Closing this iterator
        early (or cancelling the task reading it) cancels the call on the replica, where the model
        sees ``request.is_cancelled()``."""
        app, client = await self._pick(request.model_name, request.correlation_id)
        responses = client.infer_stream_internal(request)
        finished = False
        try:
            with counting(self.picker.in_flight, app):
                while True:
                    try:
                        response: InferResponse = await responses.__anext__()
                    except StopAsyncIteration:
                        finished = True
                        return
                    except Exception as exc:
                        finished = True
                        raise self._failure(request.model_name, exc) from None
                    yield response
        finally:
            if not finished:
                responses.cancel()

    # --- BLS model control: the server application's repository API, under its model control mode ---

    async def load_model(self, name: str, config: str, files: Mapping[str, bytes]) -> None:
        await self._control(self.server.control_load(name, config, dict(files)))
        self.forget(name)

    async def unload_model(self, name: str, unload_dependents: bool) -> None:
        await self._control(self.server.control_unload(name, unload_dependents))
        self.forget(name)

    async def is_model_ready(self, name: str, version: str) -> bool:
        return bool(await self._control(self.server.control_is_ready(name, version)))

    async def _control(self, call: Awaitable[Any]) -> Any:
        try:
            return await call
        except ServerError:
            raise
        except Exception as exc:
            raise Unavailable(f"model control is unavailable: {exc}") from None

    def _failure(self, model: str, exc: Exception) -> ServerError:
        """The server error a failed call stands for (Unavailable when the replica is gone)."""
        own = server_error(exc)
        if own is not None:
            return own
        self.forget(model)
        return Unavailable(f"model '{model}' is unavailable: {exc}")


class ServedElsewhere:
    """A :class:`~deployments.protocol.dataplane.ServedModel` whose replicas run in their own
    applications, as the server application's registry holds it.

    Metadata and configuration come from the description the server holds; statistics are each
    replica's counts asked now (what a replica that does not answer pushed last stands for it), and
    those of copies hosted by ensembles.
    """

    def __init__(
        self,
        description: ModelDescription,
        models: RemoteModels,
        pushed: Mapping[str, list[dict[str, Any]]],
        ask_replica: bool = True,
    ) -> None:
        self.description = description
        self._models = models
        self._pushed = pushed
        self._ask_replica = ask_replica  # a pooled model has no replica of its own to ask

    def _version(self, version: str) -> tuple[int, ...]:
        if not version:
            return tuple(self.description.versions)
        name = self.description.name
        try:
            number = int(version)
        except ValueError:
            raise InvalidArgument(f"model '{name}': version '{version}' is not a number") from None
        if number not in self.description.versions:
            raise NotFound(f"Request for unknown model: '{name}' version {number} is not found")
        return (number,)

    def is_ready(self, version: str = "") -> bool:
        try:
            return bool(self._version(version))
        except ServerError:
            return False

    def metadata(self, version: str = "") -> dict[str, Any]:
        return model_metadata_document(self.description, self._version(version))

    def config(self, version: str = "") -> dict[str, Any]:
        self._version(version)
        return dict(self.description.config_json)

    async def statistics(self, version: str = "") -> list[dict[str, Any]]:
        served = {str(v) for v in self._version(version)}
        own = {key: s for key, s in self._pushed.items() if not is_hosted_key(key)}
        hosted = list((await self._models.hosted_now(self.description.name, self._pushed)).values())
        if self._ask_replica:  # each replica's counts now where it answers, its last push where not
            fresh = await self._models.replica_snapshots(self.description.name)
            own.update({replica: snapshot["stats"] for replica, snapshot in fresh.items()})
            if not own:
                own[""] = await self._models.client(self.description.name).stats_snapshot()
        merged = merge_snapshots([*own.values(), *hosted]) or [
            empty_model_statistics(self.description.name, str(v)) for v in self.description.versions
        ]
        return [s for s in merged if s["version"] in served]


__all__ = [
    "GroupPicker",
    "RemoteModels",
    "ReplicaCalls",
    "ReplicaDirectory",
    "ServedElsewhere",
    "infer_path",
    "own_app",
    "reachable",
]
