"""HTTP body compression: gzip and deflate request bodies, compressed responses on request.

``deflate`` is the zlib format (what HTTP clients, tritonclient among them,
send); raw deflate streams are accepted too. A request body is inflated in
steps of at most :data:`STEP` bytes and refused (:class:`TooLarge`, HTTP 413)
as soon as its inflated size passes the limit: a small body that inflates to
gigabytes never gets the memory.
"""

from __future__ import annotations

import gzip
import zlib

from repository_loader.errors import InvalidArgument, TooLarge, Unsupported

STEP = 1 << 20  # bytes of output per inflate step
_GZIP = 16 + zlib.MAX_WBITS


def decompress(body: bytes, encoding: str | None, limit: int | None = None) -> bytes:
    """Undo the request's ``Content-Encoding`` (gzip, deflate, identity), inflating at most ``limit`` bytes."""
    if not encoding or encoding == "identity":
        return body
    if encoding == "gzip":
        wbits = _GZIP
    elif encoding == "deflate":
        wbits = zlib.MAX_WBITS
    else:
        raise Unsupported(
            f"Unsupported compression type: Content-Encoding '{encoding}' (gzip, deflate or identity)"
        )
    try:
        try:
            return _inflate(body, wbits, limit, encoding)
        except zlib.error:
            if encoding != "deflate":
                raise
            return _inflate(body, -zlib.MAX_WBITS, limit, encoding)  # raw deflate
    except zlib.error as e:
        raise InvalidArgument(f"failed to decompress the {encoding} request body: {e}") from None


def _inflate(data: bytes, wbits: int, limit: int | None, encoding: str) -> bytes:
    out: list[bytes] = []
    total = 0
    while True:  # gzip bodies may hold several members, one after another
        inflater = zlib.decompressobj(wbits)
        pending = data
        while True:
            piece = inflater.decompress(pending, STEP)
            total += len(piece)
            if limit is not None and total > limit:
                raise TooLarge(
                    f"the {encoding} request body inflates to more than the limit of {limit} bytes"
                )
            out.append(piece)
            pending = inflater.unconsumed_tail
            if inflater.eof or (not pending and not piece):
                break
        if not inflater.eof:
            raise InvalidArgument(f"failed to decompress the {encoding} request body: it is truncated")
        data = inflater.unused_data
        if wbits != _GZIP or not data:
            return out[0] if len(out) == 1 else b"".join(out)


def choose_encoding(accept: str | None) -> str | None:
    """The response encoding an ``Accept-Encoding`` value asks for: "gzip", "deflate" or None."""
    if not accept:
        return None
    for part in accept.split(","):
        token, _, q = part.partition(";")
        token = token.strip().lower()
        if token in ("gzip", "deflate") and q.strip().replace(" ", "") not in ("q=0", "q=0.0", "q=0.00"):
            return token
    return None


def compress(body: bytes, encoding: str) -> bytes:
    """Compress a response body as ``encoding`` ("gzip" or "deflate", the zlib format)."""
    if encoding == "gzip":
        return gzip.compress(body, compresslevel=6)
    return zlib.compress(body)
