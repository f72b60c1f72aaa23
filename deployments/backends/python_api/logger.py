"""``pb_utils.Logger``: a model's log lines, named after the model that writes them.

Lines go to the Python logger ``triton_python_backend``; in a served replica
:func:`log_to_stderr` writes them to standard error in tritonserver's form.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from deployments.backends.python_api.context import current_model_name
from deployments.settings import ServerSettings

_log = logging.getLogger("triton_python_backend")


class _LogLevel(IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}


@dataclass(frozen=True)
class LogOptions:
    """Triton's log flags as a replica applies them (``ServerSettings.log_options()``)."""

    verbose: int = 0  # --log-verbose: >0 shows the models' verbose lines and the server's debug lines
    info: bool = True  # --log-info
    warning: bool = True  # --log-warning
    error: bool = True  # --log-error
    iso8601: bool = False  # --log-format=ISO8601 (default: Triton's "default" form)
    file: str = ""  # --log-file: append there instead of standard error

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> LogOptions:
        return cls(
            verbose=settings.log_verbose,
            info=settings.log_info,
            warning=settings.log_warning,
            error=settings.log_error,
            iso8601=settings.log_format == "ISO8601",
            file=settings.log_file,
        )

    def lowest(self, default: int) -> int:
        """The lowest level a handler passes: DEBUG with verbose; else the first enabled of INFO,
        WARNING, ERROR (no less than ``default``); above CRITICAL when every level is off."""
        if self.verbose > 0:
            return logging.DEBUG
        for level, on in (
            (logging.INFO, self.info),
            (logging.WARNING, self.warning),
            (logging.ERROR, self.error),
        ):
            if on:
                return max(level, default)
        return logging.CRITICAL + 1


def log_to_stderr(options: LogOptions | None = None) -> None:
    """Write the models' log lines to this process's standard error (or ``options.file``), as
    tritonserver writes its log (a served replica: Ray keeps the worker's stderr in its ``worker-*.err``
    file; Serve replaces ``sys.stderr`` with a buffered logger of its own, so the original stream is
    used). Lines are Triton's form: level letter, date and time, process, the model file's line, the
    message. INFO and above, as tritonserver without ``--log-verbose``; the flags in ``options`` change
    that as they change tritonserver's log."""
    options = options or LogOptions()
    for logger_ in (_log, logging.getLogger("deployments")):
        for handler in [h for h in logger_.handlers if getattr(h, "_triton_stderr", False)]:
            logger_.removeHandler(handler)
            handler.close()
    _log.addHandler(_handler(options, options.lowest(logging.INFO)))
    _log.setLevel(logging.DEBUG)
    _log.propagate = False  # not again through Serve's redirected stderr
    # the server's own warnings and errors in a replica (a model's execute raising, a failed load) too,
    # as tritonserver logs them: Serve keeps them in its replica files only, never in the server's log
    server = logging.getLogger("deployments")
    server.addHandler(_handler(options, options.lowest(logging.WARNING)))
    if options.verbose > 0:
        server.setLevel(logging.DEBUG)


def _handler(options: LogOptions, level: int) -> logging.Handler:
    handler: logging.Handler
    if options.file:
        handler = logging.FileHandler(options.file, encoding="utf-8")  # appends: every replica, one file
    else:
        handler = logging.StreamHandler(sys.__stderr__ or sys.stderr)
    handler.setLevel(level)
    if options.iso8601:
        form = logging.Formatter(
            "%(asctime)s %(levelname)s %(filename)s:%(lineno)d] %(message)s", "%Y-%m-%dT%H:%M:%SZ"
        )
        form.converter = time.gmtime
    else:
        form = logging.Formatter(
            "%(levelname).1s%(asctime)s %(process)d %(filename)s:%(lineno)d] %(message)s", "%m%d %H:%M:%S"
        )
    handler.setFormatter(form)
    setattr(handler, "_triton_stderr", True)  # noqa: B010 - marks ours, to replace it on a second call
    return handler


def _emit(level: int, message: Any) -> None:
    """Log ``message`` under the current model's name, attributed to the model's own source line."""
    model = current_model_name()
    text = f"model '{model}': {message}" if model else str(message)
    _log.log(_LEVELS.get(int(level), logging.INFO), text, stacklevel=3)


class Logger:
    """``pb_utils.Logger``: messages go to the replica's Python log (logger ``triton_python_backend``).

    Each line names the model that logs it; VERBOSE is Python's DEBUG level.
    """

    LogLevel = _LogLevel
    INFO = _LogLevel.INFO
    WARNING = _LogLevel.WARNING
    ERROR = _LogLevel.ERROR
    VERBOSE = _LogLevel.VERBOSE

    @staticmethod
    def log(message: Any, level: int = _LogLevel.INFO) -> None:
        if not isinstance(level, _LogLevel):  # an int too: Triton's bindings take pb_utils.LogLevel only
            raise TypeError(
                f"Logger.log(): the level must be a pb_utils.LogLevel, not {type(level).__name__}"
            )
        _emit(level, _text(message))

    @staticmethod
    def log_info(message: Any) -> None:
        _emit(_LogLevel.INFO, _text(message))

    @staticmethod
    def log_warn(message: Any) -> None:
        _emit(_LogLevel.WARNING, _text(message))

    @staticmethod
    def log_error(message: Any) -> None:
        _emit(_LogLevel.ERROR, _text(message))

    @staticmethod
    def log_verbose(message: Any) -> None:
        _emit(_LogLevel.VERBOSE, _text(message))


def _text(message: Any) -> str:
    """A log message: a str, as Triton's bindings require (``None`` is refused with ``TypeError``)."""
    if not isinstance(message, str):
        raise TypeError(f"Logger: the message must be a str, not {type(message).__name__}")
    return message
