"""The KServe v2 gRPC front end (``inference.GRPCInferenceService``) over a :class:`DataPlane`.

:class:`GRPCInferenceServicer` answers every RPC of the service with one
coroutine each (one method per RPC, named as the RPC); :func:`build_grpc_server`
puts it on a ``grpc.aio`` server with the options of :class:`GrpcOptions`.
The RPC table is read from the compiled service descriptor, so the server
answers exactly the service of ``proto/grpc_service.proto``.

Errors are the gRPC status of the :class:`~repository_loader.errors.ServerError`
raised (``ServerError.grpc_status``, the one table); anything else is INTERNAL.
On ``ModelStreamInfer`` an error ends only the request it belongs to: it comes
back as the ``error_message`` of one stream response and the stream stays open;
a stream started with the header ``triton_grpc_error: true`` (Triton's "gRPC
status codes" mode) instead ends at its first error, with that error's status.

Usage, in the process and event loop that will serve::

    server, port = build_grpc_server(dataplane, GrpcOptions(port=8001))
    await server.start()
    ...
    await server.stop(grace=5)
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from deployments.inference import InferRequest
from deployments.protocol import extension_queries, grpc_codec, log_settings
from deployments.protocol.dataplane import DataPlane
from deployments.protocol.forwarding import forward_headers
from deployments.protocol.inference_calls import InferenceCalls
from deployments.protocol.proto import grpc_service_pb2 as pb
from deployments.protocol.shared_memory import SharedMemory
from deployments.settings import RestrictedApi, restriction_for
from deployments.tracing import TRACER
from repository_loader.config import config_from_json
from repository_loader.errors import (
    InvalidArgument,
    NotFound,
    Restricted,
    ServerError,
    TooLarge,
    Unsupported,
)

logger = logging.getLogger(__name__)

SERVICE = "inference.GRPCInferenceService"
_SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
_ENABLE_EMPTY_FINAL = "triton_enable_empty_final_response"
_FINAL = "triton_final_response"
_COMPRESSION = {
    None: grpc.Compression.NoCompression,
    "": grpc.Compression.NoCompression,
    "none": grpc.Compression.NoCompression,
    "gzip": grpc.Compression.Gzip,
    "deflate": grpc.Compression.Deflate,
}


@dataclass(frozen=True)
class GrpcOptions:
    """How the gRPC server listens and what it accepts.

    ``port`` 0 picks a free port (returned by :func:`build_grpc_server`).
    ``compression`` ("gzip", "deflate" or None) compresses responses; compressed
    requests are always accepted. A message over a size limit is refused with
    RESOURCE_EXHAUSTED.
    """

    host: str = "0.0.0.0"
    port: int = 8001
    max_receive_message_bytes: int = 64 * 1024 * 1024
    max_send_message_bytes: int = 64 * 1024 * 1024
    compression: str | None = None
    max_concurrent_rpcs: int | None = None
    restricted: tuple[RestrictedApi, ...] = ()  # Triton's --grpc-restricted-protocol (metadata key/value)
    header_forward: re.Pattern[str] | None = None  # Triton's --grpc-header-forward-pattern
    # every unary answer but ModelInfer's waits this long (tritonserver's testing variable
    # TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC; its other calls are not held meanwhile here)
    response_delay_s: float = 0.0

    def __post_init__(self) -> None:
        if self.compression not in _COMPRESSION:
            raise ValueError(
                f"grpc compression must be one of gzip, deflate or none, not {self.compression!r}"
            )
        if self.max_receive_message_bytes <= 0 or self.max_send_message_bytes <= 0:
            raise ValueError("grpc message size limits must be positive")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def build_grpc_server(
    dataplane: DataPlane, options: GrpcOptions | None = None
) -> tuple[grpc.aio.Server, int]:
    """A ``grpc.aio`` server answering ``inference.GRPCInferenceService`` over ``dataplane``.

    The server is bound (to ``options.address``) but not started; returns it
    and the port bound. Call from the event loop that will run it.
    """
    options = options or GrpcOptions()
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", options.max_receive_message_bytes),
            ("grpc.max_send_message_length", options.max_send_message_bytes),
        ],
        compression=_COMPRESSION[options.compression],
        maximum_concurrent_rpcs=options.max_concurrent_rpcs,
    )
    server.add_generic_rpc_handlers((GRPCInferenceServicer(dataplane, options).handler(),))
    port = server.add_insecure_port(options.address)
    if port == 0:
        raise OSError(f"cannot bind the gRPC server to {options.address}")
    return server, port


@dataclass(frozen=True)
class RpcMethod:
    """One RPC of the service as a servicer answers it (``call`` takes the request message; a
    streaming one also the call's context)."""

    name: str
    request_type: Any
    response_type: Any
    call: Callable[..., Any]
    rule: RestrictedApi | None
    streaming: bool


class GRPCInferenceServicer:
    """Every RPC of ``inference.GRPCInferenceService``, each a coroutine over the data plane."""

    def __init__(self, dataplane: DataPlane, options: GrpcOptions | None = None) -> None:
        self.dataplane = dataplane
        self.options = options or GrpcOptions()
        self.calls = InferenceCalls(dataplane)

    def handler(self) -> grpc.GenericRpcHandler:
        """The generic handler that routes each method of the service to its coroutine."""
        handlers: dict[str, grpc.RpcMethodHandler] = {}
        for method in self.methods().values():
            read = bounded(method.request_type.FromString, self.options.max_receive_message_bytes)
            if method.streaming:
                handlers[method.name] = grpc.stream_stream_rpc_method_handler(
                    _guarded_stream(method.call, method.rule, self.options),
                    request_deserializer=read,
                    response_serializer=method.response_type.SerializeToString,
                )
            else:
                handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                    _guarded(method, self.options),
                    request_deserializer=read,
                    response_serializer=method.response_type.SerializeToString,
                )
        return grpc.method_handlers_generic_handler(SERVICE, handlers)

    def methods(self) -> dict[str, RpcMethod]:
        """Every RPC of the service by name: its message types, its coroutine and its API group's rule."""
        found: dict[str, RpcMethod] = {}
        for method in _SERVICE.methods:
            found[method.name] = RpcMethod(
                name=method.name,
                request_type=getattr(pb, method.input_type.name),
                response_type=getattr(pb, method.output_type.name),
                call=getattr(self, method.name),
                rule=restriction_for(self.options.restricted, RPC_GROUPS.get(method.name, "inference")),
                streaming=method.client_streaming,
            )
        return found

    # --- health and metadata -------------------------------------------------

    async def ServerLive(self, request: Any) -> Any:
        return pb.ServerLiveResponse(live=await self.dataplane.live())

    async def ServerReady(self, request: Any) -> Any:
        return pb.ServerReadyResponse(ready=await self.dataplane.ready())

    async def ModelReady(self, request: Any) -> Any:
        """``ready: false`` for a model (or version) not ready or not known, as tritonserver answers."""
        try:
            ready = await self.dataplane.model_ready(request.name, request.version)
        except NotFound:
            ready = False
        return pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request: Any) -> Any:
        doc = await self.dataplane.server_metadata()
        return pb.ServerMetadataResponse(
            name=doc["name"], version=doc["version"], extensions=doc.get("extensions", [])
        )

    async def ModelMetadata(self, request: Any) -> Any:
        doc = await self.dataplane.model_metadata(request.name, request.version)
        return grpc_codec.model_metadata_message(doc)

    # --- inference -----------------------------------------------------------

    async def ModelInfer(self, request: Any) -> Any:
        description, schema = await self.calls.schema(request.model_name, request.model_version)
        self.calls.refuse_decoupled(description, "ModelInfer RPC")
        infer_request = grpc_codec.decode_infer_request(request)
        self._forward_headers(infer_request)
        if TRACER.active:
            return await self._traced_infer(infer_request, description, schema)
        response = await self.calls.infer_one(infer_request, description)
        return grpc_codec.encode_infer_response(
            response, infer_request.requested_outputs, schema, tailed=_tailed_answers.get()
        )

    async def _traced_infer(self, request: InferRequest, description: Any, schema: Any) -> Any:
        """``ModelInfer`` while tracing is on: the request under its root span where it is traced
        (the ``GRPC_`` events are taken around the handler; the send is the transport's)."""
        received = time.monotonic_ns()
        metadata = _call_metadata.get()
        parent = metadata().get("traceparent") if metadata is not None else None
        root = await TRACER.start(request.model_name, parent, "GRPC", received)
        if root is not None:
            request.trace = root.parent
        try:
            response = await self.calls.infer_one(request, description)
            return grpc_codec.encode_infer_response(
                response, request.requested_outputs, schema, tailed=_tailed_answers.get()
            )
        finally:
            if root is not None:
                done = time.monotonic_ns()
                root.finish(done, done, time.monotonic_ns())

    def _forward_headers(self, request: InferRequest) -> None:
        """The call's metadata that ``options.header_forward`` matches, as request parameters."""
        metadata = _call_metadata.get()
        if self.options.header_forward is not None and metadata is not None:
            forward_headers(request, self.options.header_forward, metadata().items())

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        """Answer each request of the stream as it completes; a decoupled model may answer 0..N times.
        In ``triton_grpc_error`` mode the first error ends the stream with its status (:class:`StreamEnded`)."""
        queue: asyncio.Queue[Any] = asyncio.Queue()
        ends_on_error = _grpc_error_mode(context)
        reader = asyncio.create_task(self._read_stream(requests, queue, ends_on_error))
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                if isinstance(item, StreamEnded):
                    raise item
                yield item
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        if reader.done() and not reader.cancelled() and reader.exception() is not None:
            raise reader.exception()  # type: ignore[misc]

    async def _read_stream(
        self, requests: AsyncIterator[Any], queue: asyncio.Queue[Any], ends_on_error: bool = False
    ) -> None:
        """Start one task per request read; when the client half-closes, wait for them, then end."""
        tasks: set[asyncio.Task[None]] = set()
        try:
            async for message in requests:
                task = asyncio.create_task(self._stream_one(message, queue.put_nowait, ends_on_error))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()  # the client went away: the model's work is cancelled too
            queue.put_nowait(None)

    async def _stream_one(
        self, message: Any, put: Callable[[Any], None], ends_on_error: bool = False
    ) -> None:
        try:
            description, schema = await self.calls.schema(message.model_name, message.model_version)
            request = grpc_codec.decode_infer_request(message)
            self._forward_headers(request)
            outputs = request.requested_outputs
            if not description.decoupled:
                response = await self.calls.infer_one(request, description)
                encoded = grpc_codec.encode_infer_response(response, outputs, schema)
                put(pb.ModelStreamInferResponse(infer_response=encoded))
                return
            empty_final = request.parameters.get(_ENABLE_EMPTY_FINAL) is True
            # aclosing: a cancelled task (the client went away) closes the model's stream at once
            async with contextlib.aclosing(self.calls.responses(request, description)) as responses:
                async for response in responses:
                    if response.final and not response.outputs and not empty_final:
                        continue
                    response.parameters[_FINAL] = response.final
                    # a flags-only final response goes out as it is, with none of the requested outputs
                    asked = outputs if response.outputs or not response.final else []
                    encoded = grpc_codec.encode_infer_response(response, asked, schema)
                    put(pb.ModelStreamInferResponse(infer_response=encoded))
        except ServerError as e:
            put(
                StreamEnded(grpc.StatusCode[e.grpc_status], e.message)
                if ends_on_error
                else _stream_error(message, e.message)
            )
        except Exception as e:
            logger.exception("internal error answering a stream request for model '%s'", message.model_name)
            text = f"internal error: {type(e).__name__}: {e}"
            put(
                StreamEnded(grpc.StatusCode.INTERNAL, text) if ends_on_error else _stream_error(message, text)
            )

    # --- configuration, statistics, repository ------------------------------------

    async def ModelConfig(self, request: Any) -> Any:
        document = await self.dataplane.model_config(request.name, request.version)
        config = config_from_json(document, f"configuration of model '{request.name}'")
        return pb.ModelConfigResponse(config=config.SerializeToString())

    async def ModelStatistics(self, request: Any) -> Any:
        name = request.name or None
        document = await self.dataplane.model_statistics(name, request.version)
        return grpc_codec.statistics_message(document)

    async def RepositoryIndex(self, request: Any) -> Any:
        _check_repository(request.repository_name)
        return grpc_codec.repository_index_message(await self.dataplane.repository_index(request.ready))

    async def RepositoryModelLoad(self, request: Any) -> Any:
        _check_repository(request.repository_name)
        params = grpc_codec.repository_parameters(request.parameters)
        await self.dataplane.load_model(request.model_name, params)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: Any) -> Any:
        _check_repository(request.repository_name)
        params = grpc_codec.repository_parameters(request.parameters)
        await self.dataplane.unload_model(request.model_name, params)
        return pb.RepositoryModelUnloadResponse()

    # --- shared memory (deployments.protocol.shared_memory; CUDA: queries only), trace settings, logging ---

    def _shared(self) -> SharedMemory:
        if self.calls.shared is None:
            raise Unsupported("this endpoint does not serve shared memory")
        return self.calls.shared

    async def SystemSharedMemoryStatus(self, request: Any) -> Any:
        response = pb.SystemSharedMemoryStatusResponse()
        for entry in await self._shared().status(request.name):
            response.regions[entry["name"]].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(**entry)
            )
        return response

    async def SystemSharedMemoryRegister(self, request: Any) -> Any:
        await self._shared().register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request: Any) -> Any:
        await self._shared().unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(self, request: Any) -> Any:
        extension_queries.cuda_shared_memory_status(request.name)
        return pb.CudaSharedMemoryStatusResponse()

    async def CudaSharedMemoryRegister(self, request: Any) -> Any:
        extension_queries.register_cuda_shared_memory(request.name)
        return pb.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(self, request: Any) -> Any:
        return pb.CudaSharedMemoryUnregisterResponse()  # no CUDA region can be registered

    async def TraceSetting(self, request: Any) -> Any:
        """Triton's gRPC form: a setting with no value is cleared; ``trace_level`` takes every value,
        the others their first."""
        asked = {
            key: (list(value.value) if key == "trace_level" else value.value[0]) if value.value else None
            for key, value in request.settings.items()
        }
        model = request.model_name or None
        if asked:
            document = await self.dataplane.update_trace_settings(model, asked)
        else:
            document = await self.dataplane.trace_settings(model)
        response = pb.TraceSettingResponse()
        for key, value in document.items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    async def LogSettings(self, request: Any) -> Any:
        changes = log_settings.changes_from_grpc(request.settings)
        current = await (
            self.dataplane.update_log_settings(changes) if changes else self.dataplane.log_settings()
        )
        response = pb.LogSettingsResponse()
        for name, (choice, value) in log_settings.grpc_setting_values(current).items():
            setattr(response.settings[name], choice, value)
        return response


