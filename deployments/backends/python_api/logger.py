"""``pb_utils.Logger``: a model's log lines, named after the model that writes them.

Lines go to the Python logger ``triton_python_backend``; in a served replica
:func:`log_to_stderr` writes them to standard error in tritonserver's form.
"""

from __future__ import annotations

import logging
import sys
from enum import IntEnum
from typing import Any

from deployments.backends.python_api.context import current_model_name

_log = logging.getLogger("triton_python_backend")


class _LogLevel(IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}


def log_to_stderr() -> None:
    """Write the models' log lines to this process's standard error, as tritonserver writes its log
    (a served replica: Ray keeps the worker's stderr in its ``worker-*.err`` file; Serve replaces
    ``sys.stderr`` with a buffered logger of its own, so the original stream is used). Lines are
    Triton's form: level letter, date and time, process, the model file's line, the message. INFO and
    above, as tritonserver without ``--log-verbose``."""
    if any(getattr(h, "_triton_stderr", False) for h in _log.handlers):
        return
    _log.addHandler(_stderr_handler(logging.INFO))
    _log.setLevel(logging.INFO)
    _log.propagate = False  # not again through Serve's redirected stderr
    # the server's own warnings and errors in a replica (a model's execute raising, a failed load) too,
    # as tritonserver logs them: Serve keeps them in its replica files only, never in the server's log
    server = logging.getLogger("deployments")
    server.addHandler(_stderr_handler(logging.WARNING))


def _stderr_handler(level: int) -> logging.Handler:
    handler = logging.StreamHandler(sys.__stderr__ or sys.stderr)
    handler.setLevel(level)
    handler.setFormatter(
        logging.Formatter(
            "%(levelname).1s%(asctime)s %(process)d %(filename)s:%(lineno)d] %(message)s", "%m%d %H:%M:%S"
        )
    )
    handler._triton_stderr = True  # type: ignore[attr-defined]
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
