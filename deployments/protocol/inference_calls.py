"""What every front end does around an inference, once: HTTP, gRPC and ``/generate`` decode a
request, call :class:`InferenceCalls`, and encode what it returns.

It holds the checked-request schema of each model (built once per description), refuses a
decoupled model where the protocol answers exactly once, turns ``response.error`` into the
exception the front end maps to its status, and fills the response's model name, version and id
from the request where the model left them empty.

A request that uses shared memory (``InferRequest.shared_memory``, set by the codecs) has its
inputs read from their regions and its outputs' regions checked before it goes on, and its outputs
written into them when it is answered here (a request sent on as it came is answered by the replica
it reached, which does the same); the process's regions are the data plane's ``shared_memory``
(``deployments.protocol.shared_memory``). The request counts as using its regions from before
they are looked up until its outputs are written: an unregister of one of them is refused meanwhile,
as Triton refuses it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator

from deployments.inference import InferRequest, InferResponse
from deployments.protocol import codec
from deployments.protocol.dataplane import DataPlane
from deployments.protocol.shared_memory import SharedInput, SharedMemory, write_into
from deployments.runtime.checks import ModelSchema
from deployments.runtime.router import RawReply, RawRequest
from deployments.tensors import to_numpy
from repository_loader.errors import Unsupported
from repository_loader.model import ModelDescription

Schema = tuple[ModelDescription, ModelSchema]
Spans = dict[str, memoryview]


class InferenceCalls:
    """Inference over a :class:`~deployments.protocol.dataplane.DataPlane`, as every front end needs it."""

    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane
        self._schemas: dict[tuple[str, str], Schema] = {}
        self.shared: SharedMemory | None = getattr(dataplane, "shared_memory", None)

    async def schema(self, name: str, version: str) -> Schema:
        """The model's description (NotFound / Unavailable as the data plane raises them) and the
        schema requests are checked against, rebuilt only when the description changes."""
        description = await self.dataplane.model_description(name, version)
        cached = self._schemas.get((name, version))
        if cached is not None and cached[0] is description:
            return cached
        entry = (description, ModelSchema.from_description(description))
        self._schemas[(name, version)] = entry
        return entry

    @staticmethod
    def refuse_decoupled(description: ModelDescription, endpoint: str) -> None:
        """A decoupled model may answer 0..N times: ``endpoint`` answers exactly once (Triton's words)."""
        if description.decoupled:
            raise Unsupported(f"{endpoint} doesn't support models with decoupled transaction policy")

    async def infer(
        self, request: InferRequest, description: ModelDescription, raw: RawRequest | None = None
    ) -> InferResponse | RawReply:
        """The one response of ``request``; its error raised. Where ``raw`` is given, the reply of the
        replica it was sent on to may come back as it is."""
        if not request.shared_memory:
            answer = await self.dataplane.infer(request, raw)
            if isinstance(answer, InferResponse):
                complete(answer, request, description)
            return answer
        with self._shared().using(_regions(request)):
            spans = await self._read_shared(request, description)
            answer = await self.dataplane.infer(request, raw)
            if isinstance(answer, InferResponse):
                complete(answer, request, description)
                _write_shared(answer, request, spans)
            return answer

    async def infer_one(self, request: InferRequest, description: ModelDescription) -> InferResponse:
        """:meth:`infer` without a raw request: always a response."""
        answer = await self.infer(request, description)
        assert isinstance(answer, InferResponse)  # no raw request, so no raw reply
        return answer

    async def responses(
        self, request: InferRequest, description: ModelDescription
    ) -> AsyncGenerator[InferResponse, None]:
        """Every response of ``request`` as it comes, the first error raised; closing early cancels it."""
        with contextlib.ExitStack() as regions:
            spans: Spans = {}
            if request.shared_memory:
                regions.enter_context(self._shared().using(_regions(request)))
                spans = await self._read_shared(request, description)
            async with contextlib.aclosing(self.dataplane.infer_stream(request)) as stream:
                async for response in stream:
                    complete(response, request, description)
                    if spans:
                        _write_shared(response, request, spans)
                    yield response

    def _shared(self) -> SharedMemory:
        if self.shared is None:
            raise Unsupported("this endpoint does not read or write tensors in shared memory")
        return self.shared

    async def _read_shared(self, request: InferRequest, description: ModelDescription) -> Spans:
        """Read the request's inputs from shared memory, in place; the spans its outputs go to."""
        shared = self._shared()
        inputs = request.inputs
        for name, tensor in inputs.items():
            if type(tensor) is SharedInput:
                span = (await shared.mapped(tensor.ref.region)).span(tensor.ref)
                inputs[name] = codec.shared_tensor(
                    name, description.name, tensor.datatype, tensor.shape, span
                )
        spans: Spans = {}
        for output in request.requested_outputs or ():
            if output.shared is not None:
                spans[output.name] = (await shared.mapped(output.shared.region)).span(output.shared)
        return spans


def _regions(request: InferRequest) -> list[str]:
    """The regions ``request`` reads its inputs from and writes its outputs into."""
    names = [t.ref.region for t in request.inputs.values() if type(t) is SharedInput]
    names += [o.shared.region for o in request.requested_outputs or () if o.shared is not None]
    return names


def _write_shared(response: InferResponse, request: InferRequest, spans: Spans) -> None:
    """Each output asked for in shared memory into its span (an output the model did not produce is
    refused by the encoder)."""
    for name, span in spans.items():
        tensor = response.outputs.get(name)
        if tensor is not None:
            write_into(span, codec.tensor_bytes(to_numpy(tensor)), name)


def complete(response: InferResponse, request: InferRequest, description: ModelDescription) -> None:
    """Raise the response's error, else fill what the model left empty from the request."""
    if response.error is not None:
        raise response.error
    response.model_name = response.model_name or request.model_name
    response.model_version = (
        response.model_version or request.model_version or str(description.latest_version)
    )
    response.id = response.id or request.id


__all__ = ["InferenceCalls", "Schema", "complete"]
