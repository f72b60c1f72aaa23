"""The KServe v2 HTTP front end: every route, and two bare ASGI applications over a :class:`DataPlane`.

:class:`ModelHTTPApp` answers one model's routes; it is what a model's own
replica serves, mounted at ``/v2/models/<name>`` (the mount point arrives as
the ASGI ``root_path``; paths are accepted with or without it).
:class:`ServerHTTPApp` answers everything under ``/v2``, the model routes of
every model included, so that one process can serve a whole repository.

Errors are ``{"error": "..."}`` with the HTTP status of the
:class:`~repository_loader.errors.ServerError` raised (mapped in
:func:`error_reply`); anything else becomes a 500 with the same body.
No framework sits on the request path: routing is a dict lookup on path
segments.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from deployments.inference import InferRequest, InferResponse
from deployments.protocol import codec, compression, extension_queries, generate, log_settings, shared_memory
from deployments.protocol.dataplane import DataPlane
from deployments.protocol.forwarding import forward_headers
from deployments.protocol.inference_calls import InferenceCalls
from deployments.protocol.shared_memory import SharedMemory
from deployments.runtime.checks import ModelSchema
from deployments.runtime.router import FORWARDED, RawRequest
from deployments.settings import RequestLimits, RestrictedApi, restriction_for
from deployments.tracing import TRACE_STEP_HEADER, TRACER, TraceParent
from deployments.tracing.spans import RootSpan
from repository_loader.errors import (
    ERROR_CODE_HEADER,
    InternalError,
    InvalidArgument,
    NotFound,
    Restricted,
    ServerError,
    TooBusy,
    TooLarge,
    Unsupported,
)
from repository_loader.model import ModelDescription

logger = logging.getLogger(__name__)

Scope = Mapping[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]
Reply = tuple[int, Headers, bytes]


@dataclass(frozen=True)
class Streamed:
    """A reply whose body is sent as it is produced (``/generate_stream``: Server-Sent Events);
    a client that disconnects closes ``chunks``, which cancels the inference behind them."""

    headers: Headers
    chunks: AsyncGenerator[bytes, None]


@dataclass(frozen=True)
class Route:
    """One route: method, path pattern (segments; ``{m}`` = model name, ``{v}`` = version), handler."""

    method: str
    pattern: str
    handler: str


# Relative to /v2/models/{m}: what each model's own replica answers.
MODEL_ROUTES: tuple[Route, ...] = (
    Route("GET", "", "model_metadata"),
    Route("GET", "ready", "model_ready"),
    Route("GET", "config", "model_config"),
    Route("POST", "infer", "infer"),
    Route("POST", "generate", "generate"),
    Route("POST", "generate_stream", "generate_stream"),
    Route("GET", "stats", "model_stats"),
    Route("GET", "versions/{v}", "model_metadata"),
    Route("GET", "versions/{v}/ready", "model_ready"),
    Route("GET", "versions/{v}/config", "model_config"),
    Route("POST", "versions/{v}/infer", "infer"),
    Route("POST", "versions/{v}/generate", "generate"),
    Route("POST", "versions/{v}/generate_stream", "generate_stream"),
    Route("GET", "versions/{v}/stats", "model_stats"),
    Route("GET", "trace/setting", "trace_setting"),
    Route("POST", "trace/setting", "update_trace_setting"),
)

# Relative to /v2: the server's routes, then every model route.
SERVER_ROUTES: tuple[Route, ...] = (
    Route("GET", "", "server_metadata"),
    Route("GET", "health/live", "live"),
    Route("GET", "health/ready", "ready"),
    Route("GET", "models/stats", "all_stats"),
    Route("GET", "repository/index", "repository_index"),
    Route("POST", "repository/index", "repository_index"),
    Route("POST", "repository/models/{m}/load", "load_model"),
    Route("POST", "repository/models/{m}/unload", "unload_model"),
    Route("GET", "trace/setting", "trace_setting"),
    Route("POST", "trace/setting", "update_trace_setting"),
    Route("GET", "logging", "log_settings"),
    Route("POST", "logging", "update_log_settings"),
    *(
        route
        for kind in ("system", "cuda")
        for route in (
            Route("GET", f"{kind}sharedmemory/status", f"{kind}_shm_status"),
            Route("GET", f"{kind}sharedmemory/region/{{r}}/status", f"{kind}_shm_status"),
            Route("POST", f"{kind}sharedmemory/region/{{r}}/register", f"{kind}_shm_register"),
            Route("POST", f"{kind}sharedmemory/region/{{r}}/unregister", f"{kind}_shm_unregister"),
            Route("POST", f"{kind}sharedmemory/unregister", f"{kind}_shm_unregister"),
        )
    ),
    *(Route(r.method, f"models/{{m}}/{r.pattern}".rstrip("/"), r.handler) for r in MODEL_ROUTES),
)

# Triton's API group of each handler (for the restricted API).
API_GROUP_OF = {
    "server_metadata": "metadata",
    "live": "health",
    "ready": "health",
    "model_ready": "health",
    "model_metadata": "metadata",
    "model_config": "model-config",
    "infer": "inference",
    "model_stats": "statistics",
    "all_stats": "statistics",
    "repository_index": "model-repository",
    "load_model": "model-repository",
    "unload_model": "model-repository",
    "trace_setting": "trace",
    "update_trace_setting": "trace",
    "log_settings": "logging",
    "update_log_settings": "logging",
    "system_shm_status": "shared-memory",
    "cuda_shm_status": "shared-memory",
    "system_shm_register": "shared-memory",
    "cuda_shm_register": "shared-memory",
    "system_shm_unregister": "shared-memory",
    "cuda_shm_unregister": "shared-memory",
}


def check_restricted(
    restricted: tuple[RestrictedApi, ...], group: str, header: Callable[[bytes], bytes | None]
) -> None:
    """Raise :class:`Restricted` unless the request carries the header that ``group`` needs."""
    rule = restriction_for(restricted, group)
    if rule is not None and header(rule.key.encode("latin-1")) != rule.value.encode("latin-1"):
        raise Restricted(f"This API is restricted, expecting header '{rule.key}'")


_JSON = [(b"content-type", b"application/json")]
_ERROR_CODE = ERROR_CODE_HEADER.encode()
_BINARY = b"application/octet-stream"
_TEXT = [(b"content-type", b"text/plain; charset=utf-8")]
_NO_CACHE = (b"cache-control", b"no-cache")
_ERROR_ENCODER = json.JSONEncoder(separators=(",", ":"))
_DEFAULT_LIMITS = RequestLimits()
_ESCAPE = re.compile(rb"%([0-9A-Fa-f]{2})")
# Characters a path never needs to percent-encode (RFC 3986 "unreserved"), and "/": a path that
# encodes one of them is refused rather than routed one way by HAProxy and another way here.
_NEEDLESS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~/")


class _Router:
    """Matches path segments to routes: exact paths by dict, patterns by segment count."""

    def __init__(self, routes: tuple[Route, ...]) -> None:
        self.exact: dict[tuple[str, ...], dict[str, str]] = {}
        self.patterns: dict[int, list[tuple[tuple[str, ...], dict[str, str]]]] = {}
        for route in routes:
            segs = _segments(route.pattern)
            if any(s.startswith("{") for s in segs):
                group = self.patterns.setdefault(len(segs), [])
                methods = next((m for p, m in group if p == segs), None)
                if methods is None:
                    methods = {}
                    group.append((segs, methods))
            else:
                methods = self.exact.setdefault(segs, {})
            methods[route.method] = route.handler

    def match(self, segs: tuple[str, ...]) -> tuple[dict[str, str], dict[str, str]] | None:
        """``(handler by method, path parameters)`` or None."""
        methods = self.exact.get(segs)
        if methods is not None:
            return methods, {}
        for pattern, methods in self.patterns.get(len(segs), ()):
            params: dict[str, str] = {}
            for p, s in zip(pattern, segs, strict=True):
                if p[0] == "{":
                    params[p[1:-1]] = s
                elif p != s:
                    break
            else:
                return methods, params
        return None


def _segments(path: str) -> tuple[str, ...]:
    path = path.strip("/")
    return tuple(path.split("/")) if path else ()


class _Traced:
    """When a request arrived and, once its inference is traced, its root span (tracing on only)."""

    __slots__ = ("received", "root", "complete")

    def __init__(self, received: int) -> None:
        self.received = received
        self.root: RootSpan | None = None
        self.complete = 0

    def finish(self, send_start: int) -> None:
        if self.root is not None:
            self.root.finish(self.complete or send_start, send_start, time.monotonic_ns())


class _Call:
    """One HTTP request as the handlers see it."""

    __slots__ = ("scope", "body", "params", "traced")

    def __init__(
        self, scope: Scope, body: bytes, params: dict[str, str], traced: _Traced | None = None
    ) -> None:
        self.scope = scope
        self.body = body
        self.params = params
        self.traced = traced

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.scope["headers"]:
            if key == name:
                return value
        return None

    def header_text(self, name: bytes) -> str | None:
        value = self.header(name)
        return None if value is None else value.decode("latin-1").strip().lower()


class _Disconnected(Exception):
    pass


def _forwarded(scope: Scope) -> bool:
    """Whether a peer replica sent this request on to its sequence's owner (``runtime.router``)."""
    return any(key == FORWARDED for key, _ in scope["headers"])


