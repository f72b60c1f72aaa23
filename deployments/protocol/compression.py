"""HTTP body compression: gzip and deflate request bodies, compressed responses on request.

``deflate`` is the zlib format (what HTTP clients, tritonclient among them,
send); raw deflate streams are accepted too.
"""

from __future__ import annotations

import gzip
import zlib

from repository_loader.errors import InvalidArgument, Unsupported


def decompress(body: bytes, encoding: str | None) -> bytes:
    """Undo the request's ``Content-Encoding`` (gzip, deflate, identity)."""
    if not encoding or encoding == "identity":
        return body
    try:
        if encoding == "gzip":
            return gzip.decompress(body)
        if encoding == "deflate":
            try:
                return zlib.decompress(body)
            except zlib.error:
                return zlib.decompress(body, -zlib.MAX_WBITS)  # raw deflate
    except (OSError, EOFError, zlib.error) as e:
        raise InvalidArgument(f"failed to decompress the {encoding} request body: {e}") from None
    raise Unsupported(f"unsupported Content-Encoding '{encoding}' (gzip, deflate or identity)")


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
