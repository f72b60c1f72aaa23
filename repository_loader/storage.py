"""Where a model repository lives: a local folder, or ``s3://`` / ``gs://`` through fsspec.

The loader reads through :class:`Storage` only. Remote model folders are copied
into a local cache before a model is described, as Triton does, so every
:class:`~repository_loader.model.ModelDescription` points at a local path.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any, Protocol

from repository_loader.errors import ConfigError, NotFound

REMOTE_SCHEMES = ("s3://", "gs://", "gcs://")

_FSSPEC_PROTOCOL = {"s3://": "s3", "gs://": "gcs", "gcs://": "gcs"}
_FSSPEC_PACKAGE = {"s3": "s3fs", "gcs": "gcsfs"}


class Storage(Protocol):
    """The few file operations the loader needs, on paths given as strings."""

    def join(self, base: str, *parts: str) -> str: ...

    def is_dir(self, path: str) -> bool: ...

    def is_file(self, path: str) -> bool: ...

    def list_dir(self, path: str) -> list[str]:
        """Names (not paths) of the entries of ``path``, sorted."""
        ...

    def read_bytes(self, path: str) -> bytes: ...

    def localize(self, path: str) -> Path:
        """A local folder holding the content of ``path`` (itself, when already local)."""
        ...


def _read_error(path: str, exc: OSError) -> ConfigError:
    reason = exc.strerror or type(exc).__name__
    return ConfigError(f"cannot read '{path}': {reason}")


class LocalStorage:
    """A repository on the local file system."""

    def join(self, base: str, *parts: str) -> str:
        return os.path.join(base, *parts)

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path)

    def is_file(self, path: str) -> bool:
        return os.path.isfile(path)

    def list_dir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except OSError as exc:
            raise _read_error(path, exc) from None

    def read_bytes(self, path: str) -> bytes:
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise _read_error(path, exc) from None

    def localize(self, path: str) -> Path:
        return Path(path).resolve()


class FsspecStorage:
    """A repository in object storage, read through an fsspec file system."""

    def __init__(self, fs: Any, scheme: str, cache_dir: Path | None = None) -> None:
        self._fs = fs
        self._scheme = scheme
        self._cache = cache_dir or Path(tempfile.gettempdir()) / "triton-serve-repository-cache"

    def _strip(self, path: str) -> str:
        for prefix in REMOTE_SCHEMES:
            if path.startswith(prefix):
                return path[len(prefix) :]
        return path

    def join(self, base: str, *parts: str) -> str:
        return "/".join([base.rstrip("/"), *parts])

    def is_dir(self, path: str) -> bool:
        return bool(self._fs.isdir(self._strip(path)))

    def is_file(self, path: str) -> bool:
        return bool(self._fs.isfile(self._strip(path)))

    def list_dir(self, path: str) -> list[str]:
        try:
            entries = self._fs.ls(self._strip(path), detail=False)
        except OSError as exc:
            raise _read_error(path, exc) from None
        return sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in entries)

    def read_bytes(self, path: str) -> bytes:
        try:
            return bytes(self._fs.cat_file(self._strip(path)))
        except OSError as exc:
            raise _read_error(path, exc) from None

    def localize(self, path: str) -> Path:
        digest = hashlib.sha256(path.encode()).hexdigest()[:16]
        target = self._cache / digest / path.rstrip("/").rsplit("/", 1)[-1]
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            self._fs.get(self._strip(path).rstrip("/") + "/", str(target), recursive=True)
        return target


def is_remote(location: str) -> bool:
    return location.startswith(REMOTE_SCHEMES)


def open_storage(location: str | Path) -> tuple[Storage, str]:
    """The storage holding ``location`` and the repository root within it.

    Raises :class:`NotFound` when a local repository does not exist and
    :class:`ConfigError` when a remote one needs a package that is not installed.
    """
    text = str(location)
    if is_remote(text):
        return _open_remote(text), text.rstrip("/")
    path = Path(text).expanduser()
    if not path.exists():
        raise NotFound(f"model repository '{text}' does not exist")
    if not path.is_dir():
        raise NotFound(f"model repository '{text}' is not a folder")
    return LocalStorage(), str(path.resolve())


def _open_remote(location: str) -> FsspecStorage:
    scheme = next(p for p in REMOTE_SCHEMES if location.startswith(p))
    protocol = _FSSPEC_PROTOCOL[scheme]
    try:
        import fsspec
    except ImportError:
        raise ConfigError(
            f"model repository '{location}' needs the fsspec package (pip install fsspec "
            f"{_FSSPEC_PACKAGE[protocol]})"
        ) from None
    try:
        fs = fsspec.filesystem(protocol)
    except (ImportError, ValueError) as exc:
        raise ConfigError(
            f"model repository '{location}' needs the {_FSSPEC_PACKAGE[protocol]} package "
            f"(pip install {_FSSPEC_PACKAGE[protocol]}): {exc}"
        ) from None
    storage = FsspecStorage(fs, scheme)
    if not storage.is_dir(location):
        raise NotFound(f"model repository '{location}' does not exist")
    return storage