async def _unless_gone(receive: Receive, work: Awaitable[Any]) -> Any:
    """``work``'s result, or None when the connection closes first, ``work`` then cancelled.

    An HTTP client that leaves does not cancel its inference, as in Triton; but a request a peer
    replica forwarded to its sequence's owner stands for a call that may be cancelled (gRPC): the peer
    closes its connection then, and the request is cancelled here as it would have been there (a
    pending request of a sequence cancels the sequence, docs/sequence.md).
    """

    async def gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


class _BaseApp:
    """The handlers of every route, over one data plane; subclasses decide which routes they serve."""

    def __init__(
        self, dataplane: DataPlane, routes: tuple[Route, ...], limits: RequestLimits = _DEFAULT_LIMITS
    ) -> None:
        self.dataplane = dataplane
        self.limits = limits
        self._inflight = 0  # inference requests this app holds now (``limits.max_concurrent_requests``)
        self._router = _Router(routes)
        self.calls = InferenceCalls(dataplane)
        # Triton's restricted API (``ServerSettings.http_restricted_api``): groups that need a header
        self.restricted: tuple[RestrictedApi, ...] = ()
        # Triton's --http-header-forward-pattern: headers that become request parameters (None: none)
        self.header_forward: re.Pattern[str] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await _lifespan(receive, send)

    def _locate(self, scope: Scope) -> tuple[str, ...] | None:
        """Path segments relative to the routes' base; None when the path lies elsewhere."""
        raise NotImplementedError

    def _fixed_params(self) -> dict[str, str]:
        return {}

    async def _extra(self, scope: Scope) -> Reply | None:
        """Routes outside the table (the server's ``/metrics``)."""
        return None

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        traced = _Traced(time.monotonic_ns()) if TRACER.active else None
        try:
            _check_head(scope, self.limits)
            body = await _read_body(receive, self.limits.max_input_size)
        except _Disconnected:
            return
        except ServerError as e:  # refused before the body is read in full
            await _respond(send, error_reply(e))
            return
        reply: Reply | Streamed
        try:
            if _forwarded(scope):
                answered = await _unless_gone(receive, self._dispatch(scope, body, traced))
                if answered is None:
                    return  # the forwarding replica's caller was cancelled: so is the request here
                reply = answered
            else:
                reply = await self._dispatch(scope, body, traced)
        except ServerError as e:
            reply = error_reply(e)
        except Exception as e:  # never let a request take the server down
            logger.exception("internal error answering %s %s", scope.get("method"), scope.get("path"))
            reply = error_reply(e)
        if isinstance(reply, Streamed):
            await _stream(receive, send, reply)
        elif traced is None:
            await _respond(send, reply)
        else:
            send_start = time.monotonic_ns()
            await _respond(send, reply)
            traced.finish(send_start)

    async def _dispatch(self, scope: Scope, body: bytes, traced: _Traced | None = None) -> Reply | Streamed:
        segs = self._locate(scope)
        found = None if segs is None else self._router.match(segs)
        if found is None:
            extra = await self._extra(scope)
            if extra is not None:
                return extra
            raise NotFound("Not Found")
        methods, params = found
        handler = methods.get(scope["method"])
        if handler is None:
            return error_reply(InvalidArgument("Method Not Allowed"), status=405)
        fixed = self._fixed_params()
        if fixed:
            params.update(fixed)
        call = _Call(scope, body, params, traced)
        if self.restricted:
            check_restricted(self.restricted, API_GROUP_OF.get(handler, "inference"), call.header)
        result: Reply | Streamed = await getattr(self, "_" + handler)(call)
        return result

    # --- handlers ----------------------------------------------------------

    async def _server_metadata(self, call: _Call) -> Reply:
        return _json(await self.dataplane.server_metadata())

    async def _live(self, call: _Call) -> Reply:
        return _status(await self.dataplane.live())

    async def _ready(self, call: _Call) -> Reply:
        return _status(await self.dataplane.ready())

    async def _model_ready(self, call: _Call) -> Reply:
        """200, or 400 "Model version not ready" for a model (or version) not ready or not known,
        as Triton answers."""
        try:
            ready = await self.dataplane.model_ready(call.params["m"], call.params.get("v", ""))
        except NotFound:
            ready = False
        if ready:
            return 200, [], b""
        return error_reply(InvalidArgument("Model version not ready"))

    async def _model_metadata(self, call: _Call) -> Reply:
        return _json(await self.dataplane.model_metadata(call.params["m"], call.params.get("v", "")))

    async def _model_config(self, call: _Call) -> Reply:
        return _json(await self.dataplane.model_config(call.params["m"], call.params.get("v", "")))

    async def _model_stats(self, call: _Call) -> Reply:
        return _json(await self.dataplane.model_statistics(call.params["m"], call.params.get("v", "")))

    async def _all_stats(self, call: _Call) -> Reply:
        return _json(await self.dataplane.model_statistics(None, ""))

    async def _repository_index(self, call: _Call) -> Reply:
        ready = _json_body(call.body).get("ready", False)
        if type(ready) is not bool:
            raise InvalidArgument("the repository index field 'ready' must be a boolean")
        return _json(await self.dataplane.repository_index(ready))

    async def _load_model(self, call: _Call) -> Reply:
        await self.dataplane.load_model(call.params["m"], _parameters(call.body))
        return 200, [], b""

    async def _unload_model(self, call: _Call) -> Reply:
        await self.dataplane.unload_model(call.params["m"], _parameters(call.body))
        return 200, [], b""

    async def _trace_setting(self, call: _Call) -> Reply:
        return _json(await self.dataplane.trace_settings(call.params.get("m")))

    async def _update_trace_setting(self, call: _Call) -> Reply:
        return _json(await self.dataplane.update_trace_settings(call.params.get("m"), _json_body(call.body)))

    async def _log_settings(self, call: _Call) -> Reply:
        return _json((await self.dataplane.log_settings()).to_json())

    async def _update_log_settings(self, call: _Call) -> Reply:
        changes = log_settings.changes_from_json(_json_body(call.body))
        return _json((await self.dataplane.update_log_settings(changes)).to_json())

    def _shared(self) -> SharedMemory:
        if self.calls.shared is None:
            raise Unsupported("this endpoint does not serve shared memory")
        return self.calls.shared

    async def _system_shm_status(self, call: _Call) -> Reply:
        return _json(await self._shared().status(call.params.get("r", "")))

    async def _cuda_shm_status(self, call: _Call) -> Reply:
        return _json(extension_queries.cuda_shared_memory_status(call.params.get("r", "")))

    async def _system_shm_register(self, call: _Call) -> Reply:
        key, offset, byte_size = shared_memory.register_request(_json_body(call.body))
        await self._shared().register(call.params["r"], key, offset, byte_size)
        return 200, [], b""

    async def _cuda_shm_register(self, call: _Call) -> Reply:
        extension_queries.register_cuda_shared_memory(call.params["r"])
        return 200, [], b""

    async def _system_shm_unregister(self, call: _Call) -> Reply:
        await self._shared().unregister(call.params.get("r", ""))
        return 200, [], b""

    async def _cuda_shm_unregister(self, call: _Call) -> Reply:
        return 200, [], b""  # no CUDA region can be registered

    async def _infer(self, call: _Call) -> Reply:
        cap = self.limits.max_concurrent_requests
        if cap and self._inflight >= cap:
            raise TooBusy(f"the replica already holds {cap} inference requests (max_concurrent_requests)")
        self._inflight += 1
        try:
            return await self._infer_admitted(call)
        finally:
            self._inflight -= 1

    async def _infer_admitted(self, call: _Call) -> Reply:
        name = call.params["m"]
        version = call.params.get("v", "")
        description, schema = await self.calls.schema(name, version)
        self.calls.refuse_decoupled(description, "HTTP end point")
        body = call.body
        encoding = call.header_text(b"content-encoding")
        if encoding:
            body = compression.decompress(body, encoding, self.limits.max_decompressed_size)
        header_length = codec.parse_header_length(call.header(b"inference-header-content-length"), len(body))
        if header_length == 0:  # a raw binary request: the body is the one input's data
            request = codec.decode_raw_request(body, description, version, self.limits)
            binary_output = True
        else:
            request, binary_output = codec.decode_infer_request(
                body, header_length, name, version, self.limits
            )
        if self.header_forward is not None:
            sent = ((k.decode("latin-1"), v.decode("latin-1")) for k, v in call.scope["headers"])
            forward_headers(request, self.header_forward, sent)
        raw = RawRequest(_full_path(call.scope), call.scope["headers"], call.body)
        if call.traced is not None:
            await _trace(call, request)
        response = await self.calls.infer(request, description, raw)
        if call.traced is not None:
            call.traced.complete = time.monotonic_ns()
        if not isinstance(response, InferResponse):
            return response  # the reply of the replica the router sent it on to, as it came
        out, json_length = codec.encode_infer_response(
            response, request.requested_outputs, binary_output, schema
        )
        if json_length is None:
            headers = list(_JSON)
        else:
            headers = [
                (b"content-type", _BINARY),
                (b"inference-header-content-length", str(json_length).encode()),
            ]
        accept = call.header(b"accept-encoding")
        if accept is not None:
            chosen = compression.choose_encoding(accept.decode("latin-1"))
            if chosen is not None:
                out = compression.compress(out, chosen)
                headers.append((b"content-encoding", chosen.encode()))
        return 200, headers, out

    async def _generate(self, call: _Call) -> Reply:
        """Triton's ``/generate``: one JSON object; a decoupled model must send exactly one response."""
        request, description, _ = await self._generate_request(call)
        if not description.decoupled:
            response = await self.calls.infer_one(request, description)
            return _json(generate.generate_document(response))
        answers: list[dict[str, Any]] = []
        async with contextlib.aclosing(self.calls.responses(request, description)) as responses:
            async for response in responses:
                if response.outputs:
                    answers.append(generate.generate_document(response))
        if len(answers) != 1:
            raise InternalError(
                "generate expects model to produce exactly 1 response, use generate stream for model "
                "that generates various number of responses"
            )
        return _json(answers[0])

    async def _generate_stream(self, call: _Call) -> Reply | Streamed:
        """Triton's ``/generate_stream``: one ``data:`` event per response. A request refused before
        the model runs is a JSON error; a model's error is an ``{"error": ...}`` event, under the
        error's status when it is the first response."""
        request, description, schema = await self._generate_request(call)
        schema.check_request(request)  # refused as JSON, before any event
        stream = self.calls.responses(request, description)
        try:
            first = await _next_answer(stream)
        except ServerError as e:
            await stream.aclose()
            status, _, _ = error_reply(e)
            return status, _sse_headers(), generate.sse_event({"error": e.message})
        except BaseException:
            await stream.aclose()
            raise

        async def events() -> AsyncGenerator[bytes, None]:
            async with contextlib.aclosing(stream):
                response = first
                while response is not None:
                    yield generate.sse_event(generate.generate_document(response))
                    try:
                        response = await _next_answer(stream)
                    except ServerError as e:
                        yield generate.sse_event({"error": e.message})
                        return

        return Streamed(_sse_headers(), events())

    async def _generate_request(self, call: _Call) -> tuple[InferRequest, ModelDescription, ModelSchema]:
        name, version = call.params["m"], call.params.get("v", "")
        description, schema = await self.calls.schema(name, version)
        if call.header_text(b"content-encoding") not in (None, "", "identity"):
            raise InvalidArgument("Unsupported content-encoding, only 'identity' is supported.")
        return generate.decode_generate_request(call.body, description, version), description, schema


