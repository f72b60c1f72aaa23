"""Tensor bytes of a gRPC inference message kept out of protobuf: read in place, written as parts.

``ModelInferRequest.raw_input_contents`` and ``ModelInferResponse.raw_output_contents`` carry the
tensors' bytes. Through protobuf, a megabyte of them is copied on every step: into the parser's
arena, out of it as a new ``bytes`` when read, from a numpy array with ``tobytes()``, and again when
the message is serialized. On the gRPC-over-HTTP/1.1 lane (``deployments.protocol.grpc_http1``) a
large message skips that:

* :func:`split` parses a received message's other fields with protobuf and keeps each raw entry as
  a view on the received bytes (the tensors become ``np.frombuffer`` views on them);
* :class:`Tailed` is a message whose raw entries are kept beside it: ``parts()`` is its wire form
  as a list (the message's own serialization, then each entry's key and length and the tensor's
  bytes as they are), which the transport writes without joining.

Protobuf's wire format allows this: a message's fields may come in any order, and the entries of
a repeated field are read in the order they come. :class:`Tailed` reads like the message for every
other field, so the codec needs no second path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf.message import DecodeError

RAW_INPUT_FIELD = 7  # ModelInferRequest.raw_input_contents
RAW_OUTPUT_FIELD = 6  # ModelInferResponse.raw_output_contents
TAIL_MIN_BYTES = 64 * 1024  # below this, protobuf's own copies cost less than the Python here
_LENGTH_DELIMITED = 2

Buffer = bytes | memoryview


class Tailed:
    """``message`` with its repeated bytes field ``name`` (number ``number``) held as ``raws``."""

    __slots__ = ("message", "name", "number", "raws")

    def __init__(self, message: Any, name: str, number: int, raws: Sequence[Buffer]) -> None:
        self.message = message
        self.name = name
        self.number = number
        self.raws = list(raws)

    def __getattr__(self, attribute: str) -> Any:
        if attribute == self.name:
            return self.raws
        return getattr(self.message, attribute)

    def _keys(self) -> list[bytes]:
        key = varint(self.number << 3 | _LENGTH_DELIMITED)
        return [key + varint(len(raw)) for raw in self.raws]

    def ByteSize(self) -> int:  # noqa: N802  # protobuf's name, so a size check reads either
        return self.message.ByteSize() + sum(len(k) for k in self._keys()) + sum(len(r) for r in self.raws)

    def parts(self) -> list[Buffer]:
        """The wire form, in parts: the message's other fields, then each raw entry."""
        out: list[Buffer] = [self.message.SerializeToString()]
        for key, raw in zip(self._keys(), self.raws, strict=True):
            out += (key, raw)
        return out

    def SerializeToString(self) -> bytes:  # noqa: N802
        return b"".join(self.parts())


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _read_varint(view: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(view) or shift > 63:
            raise DecodeError("truncated or overlong varint")
        byte = view[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def split(data: Buffer, message_type: Any, name: str, number: int) -> Tailed:
    """Parse ``data`` as ``message_type`` with the entries of its repeated bytes field ``name``
    (number ``number``) left as views on ``data``; :class:`DecodeError` where it is not a message."""
    view = memoryview(data).cast("B")
    rest: list[memoryview] = []
    raws: list[memoryview] = []
    pos, end = 0, len(view)
    while pos < end:
        start = pos
        key, pos = _read_varint(view, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _read_varint(view, pos)
        elif wire == 1:
            pos += 8
        elif wire == _LENGTH_DELIMITED:
            length, pos = _read_varint(view, pos)
            if field == number and pos + length <= end:
                raws.append(view[pos : pos + length])
                pos += length
                continue
            pos += length
        elif wire == 5:
            pos += 4
        else:
            raise DecodeError(f"wire type {wire} of field {field} is not read here")
        if pos > end:
            raise DecodeError("truncated message")
        rest.append(view[start:pos])
    if pos != end:
        raise DecodeError("truncated message")
    return Tailed(message_type.FromString(b"".join(rest)), name, number, raws)
