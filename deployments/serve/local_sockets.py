"""HAProxy reaches the replicas of its own node through Unix sockets instead of TCP over loopback.

Every model request crosses the hop from HAProxy to a replica's HTTP server twice (the request and
its answer). On loopback each crossing runs the kernel's whole TCP path (segments, acknowledgements,
timers) on both sides; a Unix socket hands the bytes over. Each replica's HTTP server therefore also
listens on an abstract Unix socket named for its TCP port (``triton-serve-http-<port>``), and the
HAProxy shim (``deployments.serve.haproxy_shim``) writes ``abns@triton-serve-http-<port>`` instead of
``<ip>:<port>`` for a replica whose address is one of its own node's and whose socket answers.

Why abstract names: they live in the node's network namespace, as the TCP port does (a node of a
cluster in its own namespace sees only its own replicas' names, never another node's), and they
vanish with the socket, so a replica that died leaves no file behind that a later one could be
confused with. A name held by a process of another user is not used (the shim checks the
listener's credentials). The replica serves the same application on both listeners, HAProxy checks
its health the same way, and a replica whose socket could not be made is reached over TCP as before.
``TRITON_SERVE_LOCAL_SOCKETS=0`` turns it off (both sides read it).

The local socket's connections, HAProxy's, carry every request of this node's clients, so they are
served by the server's own HTTP/1.1 protocol (``deployments.protocol.http1_server``), optionally with
a busy poll (``ServerSettings.replica_http`` and ``busy_poll_us``); the TCP port stays uvicorn's.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import struct
from collections.abc import Mapping
from typing import Any

from deployments.protocol.http1_server import BusyPoll, Http1Protocol
from deployments.serve import hooks

logger = logging.getLogger("ray.serve")

ENV = "TRITON_SERVE_LOCAL_SOCKETS"
PREFIX = "triton-serve-http-"
BACKLOG = 2048
_PEERCRED = struct.Struct("3i")  # pid, uid, gid


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether replicas listen on, and HAProxy uses, the local sockets (``TRITON_SERVE_LOCAL_SOCKETS``)."""
    env = os.environ if environ is None else environ
    return env.get(ENV, "1").strip() != "0"


_SUN_PATH = 108  # the size of ``sockaddr_un.sun_path`` on Linux


def socket_name(port: int) -> bytes:
    """The abstract socket address of the replica HTTP server on TCP ``port``: a NUL, the name, and NULs
    to the end of ``sun_path``, the form HAProxy 2.8's ``abns@`` connects to (it passes the whole field)."""
    return b"\0" + f"{PREFIX}{port}".encode().ljust(_SUN_PATH - 1, b"\0")


def haproxy_address(port: int) -> str:
    """HAProxy's form of :func:`socket_name`."""
    return f"abns@{PREFIX}{port}"


def listen(port: int) -> socket.socket | None:
    """A listening socket under :func:`socket_name` in this network namespace; None where the name is
    taken or the system has no abstract sockets (the replica is then reached over TCP only)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(socket_name(port))
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        logger.warning("replica HTTP port %d: no local socket (%s); HAProxy reaches it over TCP", port, exc)
        return None
    return sock


def lean_protocol(busy_poll_us: int) -> hooks.ListenerProtocol:
    """Connections served by :class:`~deployments.protocol.http1_server.Http1Protocol`, all of them
    sharing one :class:`~deployments.protocol.http1_server.BusyPoll` of ``busy_poll_us`` (0: none)."""
    busy: list[BusyPoll | None] = []

    def protocol(app: Any, state: Any, app_state: dict[str, Any], root_path: str) -> Http1Protocol:
        if not busy:  # made on the replica's loop, with its first connection
            busy.append(BusyPoll(busy_poll_us) if busy_poll_us > 0 else None)
        return Http1Protocol(app, state, app_state, root_path, busy[0])

    return protocol


def serve_beside(
    port: int, server: Any, serving: asyncio.Task[Any], protocol: hooks.ListenerProtocol | None = None
) -> None:
    """Give ``server`` (the replica's running uvicorn server for TCP ``port``) a second listener on the
    local socket, once it started (``serving`` is its task), its connections served by ``protocol``
    (None: uvicorn's). The socket listens at once, so a connection made before the server accepts
    waits in its backlog."""
    sock = listen(port)
    if sock is None:
        return

    async def attach() -> None:
        try:
            while not hooks.uvicorn_started(server):
                if serving.done():
                    sock.close()
                    return
                await asyncio.sleep(0.01)
            await hooks.uvicorn_add_listener(server, sock, protocol)
        except Exception:
            sock.close()
            logger.exception("replica HTTP port %d: the local socket was not served", port)

    task = asyncio.get_running_loop().create_task(attach())
    _ATTACHING.add(task)
    task.add_done_callback(_ATTACHING.discard)


_ATTACHING: set[asyncio.Task[None]] = set()


def install(lean: bool = True, busy_poll_us: int = 0, environ: Mapping[str, str] | None = None) -> bool:
    """Have this process's replica HTTP server (Serve's direct ingress, started after the deployment's
    constructor) also listen on its local socket, served by this server's own HTTP/1.1 protocol
    (``lean``, with a busy poll of ``busy_poll_us``) or by uvicorn's. Called by every deployment's
    constructor (the first call decides); True when it will."""
    if not enabled(environ):
        return False
    protocol = lean_protocol(busy_poll_us) if lean else None
    return hooks.after_replica_http_start(
        lambda port, server, serving: serve_beside(port, server, serving, protocol)
    )


def is_local_address(host: str) -> bool:
    """Whether ``host`` (an IPv4 address) is an address of this network namespace."""
    try:
        if ipaddress.ip_address(host).version != 4:
            return False
    except ValueError:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((host, 0))
        except OSError:
            return False
    return True


def owned_listener(port: int, timeout_s: float = 0.2) -> bool:
    """Whether :func:`socket_name` of ``port`` has a listener of this process's user."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout_s)
        try:
            probe.connect(socket_name(port))
            raw = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        except OSError:
            return False
    with contextlib.suppress(struct.error):
        _, uid, _ = _PEERCRED.unpack(raw)
        return bool(uid == os.getuid())
    return False


def local_address(host: str, port: int, environ: Mapping[str, str] | None = None) -> str | None:
    """HAProxy's address for the replica HTTP server at ``host:port`` through its local socket, where
    the replica is on this node and listens there; None: keep ``host:port``."""
    if not enabled(environ) or not is_local_address(host):
        return None
    return haproxy_address(port) if owned_listener(port) else None