class ModelHTTPApp(_BaseApp):
    """The routes of one model (metadata, ready, config, infer, stats, their ``/versions/{v}`` forms).

    Mounted at ``/v2/models/<model_name>``; also answers the full paths and
    paths relative to the mount point when no ``root_path`` is given.
    """

    def __init__(
        self, dataplane: DataPlane, model_name: str, limits: RequestLimits = _DEFAULT_LIMITS
    ) -> None:
        super().__init__(dataplane, MODEL_ROUTES, limits)
        self.model_name = model_name
        self._prefix = f"/v2/models/{model_name}"
        self._params = {"m": model_name}

    def _fixed_params(self) -> dict[str, str]:
        return self._params

    def _locate(self, scope: Scope) -> tuple[str, ...] | None:
        full = _full_path(scope)
        prefix = self._prefix
        if full.startswith(prefix) and (len(full) == len(prefix) or full[len(prefix)] == "/"):
            return _segments(full[len(prefix) :])
        if full.startswith("/v2/"):
            return None  # another model's or the server's path
        return _segments(full)


class ServerHTTPApp(_BaseApp):
    """Everything under ``/v2``: health, server metadata, statistics, the repository API, every model.

    ``metrics`` (optional) returns the Prometheus text served at ``/metrics``.
    """

    def __init__(
        self,
        dataplane: DataPlane,
        metrics: Callable[[], Awaitable[str | bytes]] | None = None,
        limits: RequestLimits = _DEFAULT_LIMITS,
    ) -> None:
        super().__init__(dataplane, SERVER_ROUTES, limits)
        self._metrics = metrics

    def _locate(self, scope: Scope) -> tuple[str, ...] | None:
        full = _full_path(scope)
        if full == "/v2" or full.startswith("/v2/"):
            return _segments(full[3:])
        return None

    async def _extra(self, scope: Scope) -> Reply | None:
        if self._metrics is not None and _full_path(scope).rstrip("/") == "/metrics":
            text = await self._metrics()
            return 200, list(_TEXT), text.encode() if isinstance(text, str) else text
        return None