# Triton's API group of each RPC (for the restricted API).
RPC_GROUPS = {
    "ServerLive": "health",
    "ServerReady": "health",
    "ModelReady": "health",
    "ServerMetadata": "metadata",
    "ModelMetadata": "metadata",
    "ModelInfer": "inference",
    "ModelStreamInfer": "inference",
    "ModelConfig": "model-config",
    "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory",
    "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory",
    "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory",
    "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace",
    "LogSettings": "logging",
}


RESTRICTED_HEADER_PREFIX = "triton-grpc-protocol-"
"""Over gRPC, a restriction's key ``k`` is checked in the metadata key ``triton-grpc-protocol-k``
(Triton's ``--grpc-restricted-protocol``); over HTTP it is the bare header ``k``."""


def restricted_metadata_key(rule: RestrictedApi) -> str:
    return RESTRICTED_HEADER_PREFIX + rule.key


def _check_restricted(rule: RestrictedApi | None, metadata: Callable[[], Mapping[str, str]]) -> None:
    if rule is None:
        return
    key = restricted_metadata_key(rule)
    if metadata().get(key) != rule.value:
        raise Restricted(f"This protocol is restricted, expecting header '{key}'")


# The metadata of the call being answered (for --grpc-header-forward-pattern), set per call.
_call_metadata: contextvars.ContextVar[Callable[[], Mapping[str, str]] | None] = contextvars.ContextVar(
    "grpc_call_metadata", default=None
)
# Whether the call's transport writes a ``raw_tail.Tailed`` answer's parts (the HTTP/1.1 lane), set per call.
_tailed_answers: contextvars.ContextVar[bool] = contextvars.ContextVar("grpc_tailed_answers", default=False)


