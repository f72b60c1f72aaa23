"""``pb_utils.TritonError`` and ``pb_utils.TritonModelException``, and their link to the server's errors.

A model reports a ``TritonError`` in a response (or raises it); the server
answers with the matching :class:`ServerError`. BLS responses carry the
called model's error back to the caller as a ``TritonError``.
"""

from __future__ import annotations

from repository_loader.errors import ErrorCode, ServerError, error_for_code


class TritonError(Exception):
    """An error a model reports in a response (``InferenceResponse(error=...)``) or raises."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str = "", code: int = INTERNAL) -> None:
        super().__init__(message)
        self._message = message
        self._code = int(code)

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._message


# The server's error code for each TritonError code (its index)
_CODE_NAMES = [
    ErrorCode.UNKNOWN,
    ErrorCode.INTERNAL,
    ErrorCode.NOT_FOUND,
    ErrorCode.INVALID_ARG,
    ErrorCode.UNAVAILABLE,
    ErrorCode.UNSUPPORTED,
    ErrorCode.ALREADY_EXISTS,
    ErrorCode.CANCELLED,
]


def to_server_error(error: TritonError) -> ServerError:
    """The server's error for a model's :class:`TritonError` (same code, same message)."""
    code = error.code()
    name = _CODE_NAMES[code] if 0 <= code < len(_CODE_NAMES) else ErrorCode.UNKNOWN
    return error_for_code(name, error.message())


def from_server_error(error: ServerError) -> TritonError:
    """The :class:`TritonError` a model sees for the server's ``error`` (a BLS call's failure)."""
    return TritonError(error.message, _CODE_NAMES.index(error.code))


class TritonModelException(Exception):
    """Raised by pb_utils calls that fail (and by models to fail a whole batch)."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self._message = message

    def message(self) -> str:
        return self._message

    def __str__(self) -> str:
        return self._message