def error_reply(error: BaseException, status: int | None = None) -> Reply:
    """The one mapping from an exception to an HTTP reply: ``ServerError.http_status``, else 500."""
    headers = list(_JSON)
    if isinstance(error, ServerError):
        message, code = error.message, error.http_status
        headers.append((_ERROR_CODE, error.code.value.encode()))
    else:
        message, code = f"internal error: {type(error).__name__}: {error}", 500
    body = _ERROR_ENCODER.encode({"error": message}).encode("utf-8")
    return status or code, headers, body


def _full_path(scope: Scope) -> str:
    """The request path including the mount point, whether or not ``path`` already holds it.

    Servers differ: some give the path relative to ``root_path``, some the full
    path, and uvicorn's ``--root-path`` prefixes the client's (full) path once more.
    """
    path: str = scope.get("path") or "/"
    root: str = (scope.get("root_path") or "").rstrip("/")
    if not root:
        return path
    if not path.startswith(root):
        return root + path
    rest = path[len(root) :]
    if rest.startswith(root) and (len(rest) == len(root) or rest[len(root)] == "/"):
        return rest  # the mount point twice
    return path


def _sse_headers() -> Headers:
    return [(b"content-type", generate.SSE_CONTENT_TYPE), _NO_CACHE]


def _json(document: Any) -> Reply:
    return 200, list(_JSON), _ERROR_ENCODER.encode(document).encode("utf-8")