def _context_metadata(context: Any) -> Callable[[], Mapping[str, str]]:
    return lambda: dict(context.invocation_metadata() or ())


class _Oversized:
    """A request message over the receive limit, in place of the message (refused by the handler)."""

    __slots__ = ("size", "limit")

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit

    def error(self) -> TooLarge:
        return TooLarge(f"Received message larger than max ({self.size} vs. {self.limit})")


def bounded(parse: Callable[[bytes], Any], limit: int) -> Callable[[bytes], Any]:
    """``parse`` for messages up to ``limit`` bytes. gRPC's own limit refuses them first where this
    server owns the gRPC server; on a server built by Serve (larger limits), this one does."""

    def read(data: bytes) -> Any:
        return _Oversized(len(data), limit) if len(data) > limit else parse(data)

    return read


def _per_call(context: Any, options: GrpcOptions) -> None:
    """What a server built by Serve does not set for the whole server: response compression."""
    if options.compression not in (None, "", "none"):
        context.set_compression(_COMPRESSION[options.compression])


def _guarded_stream(
    method: Callable[[Any, Any], AsyncIterator[Any]], rule: RestrictedApi | None, options: GrpcOptions
) -> Any:
    """A streaming handler behind the restricted API's check, with messages over the limit refused."""

    async def requests_within(requests: Any) -> AsyncIterator[Any]:
        async for message in requests:
            if isinstance(message, _Oversized):
                raise message.error()
            yield message

    async def handle(requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            _check_restricted(rule, _context_metadata(context))
        except ServerError as e:
            await context.abort(grpc.StatusCode[e.grpc_status], e.message)
        _per_call(context, options)
        _call_metadata.set(_context_metadata(context))  # read by the stream's requests (their tasks copy it)
        try:
            async for item in method(requests_within(requests), context):
                yield item
        except TooLarge as e:
            await context.abort(grpc.StatusCode[e.grpc_status], e.message)
        except StreamEnded as e:
            await context.abort(e.code, e.message)

    return handle


async def answer_unary(
    method: RpcMethod,
    request: Any,
    metadata: Callable[[], Mapping[str, str]],
    send_limit: int,
    tailed: bool = False,
) -> Any:
    """The response of a unary ``method`` to ``request`` (checked against the restricted API's rule,
    read from ``metadata``, and the receive and send limits), or the :class:`ServerError` raised.
    ``tailed``: the caller writes a :class:`raw_tail.Tailed` answer's parts, so a large
    ``ModelInfer`` answer may be one."""
    _check_restricted(method.rule, metadata)
    if isinstance(request, _Oversized):
        raise request.error()
    _call_metadata.set(metadata)  # this call's task only (each call runs in a task of its own)
    _tailed_answers.set(tailed)
    response = await method.call(request)
    size = response.ByteSize()
    if size > send_limit:
        raise TooLarge(f"Sent message larger than max ({size} vs. {send_limit})")
    return response


class MetadataContext:
    """What a streaming RPC reads of its call's context where no gRPC server made one (the HTTP/1.1
    lane): the call's metadata."""

    __slots__ = ("_metadata",)

    def __init__(self, metadata: Callable[[], Mapping[str, str]]) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return tuple(self._metadata().items())


async def answer_stream(
    method: RpcMethod, requests: AsyncIterator[Any], metadata: Callable[[], Mapping[str, str]]
) -> AsyncIterator[Any]:
    """The responses of a streaming ``method`` to ``requests``, checked against the restricted API's
    rule (read from ``metadata``); a :class:`ServerError` or :class:`StreamEnded` raised ends the
    stream with its status."""
    _check_restricted(method.rule, metadata)
    _call_metadata.set(metadata)  # read by the stream's requests (their tasks copy it)
    async for item in method.call(requests, MetadataContext(metadata)):
        yield item


def status_of(error: BaseException, method: str) -> tuple[grpc.StatusCode, str]:
    """The gRPC status answering ``error``: a :class:`ServerError`'s own (the one table), else
    INTERNAL, logged."""
    if isinstance(error, StreamEnded):
        return error.code, error.message
    if isinstance(error, ServerError):
        return grpc.StatusCode[error.grpc_status], error.message
    logger.error("internal error answering %s", method, exc_info=error)
    return grpc.StatusCode.INTERNAL, f"internal error: {type(error).__name__}: {error}"


def _guarded(method: RpcMethod, options: GrpcOptions | None = None) -> Callable[[Any, Any], Awaitable[Any]]:
    """A unary handler that turns a raised error into the gRPC status of the one table."""
    options = options or GrpcOptions()
    send_limit = options.max_send_message_bytes

    delay_s = options.response_delay_s if method.name != "ModelInfer" else 0.0

    async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            _per_call(context, options)
            response = await answer_unary(method, request, _context_metadata(context), send_limit)
        except Exception as e:
            code, message = status_of(e, method.name)
            if delay_s:
                await asyncio.sleep(delay_s)
            await context.abort(code, message)
        if delay_s:
            await asyncio.sleep(delay_s)
        return response

    handle.__name__ = method.name
    return handle


GRPC_ERROR_HEADER = "triton_grpc_error"


class StreamEnded(Exception):
    """The status a ``triton_grpc_error`` stream ends with: its first request's error."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _grpc_error_mode(context: Any) -> bool:
    """Whether the stream was started with ``triton_grpc_error: true`` (Triton reads it at the start)."""
    if context is None:
        return False
    metadata = dict(context.invocation_metadata() or ())
    return str(metadata.get(GRPC_ERROR_HEADER, "")).lower() == "true"


def _stream_error(message: Any, text: str) -> Any:
    """A stream response carrying the error of one request, named by its id, model and version."""
    return pb.ModelStreamInferResponse(
        error_message=text,
        infer_response=pb.ModelInferResponse(
            model_name=message.model_name, model_version=message.model_version, id=message.id
        ),
    )


def _check_repository(name: str) -> None:
    if name:
        raise InvalidArgument(
            f"this server serves one model repository; repository_name '{name}' is not known"
        )
