"""One exception root for the whole server, with its HTTP and gRPC status.

Every error the server reports derives from :class:`ServerError`. Each class
carries the Triton error code it stands for; the table below maps that code to
an HTTP status and a gRPC status code, once, for every front end.
"""

from __future__ import annotations

from enum import Enum


class ErrorCode(str, Enum):
    """Triton's ``TRITONSERVER_Error_Code`` values (and ``pb_utils.TritonError`` codes)."""

    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"


# code -> (HTTP status, gRPC status code name)  -- the single mapping table.
STATUS_TABLE: dict[ErrorCode, tuple[int, str]] = {
    ErrorCode.UNKNOWN: (500, "UNKNOWN"),
    ErrorCode.INTERNAL: (500, "INTERNAL"),
    ErrorCode.NOT_FOUND: (404, "NOT_FOUND"),
    ErrorCode.INVALID_ARG: (400, "INVALID_ARGUMENT"),
    ErrorCode.UNAVAILABLE: (503, "UNAVAILABLE"),
    ErrorCode.UNSUPPORTED: (501, "UNIMPLEMENTED"),
    ErrorCode.ALREADY_EXISTS: (409, "ALREADY_EXISTS"),
    ErrorCode.CANCELLED: (499, "CANCELLED"),
}


class ServerError(Exception):
    """Root of every error the server reports to a client or an operator."""

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def http_status(self) -> int:
        return STATUS_TABLE[self.code][0]

    @property
    def grpc_status(self) -> str:
        """Name of the ``grpc.StatusCode`` member."""
        return STATUS_TABLE[self.code][1]

    def to_json(self) -> dict[str, str]:
        return {"error": self.message}


class InvalidArgument(ServerError):
    code = ErrorCode.INVALID_ARG


class NotFound(ServerError):
    code = ErrorCode.NOT_FOUND


class NoAvailableVersion(NotFound):
    """A model the server knows (loading, failed to load, unloaded) with no version ready: Triton's
    NOT_FOUND ``has no available versions``, told apart from a name the server never knew."""


class Unavailable(ServerError):
    code = ErrorCode.UNAVAILABLE


class Rejected(Unavailable):
    """A request its model's scheduler refused: the queue was full (``max_queue_size``) or the request's
    queue timeout expired under ``timeout_action: REJECT``. Triton counts it as a ``REJECTED`` failure."""


class Unsupported(ServerError):
    code = ErrorCode.UNSUPPORTED


class InternalError(ServerError):
    code = ErrorCode.INTERNAL


class AlreadyExists(ServerError):
    code = ErrorCode.ALREADY_EXISTS


class Cancelled(ServerError):
    code = ErrorCode.CANCELLED


class SequenceCancelled(Cancelled):
    """A pending request of a sequence whose other request was cancelled: the sequence batcher cancels
    the whole sequence, as Triton does, and counts it as a ``CANCELED`` failure (a model's own
    CANCELLED error stays a ``BACKEND`` failure)."""


class UnknownError(ServerError):
    code = ErrorCode.UNKNOWN


class ConfigError(InvalidArgument):
    """A model's configuration or files break one of Triton's rules."""


class ConfigUnread(ConfigError):
    """A model's configuration file could not be read: missing (with auto-complete off), not text, or
    not protobuf text. Triton's poll fails for such a model, which it then never adds to its model
    lifecycle: requests for it are for an unknown model."""


class PollFailed(InvalidArgument):
    """A load of a model whose configuration could not be read (:class:`ConfigUnread`): Triton's
    "failed to poll from model repository", with the reason."""


class TooLarge(InvalidArgument):
    """A request over one of the server's size limits: HTTP 413, gRPC RESOURCE_EXHAUSTED."""

    @property
    def http_status(self) -> int:
        return 413

    @property
    def grpc_status(self) -> str:
        return "RESOURCE_EXHAUSTED"


class TooBusy(Unavailable):
    """More requests at once than a replica accepts: HTTP 429, gRPC UNAVAILABLE (retry later)."""

    @property
    def http_status(self) -> int:
        return 429


class ExecutionTimeout(Unavailable):
    """A model ran past its ``execution_timeout_ms``: HTTP 504, gRPC DEADLINE_EXCEEDED."""

    @property
    def http_status(self) -> int:
        return 504

    @property
    def grpc_status(self) -> str:
        return "DEADLINE_EXCEEDED"


class Restricted(Unavailable):
    """An API group this server answers only with its configured header (Triton's restricted API):
    HTTP 403, gRPC UNAVAILABLE, as tritonserver answers."""

    @property
    def http_status(self) -> int:
        return 403


_BY_CODE: dict[ErrorCode, type[ServerError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        Unavailable,
        Unsupported,
        InternalError,
        AlreadyExists,
        Cancelled,
        UnknownError,
    )
}


def error_for_code(code: ErrorCode | str, message: str) -> ServerError:
    """Build the error class that stands for ``code``."""
    return _BY_CODE[ErrorCode(code)](message)


ERROR_CODE_HEADER = "triton-error-code"
"""Set on this server's HTTP error replies: the code of the error (statuses such as 500 stand for two)."""


def error_for_http_status(status: int, message: str, code: str | None = None) -> ServerError:
    """The error an HTTP reply of this server stands for (its own replicas' answers, read back):
    ``code`` (the reply's ``ERROR_CODE_HEADER``) where its status alone does not tell."""
    if code in _BY_CODE and STATUS_TABLE[ErrorCode(code)][0] == status:
        return _BY_CODE[ErrorCode(code)](message)
    for cls in (TooLarge, TooBusy, ExecutionTimeout, Restricted):
        if cls("").http_status == status:
            return cls(message)
    for code, (http, _) in sorted(STATUS_TABLE.items(), key=lambda item: item[0] == ErrorCode.UNKNOWN):
        if http == status:  # 500 without a code: INTERNAL
            return _BY_CODE[code](message)
    return UnknownError(message) if status >= 500 else InvalidArgument(message)