def _status(ok: bool) -> Reply:
    """Readiness and liveness: 200 when true, 400 otherwise (as Triton answers)."""
    return (200 if ok else 400), [], b""


def _json_body(body: bytes) -> dict[str, Any]:
    if not body:
        return {}
    doc = codec.parse_json(body)
    if type(doc) is not dict:
        raise InvalidArgument("the request JSON body must be an object")
    return doc


def _parameters(body: bytes) -> dict[str, Any]:
    params = _json_body(body).get("parameters", {})
    if type(params) is not dict:
        raise InvalidArgument("the request field 'parameters' must be an object")
    return params


def _check_head(scope: Scope, limits: RequestLimits) -> None:
    """Refuse a request whose URL, headers or declared body size are over ``limits``, or whose path
    is not in its one canonical form (no empty segment, no needless percent-encoding), before its
    body is read."""
    raw: bytes | None = scope.get("raw_path")
    path = raw if raw is not None else scope.get("path", "").encode()
    url = len(path) + len(scope.get("query_string", b""))
    if url > limits.max_url_bytes:
        raise InvalidArgument(f"the request URL is {url} bytes, over the limit of {limits.max_url_bytes}")
    if raw is not None and (b"%" in raw or b"//" in raw):
        _check_path(raw)
    size = 0
    length = None
    for key, value in scope["headers"]:
        size += len(key) + len(value)
        if key == b"content-length":
            length = value
    if size > limits.max_header_bytes:
        raise InvalidArgument(
            f"the request headers are {size} bytes, more than the limit of {limits.max_header_bytes}"
        )
    if length is not None:
        if not (length.isdigit() and len(length) <= 20):
            raise InvalidArgument(f"Content-Length must be an integer, got '{length.decode('latin-1')[:40]}'")
        if int(length) > limits.max_input_size:
            raise _too_large(int(length), limits.max_input_size)


