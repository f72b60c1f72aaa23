"""The client for calls between replicas on one node (``deployments.protocol.http1_client``), against the
replica's own HTTP/1.1 server on a real abstract Unix socket, no Ray: keep-alive reuse, responses by
length and chunked, a peer that closes or is absent, a cancelled call; and ``ReplicaCalls`` taking a
same-node replica's local socket instead of TCP."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from deployments.protocol.http1_client import Http1Connection, Http1Pool, PeerClosed
from deployments.protocol.http1_server import Http1Protocol
from deployments.serve import local_sockets, peers


class State:
    def __init__(self) -> None:
        self.connections: set[Any] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.accepted = 0
        self.seen: list[dict[str, Any]] = []
        self.disconnected = asyncio.Event()


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``/echo`` answers the body with a length; ``/chunks`` in two parts (chunked); ``/close`` with
    ``connection: close``; ``/cut`` starts a response and drops the connection; ``/wait`` waits for
    the client to leave."""
    state: State = scope["state"]
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    state.seen.append({"path": scope["path"], "headers": dict(scope["headers"]), "body": body})
    path = scope["path"]
    if path == "/wait":
        if (await receive())["type"] == "http.disconnect":
            state.disconnected.set()
        return
    if path == "/cut":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"100")]})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        for conn in list(state.connections):
            conn.transport.abort()
        return
    headers = [(b"x-answer", b"Yes"), (b"content-type", b"application/x")]
    if path == "/chunks":
        await send({"type": "http.response.start", "status": 201, "headers": headers})
        await send({"type": "http.response.body", "body": b"one,", "more_body": True})
        await send({"type": "http.response.body", "body": b"two"})
        return
    if path == "/close":
        headers.append((b"connection", b"close"))
    headers.append((b"content-length", b"%d" % len(body)))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _name(tag: str) -> bytes:
    return b"\0" + f"test-http1-client-{os.getpid()}-{tag}".encode()


@contextlib.asynccontextmanager
async def serve(name: bytes) -> AsyncIterator[State]:
    state = State()

    async def scoped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await app({**scope, "state": state}, receive, send)

    def protocol() -> Http1Protocol:
        state.accepted += 1
        return Http1Protocol(scoped, state)

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(name)
    sock.listen(16)
    server = await asyncio.get_running_loop().create_unix_server(protocol, sock=sock)
    try:
        yield state
    finally:
        server.close()
        for conn in list(state.connections):
            conn.transport.close()
        await asyncio.sleep(0)


async def test_requests_reuse_one_kept_alive_connection_and_read_length_and_chunked_bodies() -> None:
    name = _name("reuse")
    async with serve(name) as state:
        pool = Http1Pool()
        status, headers, body = await pool.request(name, "POST", "/echo", {"Content-Type": "x/y"}, b"abc")
        assert (status, body) == (200, b"abc")
        assert (b"x-answer", b"Yes") in headers  # names lower-cased, values as sent
        status, headers, body = await pool.request(name, "POST", "/chunks", {}, b"")
        assert (status, body) == (201, b"one,two")
        big = os.urandom(3 * 1024 * 1024)
        assert (await pool.request(name, "POST", "/echo", {}, big))[2] == big
        assert state.accepted == 1
        sent = state.seen[0]["headers"]
        assert sent[b"content-type"] == b"x/y" and sent[b"content-length"] == b"3"
        pool.close()


async def test_a_connection_the_peer_closes_is_not_reused() -> None:
    name = _name("close")
    async with serve(name) as state:
        pool = Http1Pool()
        assert (await pool.request(name, "POST", "/close", {}, b"x"))[2] == b"x"
        assert (await pool.request(name, "POST", "/echo", {}, b"y"))[2] == b"y"
        assert state.accepted == 2
        pool.close()


async def test_an_idle_connection_the_peer_closed_meanwhile_is_dropped_not_used() -> None:
    """A peer that closes a kept-alive connection while it is idle (it restarted) costs a new
    connection, not a failed call."""
    name = _name("idle-closed")
    async with serve(name) as state:
        pool = Http1Pool()
        assert (await pool.request(name, "POST", "/echo", {}, b"a"))[2] == b"a"
        for conn in list(state.connections):
            conn.transport.close()
        await asyncio.sleep(0.05)  # the client's loop reads the end of the idle connection
        assert (await pool.request(name, "POST", "/echo", {}, b"b"))[2] == b"b"
        assert state.accepted == 2
        pool.close()


async def test_a_response_cut_short_or_an_absent_peer_is_an_error_and_nothing_is_kept() -> None:
    name = _name("cut")
    async with serve(name) as state:
        pool = Http1Pool()
        with pytest.raises(PeerClosed):
            await pool.request(name, "POST", "/cut", {}, b"")
        assert (await pool.request(name, "POST", "/echo", {}, b"z"))[2] == b"z"
        assert state.accepted == 2
        pool.close()
    with pytest.raises(OSError):
        await Http1Pool().request(_name("nobody"), "POST", "/echo", {}, b"")


async def test_a_cancelled_call_closes_its_connection_and_the_peer_sees_the_client_leave() -> None:
    name = _name("cancel")
    async with serve(name) as state:
        pool = Http1Pool()
        call = asyncio.ensure_future(pool.request(name, "POST", "/wait", {}, b""))
        while not state.seen:
            await asyncio.sleep(0.01)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.wait_for(state.disconnected.wait(), 5)
        assert (await pool.request(name, "POST", "/echo", {}, b"after"))[2] == b"after"
        assert state.accepted == 2
        pool.close()


async def test_a_header_cannot_smuggle_a_second_request() -> None:
    name = _name("smuggle")
    async with serve(name) as state:
        connection = await Http1Connection.open_unix(name)
        reply = await connection.request("POST", "/echo", {"Content-Length": "0", "Host": "evil"}, b"ok")
        assert reply[2] == b"ok"
        assert state.seen[0]["headers"][b"host"] == b"localhost"
        connection.close()


async def test_replica_calls_take_a_same_node_replicas_local_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica on this node with a local socket is called there; the TCP port is not touched."""
    port = 40000 + os.getpid() % 20000
    monkeypatch.setenv(local_sockets.ENV, "1")
    async with serve(local_sockets.socket_name(port)) as state:
        calls = peers.ReplicaCalls(peers.ReplicaDirectory(object()))  # type: ignore[arg-type]
        status, headers, body = await calls._post(("127.0.0.1", port), "/echo", {"content-type": "a/b"}, b"q")
        assert (status, body) == (200, b"q")
        assert headers == [(b"content-type", b"application/x")]  # only what a caller passes on
        assert [s["path"] for s in state.seen] == ["/echo"]
        await calls.close()
    # the replica gone: the next call reports a refused connection, as over TCP
    calls = peers.ReplicaCalls(peers.ReplicaDirectory(object()))  # type: ignore[arg-type]
    calls._sockets[("127.0.0.1", port)] = local_sockets.socket_name(port)
    with pytest.raises(peers.ConnectFailed):
        await calls._post(("127.0.0.1", port), "/echo", {}, b"")
    assert ("127.0.0.1", port) not in calls._sockets
    await calls.close()
