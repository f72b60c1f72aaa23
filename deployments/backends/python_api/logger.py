"""``pb_utils.Logger``: a model's log lines, named after the model that writes them.

Lines go to the Python logger ``triton_python_backend``; in a served replica
:func:`log_to_stderr` writes them to standard error in tritonserver's form.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from enum import IntEnum
from typing import Any

from deployments.backends.python_api.context import current_model_name
from deployments.settings import TRITON_LINE, LogSettings

_log = logging.getLogger("triton_python_backend")


class _LogLevel(IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}


def log_to_stderr(settings: LogSettings | None = None) -> None:
    """Write the models' log lines to this process's standard error (or ``settings.file``), as
    tritonserver writes its log (a served replica: Ray keeps the worker's stderr in its ``worker-*.err``
    file; Serve replaces ``sys.stderr`` with a buffered logger of its own, so the original stream is
    used). Lines are Triton's form: level letter, date and time, process, the model file's line, the
    message. Each level shows as Triton's log flags say: INFO, WARNING and ERROR each on or off, verbose
    (Python's DEBUG) from level 1. Called again with changed settings (the logging extension), it
    replaces what it set before."""
    settings = settings or LogSettings()
    for logger_ in (_log, logging.getLogger("deployments")):
        for handler in [h for h in logger_.handlers if getattr(h, "_triton_stderr", False)]:
            logger_.removeHandler(handler)
            handler.close()
    _log.addHandler(_handler(settings, server=False))
    _log.setLevel(logging.DEBUG)
    _log.propagate = False  # not again through Serve's redirected stderr
    # the server's own warnings and errors in a replica (a model's execute raising, a failed load) too,
    # as tritonserver logs them: Serve keeps them in its replica files only, never in the server's log;
    # its info and debug lines only with verbose logging, but for the INFO lines tritonserver writes
    # too (``deployments.settings.TRITON_LINE``), which show as the INFO flag says
    server = logging.getLogger("deployments")
    server.addHandler(_handler(settings, server=True))
    server.setLevel(logging.DEBUG if settings.verbose_level > 0 else logging.INFO)  # INFO: Triton's lines


def shows(settings: LogSettings, level: int, server: bool = False) -> bool:
    """Whether a line at Python ``level`` is written under ``settings``: ERROR and WARNING as their
    flags say; INFO as ``info`` says (the server's own INFO lines only with verbose logging too);
    DEBUG (Triton's verbose) from verbose level 1."""
    if level >= logging.ERROR:
        return settings.error
    if level >= logging.WARNING:
        return settings.warning
    if level >= logging.INFO:
        return settings.info and (not server or settings.verbose_level > 0)
    return settings.verbose_level > 0


def _handler(settings: LogSettings, server: bool) -> logging.Handler:
    handler: logging.Handler
    if settings.file:
        handler = logging.FileHandler(settings.file, encoding="utf-8")  # appends: every replica, one file
    else:
        handler = logging.StreamHandler(sys.__stderr__ or sys.stderr)
    # a line tritonserver writes too shows as its flags say, wherever it comes from
    handler.addFilter(
        lambda record: shows(settings, record.levelno, server and not getattr(record, TRITON_LINE, False))
    )
    handler.setFormatter(TritonLogForm(iso8601=settings.format == "ISO8601", escape=settings.escape))
    setattr(handler, "_triton_stderr", True)  # noqa: B010 - marks ours, to replace it on a second call
    return handler


_LETTERS = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W"}  # verbose lines are I in Triton


class TritonLogForm(logging.Formatter):
    """Triton's two log line forms (docs/protocol/extension_logging.md), in UTC:
    ``default``: ``<L><mmdd> <HH:MM:SS.uuuuuu> <pid> <file>:<line>] <message>``;
    ``ISO8601``: ``<yyyy-mm-dd>T<HH:MM:SS>Z <L> <pid> <file>:<line>] <message>``.
    ``L`` is I, W or E (verbose lines are I, as in Triton). With ``escape`` (tritonserver's default) the
    message, a traceback included, is one JSON string: quoted, with its quotes, backslashes, tabs,
    newlines and other control characters escaped, so every record is one line that a log parser can
    trust (a message cannot forge a record of its own); without it the message is written as logged and
    a traceback follows on its own lines."""

    def __init__(self, iso8601: bool = False, escape: bool = True) -> None:
        super().__init__()
        self.iso8601 = iso8601
        self.escape = escape

    def format(self, record: logging.LogRecord) -> str:
        when = time.gmtime(record.created)
        letter = _LETTERS.get(record.levelno, "E" if record.levelno > logging.WARNING else "I")
        if self.iso8601:
            head = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', when)} {letter}"
        else:
            micros = int((record.created % 1) * 1_000_000)
            head = f"{letter}{time.strftime('%m%d %H:%M:%S', when)}.{micros:06d}"
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            message += "\n" + record.exc_text
        if self.escape:
            message = json.dumps(message, ensure_ascii=False)
        return f"{head} {record.process} {record.filename}:{record.lineno}] {message}"


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
