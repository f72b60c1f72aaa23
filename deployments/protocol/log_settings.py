"""Triton's logging extension: the checks of an update, and the server's current log settings.

An update names some of ``log_file``, ``log_info``, ``log_warning``, ``log_error``, ``log_verbose_level``
and ``log_format`` (other names are ignored, as Triton ignores them). Each front end checks the values
it decoded in Triton's order and with Triton's wording, which differs between HTTP (its JSON reader's
messages) and gRPC (the setting's expected type); the log file cannot be changed at run time. An
update that fails changes nothing (Triton keeps the settings it applied before the failing one).

:class:`LogBoard` holds the server's current settings (in the server application): an update applies
them in its own process at once and wakes every replica waiting in :meth:`LogBoard.wait`, which
returns as soon as the settings differ from those the replica applied (``deployments.serve.logs``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from typing import Any

from deployments.runtime.broadcast import Broadcast
from deployments.settings import LOG_FORMATS, LogSettings
from repository_loader.errors import InvalidArgument, Unsupported

FILE_FIXED = "log file location can not be updated through network protocol"
MAX_VERBOSE_LEVEL = 2**31 - 1  # tritonserver keeps the level as a 32-bit signed integer

# Triton's setting names, in the order it checks them, and the LogSettings field each sets
_FIELDS = (
    ("log_info", "info"),
    ("log_warning", "warning"),
    ("log_error", "error"),
    ("log_verbose_level", "verbose_level"),
    ("log_format", "format"),
)
_KINDS = {"info": bool, "warning": bool, "error": bool, "verbose_level": int, "format": str}
_HTTP_TYPE_ERRORS = {
    bool: "attempt to access JSON non-boolean as boolean",
    int: "attempt to access JSON non-unsigned-integer as unsigned-integer",
    str: "attempt to access JSON non-string as string",
}
_GRPC_TYPE_NAMES = {bool: "boolean", int: "int32", str: "string"}
_GRPC_CHOICES = {bool: "bool_param", int: "uint32_param", str: "string_param"}


def changes_from_json(document: Mapping[str, Any]) -> dict[str, Any]:
    """The changes a ``POST /v2/logging`` body asks for (``LogSettings`` field -> value); a null value
    changes nothing. Raises with the message tritonserver's HTTP front end gives."""
    if document.get("log_file") is not None:
        raise Unsupported(FILE_FIXED)
    changes: dict[str, Any] = {}
    for name, field in _FIELDS:
        value = document.get(name)
        if value is None:
            continue
        kind = _KINDS[field]
        if type(value) is not kind or (type(value) is int and value < 0):
            raise InvalidArgument(_HTTP_TYPE_ERRORS[kind])
        changes[field] = _checked(field, value, f"invalid argument for --{name}, got: {value}")
    return changes


def changes_from_grpc(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The changes a gRPC ``LogSettingsRequest.settings`` map asks for (each value a ``SettingValue``
    message). Raises with the message tritonserver's gRPC front end gives."""
    if "log_file" in settings:
        raise Unsupported(FILE_FIXED)
    changes: dict[str, Any] = {}
    for name, field in _FIELDS:
        if name not in settings:
            continue
        kind = _KINDS[field]
        choice = settings[name].WhichOneof("parameter_choice")
        if choice != _GRPC_CHOICES[kind]:
            raise InvalidArgument(f"expect {_GRPC_TYPE_NAMES[kind]} for '{name}'")
        value = getattr(settings[name], choice)
        changes[field] = _checked(field, value, f"invalid argument for {name}, got: {value}")
    return changes


def _checked(field: str, value: Any, bad_format: str) -> Any:
    if field == "format" and value not in LOG_FORMATS:
        raise InvalidArgument(bad_format)
    if field == "verbose_level" and value > MAX_VERBOSE_LEVEL:
        raise InvalidArgument(f"log_verbose_level must be at most {MAX_VERBOSE_LEVEL}, not {value}")
    return value


def grpc_setting_values(settings: LogSettings) -> dict[str, tuple[str, Any]]:
    """Every setting as a gRPC ``SettingValue``'s choice and value (``LogSettingsResponse``)."""
    return {name: (_GRPC_CHOICES[type(value)], value) for name, value in settings.to_json().items()}


class LogBoard:
    """The server's current log settings, changed by the logging extension.

    ``apply`` puts new settings into effect in this process; ``record`` (optional, blocking: it runs on
    a worker thread) keeps them where a restarted server finds them. Replicas follow the settings
    through :meth:`wait`. Updates and waits may come from different threads and event loops (a
    replica's HTTP and gRPC servers, its handle calls): a change wakes each waiter on its own loop.
    """

    def __init__(
        self,
        current: LogSettings,
        apply: Callable[[LogSettings], None] | None = None,
        record: Callable[[LogSettings], None] | None = None,
    ) -> None:
        self.current = current
        self._apply = apply
        self._record = record
        self._lock = threading.Lock()  # one change at a time, from any thread
        self._record_lock = threading.Lock()  # the latest settings are the last recorded
        self._changes = Broadcast()

    async def update(self, changes: Mapping[str, Any]) -> LogSettings:
        """Apply ``changes`` (checked ``LogSettings`` fields); the settings now in effect."""
        with self._lock:
            updated = self.current.changed(**changes)
            if updated == self.current:
                return updated
            if self._apply is not None:
                self._apply(updated)
            self.current = updated
        self._changes.notify()
        if self._record is not None:
            await asyncio.to_thread(self._record_latest)
        return updated

    def _record_latest(self) -> None:
        assert self._record is not None
        with self._record_lock:
            self._record(self.current)

    async def wait(self, applied: LogSettings | None, timeout_s: float) -> LogSettings | None:
        """The current settings once they differ from ``applied`` (at once where they already do;
        ``None`` applied: at once); None after ``timeout_s`` without a change."""
        if await self._changes.until(lambda: self.current != applied, timeout_s):
            return self.current
        return None