def _check_path(raw: bytes) -> None:
    if b"//" in raw:
        raise InvalidArgument(f"the request path '{_shown(raw)}' has an empty segment ('//')")
    for escape in _ESCAPE.finditer(raw):
        if int(escape.group(1), 16) in _NEEDLESS:
            canonical = _ESCAPE.sub(
                lambda m: bytes((int(m.group(1), 16),)) if int(m.group(1), 16) in _NEEDLESS else m.group(0),
                raw,
            )
            raise InvalidArgument(
                f"the request path '{_shown(raw)}' percent-encodes '{chr(int(escape.group(1), 16))}', which "
                f"must appear as is; the path is '{_shown(canonical)}'"
            )


def _shown(raw: bytes) -> str:
    text = raw.decode("latin-1")
    return text if len(text) <= 200 else text[:200] + "..."


def _too_large(size: int, limit: int) -> TooLarge:
    return TooLarge(f"the request body is {size} bytes, more than the limit of {limit} (max_input_size)")


async def _read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body; :class:`TooLarge` as soon as it passes ``limit`` bytes."""
    message = await receive()
    if message["type"] == "http.disconnect":
        raise _Disconnected
    body: bytes = message.get("body", b"")
    if len(body) > limit:
        raise _too_large(len(body), limit)
    if not message.get("more_body", False):
        return body
    chunks = [body]
    total = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        total += len(chunk)
        if total > limit:
            raise _too_large(total, limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _trace(call: _Call, request: InferRequest) -> None:
    """Place a request in its trace: under the caller's span for a step or call another replica sent
    (``x-triton-trace-step``), else under a new root span where the request is to be traced."""
    assert call.traced is not None
    parent = call.header(b"traceparent")
    step = call.header(TRACE_STEP_HEADER)
    if step is not None:
        request.trace = TraceParent.from_header(parent, int(step) if step.isdigit() else 0)
        return
    root = await TRACER.start(request.model_name, parent, "HTTP", call.traced.received)
    if root is not None:
        call.traced.root = root
        request.trace = root.parent


async def _respond(send: Send, reply: Reply) -> None:
    status, given, body = reply
    headers = [*given, (b"content-length", str(len(body)).encode())]  # a reply may be a shared constant
    try:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    except OSError:  # the client went away
        pass


async def _next_answer(stream: AsyncIterator[InferResponse]) -> InferResponse | None:
    """The next response worth an event (an empty final response is not), None at the end."""
    async for response in stream:
        if response.outputs:
            return response
    return None


async def _stream(receive: Receive, send: Send, reply: Streamed) -> None:
    """Send ``reply``'s chunks as they come; a client that disconnects cancels them."""

    async def pump() -> None:
        await send({"type": "http.response.start", "status": 200, "headers": reply.headers})
        async with contextlib.aclosing(reply.chunks) as chunks:
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    sending = asyncio.ensure_future(pump())
    watching = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait((sending, watching), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (sending, watching):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await sending
        with contextlib.suppress(asyncio.CancelledError):
            await watching


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
