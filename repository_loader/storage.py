"""Where a model repository lives: a local folder, or object storage through fsspec.

Locations are written as Triton writes them:

- ``/path/to/repository`` (a local folder);
- ``s3://bucket/path`` (AWS S3, or the endpoint ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` names),
  ``s3://host:port/bucket/path`` (an S3-compatible server over HTTP) and
  ``s3://https://host:port/bucket/path`` (the same over HTTPS);
- ``gs://bucket/path`` (Google Cloud Storage);
- ``as://account/container/path`` (Azure Storage).

Credentials come from where each client library looks for them (for S3: ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_DEFAULT_REGION``, then the shared AWS files),
plus Triton's ``AZURE_STORAGE_ACCOUNT`` / ``AZURE_STORAGE_KEY`` for Azure.

The loader reads configs and listings through :class:`Storage`. Backends need local files, so a
remote model folder is copied to a local cache before the model is described, as Triton copies a
cloud repository to a local folder: only the version folders the version policy selects, into
``<cache>/<repository digest>/<model>/<content digest>/<model>/``. The content digest covers each
file's path, size and ETag, so a changed file lands in a new folder (replicas still running the
old copy keep it), an unchanged model is never downloaded twice, and every node computes the
same local path. A copy is written to a temporary folder and renamed into place, so concurrent
loaders never see half a model. The cache root is ``TRITON_AWS_MOUNT_DIRECTORY`` /
``TRITON_GCS_MOUNT_DIRECTORY`` / ``TRITON_AZURE_MOUNT_DIRECTORY`` where set (Triton's names), else
a per-user folder under the system's temporary folder.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, Protocol

from repository_loader.errors import ConfigError, NotFound

# URL scheme -> fsspec protocol, and the package that provides it.
_PROTOCOL = {"s3": "s3", "gs": "gcs", "gcs": "gcs", "as": "abfs"}
_PACKAGE = {"s3": "s3fs", "gcs": "gcsfs", "abfs": "adlfs"}
_MOUNT_DIRECTORY = {
    "s3": "TRITON_AWS_MOUNT_DIRECTORY",
    "gcs": "TRITON_GCS_MOUNT_DIRECTORY",
    "abfs": "TRITON_AZURE_MOUNT_DIRECTORY",
}
REMOTE_SCHEMES = tuple(f"{scheme}://" for scheme in _PROTOCOL)

# s3://[http(s)://]host:port/bucket/path (Triton's form for a private S3 endpoint).
_S3_ENDPOINT = re.compile(
    r"^s3://(?:(?P<scheme>https?)://(?P<host>[^/]+)|(?P<hostport>[^/:]+:\d+))/(?P<path>.*)$"
)
# A URL that went through pathlib lost one slash: PurePath("s3://b/m") is "s3:/b/m".
_MANGLED = re.compile(r"^(s3|gs|gcs|as):/(?!/)")


@dataclass(frozen=True)
class Location:
    """A parsed repository location."""

    url: str  # as the user wrote it, without a trailing slash: shown in messages and state.root
    protocol: str  # "" for a local folder, else the fsspec protocol ("s3", "gcs", "abfs")
    root: str  # the repository's path inside the file system ("bucket/path"; a local absolute path)
    endpoint: str = ""  # S3: "http(s)://host:port" when the URL names a server
    account: str = ""  # Azure: the storage account

    @property
    def is_remote(self) -> bool:
        return bool(self.protocol)


def parse_location(location: str | PurePath) -> Location:
    """Split a repository location into file system, endpoint and path; nothing is contacted."""
    text = str(location)
    if isinstance(location, PurePath) and _MANGLED.match(text):
        text = _MANGLED.sub(r"\1://", text, count=1)
        text = re.sub(r"^s3://(https?):/(?!/)", r"s3://\1://", text)
    if not is_remote(text):
        return Location(text, "", text)
    scheme, rest = text.split("://", 1)
    rest = rest.rstrip("/")
    url = f"{scheme}://{rest}"
    protocol = _PROTOCOL[scheme]
    if scheme == "s3":
        match = _S3_ENDPOINT.match(url + "/")
        if match:
            endpoint = f"{match['scheme'] or 'http'}://{match['host'] or match['hostport']}"
            return Location(url, protocol, _require_path(url, match["path"]), endpoint=endpoint)
    if scheme == "as":
        account, _, path = rest.partition("/")
        if not account or not path:
            raise ConfigError(f"model repository '{url}': expected as://account/container/path")
        return Location(url, protocol, path, account=account)
    return Location(url, protocol, _require_path(url, rest))


def _require_path(url: str, path: str) -> str:
    if not path.strip("/"):
        raise ConfigError(f"model repository '{url}' names no bucket")
    return path.strip("/")


def is_remote(location: str) -> bool:
    return location.startswith(REMOTE_SCHEMES)


class Storage(Protocol):
    """The few file operations the loader needs, on paths given as strings."""

    def join(self, base: str, *parts: str) -> str: ...

    def is_dir(self, path: str) -> bool: ...

    def is_file(self, path: str) -> bool: ...

    def list_dir(self, path: str) -> list[str]:
        """Names (not paths) of the entries of ``path``, sorted."""
        ...

    def read_bytes(self, path: str) -> bytes: ...

    def stat_tree(self, path: str) -> dict[str, str]:
        """Every entry under ``path`` by relative POSIX path (folders end in '/'), with a signature
        that changes when the entry's content does (size and mtime locally, size and ETag remotely)."""
        ...

    def localize(self, path: str, exclude: Collection[str] = ()) -> Path:
        """A local folder holding the content of ``path`` (itself, when already local), without
        the top-level entries named in ``exclude``."""
        ...


def _read_error(path: str, exc: OSError) -> ConfigError:
    reason = exc.strerror or str(exc) or type(exc).__name__
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

    def stat_tree(self, path: str) -> dict[str, str]:
        tree: dict[str, str] = {}
        for folder, dirs, files in os.walk(path):
            rel = Path(folder).relative_to(path).as_posix()
            prefix = "" if rel == "." else f"{rel}/"
            for name in dirs:
                tree[f"{prefix}{name}/"] = "dir"
            for name in files:
                try:
                    st = os.stat(os.path.join(folder, name))
                except OSError:
                    continue  # removed while walking
                tree[f"{prefix}{name}"] = f"{st.st_size}:{st.st_mtime_ns}"
        return tree

    def localize(self, path: str, exclude: Collection[str] = ()) -> Path:
        return Path(path).resolve()


class FsspecStorage:
    """A repository in object storage, read through an fsspec file system.

    Paths given to and returned by this class are URLs under ``location.url``; the file
    system sees them as paths under ``location.root``.
    """

    def __init__(self, fs: Any, location: Location, cache_dir: Path) -> None:
        self._fs = fs
        self._location = location
        self._cache = cache_dir

    def _fs_path(self, path: str) -> str:
        url, root = self._location.url, self._location.root
        if path == url or path.startswith(url + "/"):
            return root + path[len(url) :]
        return path

    def join(self, base: str, *parts: str) -> str:
        return "/".join([base.rstrip("/"), *parts])

    def is_dir(self, path: str) -> bool:
        return bool(self._fs.isdir(self._fs_path(path)))

    def is_file(self, path: str) -> bool:
        return bool(self._fs.isfile(self._fs_path(path)))

    def list_dir(self, path: str) -> list[str]:
        try:
            entries = self._fs.ls(self._fs_path(path), detail=False)
        except OSError as exc:
            raise _read_error(path, exc) from None
        return sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in entries)

    def read_bytes(self, path: str) -> bytes:
        try:
            return bytes(self._fs.cat_file(self._fs_path(path)))
        except OSError as exc:
            raise _read_error(path, exc) from None

    def _infos(self, path: str) -> dict[str, dict[str, Any]]:
        """Every entry under ``path`` (one recursive listing), by relative path; folders end in '/'."""
        base = self._fs_path(path).strip("/")
        try:
            found = self._fs.find(base, detail=True, withdirs=True)
        except OSError as exc:
            raise _read_error(path, exc) from None
        infos: dict[str, dict[str, Any]] = {}
        for name, info in found.items():
            if not name.strip("/").startswith(base + "/"):
                continue  # the folder itself, or a sibling sharing its prefix
            rel = name.strip("/")[len(base) + 1 :].strip("/")
            if info.get("type") == "directory":
                infos[rel + "/"] = info
            else:
                infos[rel] = info
                parts = rel.split("/")[:-1]  # stores without folder objects imply them
                for i in range(1, len(parts) + 1):
                    infos.setdefault("/".join(parts[:i]) + "/", {"type": "directory"})
        return infos

    def stat_tree(self, path: str) -> dict[str, str]:
        return {rel: _signature(rel, info) for rel, info in self._infos(path).items()}

    def localize(self, path: str, exclude: Collection[str] = ()) -> Path:
        infos = {rel: info for rel, info in self._infos(path).items() if rel.split("/", 1)[0] not in exclude}
        name = path.rstrip("/").rsplit("/", 1)[-1]
        digest = _digest(sorted((rel, _signature(rel, info)) for rel, info in infos.items()))
        folder = self._cache / _digest(self._location.url)[:16] / name / digest[:24]
        if (folder / name).is_dir():
            return folder / name
        partial = folder.parent / f".partial-{digest[:24]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            self._download(path, infos, partial / name)
            try:
                os.rename(partial, folder)
            except OSError:
                if not (folder / name).is_dir():  # else another loader finished first
                    raise
        except OSError as exc:
            raise ConfigError(f"cannot copy '{path}' to '{folder}': {exc}") from None
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        return folder / name

    def _download(self, path: str, infos: Mapping[str, Mapping[str, Any]], target: Path) -> None:
        target.mkdir(parents=True)
        for rel in (r for r in infos if r.endswith("/")):
            (target / rel).mkdir(parents=True, exist_ok=True)
        files = sorted(r for r in infos if not r.endswith("/"))
        if files:
            base = self._fs_path(path).strip("/")
            self._fs.get([f"{base}/{rel}" for rel in files], [str(target / rel) for rel in files])
        for rel in files:
            expected, got = infos[rel].get("size"), (target / rel).stat().st_size
            if expected is not None and int(expected) != got:
                raise OSError(f"'{rel}': {got} bytes copied of {expected}")


def _signature(rel: str, info: Mapping[str, Any]) -> str:
    if rel.endswith("/"):
        return "dir"
    for key in ("ETag", "etag", "generation", "md5Hash", "content_settings", "LastModified", "mtime"):
        if info.get(key) is not None:
            return f"{info.get('size')}:{info[key]}"
    return f"{info.get('size')}:"


def _digest(value: object) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()


def default_cache_dir(protocol: str, environ: Mapping[str, str] | None = None) -> Path:
    """Where remote model folders are copied: Triton's mount-directory variable, else a temp folder."""
    environ = os.environ if environ is None else environ
    mount = environ.get(_MOUNT_DIRECTORY.get(protocol, ""), "")
    if mount:
        return Path(mount)
    user = os.getuid() if hasattr(os, "getuid") else "user"
    return Path(tempfile.gettempdir()) / f"triton-serve-{user}" / "repositories"


def filesystem_options(location: Location, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Keyword arguments for the location's fsspec file system (a fresh instance: no stale listings)."""
    environ = os.environ if environ is None else environ
    options: dict[str, Any] = {"skip_instance_cache": True}
    if location.endpoint:
        options["endpoint_url"] = location.endpoint
    if location.account:
        options["account_name"] = location.account
        if environ.get("AZURE_STORAGE_KEY"):
            options["account_key"] = environ["AZURE_STORAGE_KEY"]
    return options


def open_storage(location: str | PurePath, cache_dir: str | Path | None = None) -> tuple[Storage, str]:
    """The storage holding ``location`` and the repository root within it.

    Raises :class:`NotFound` when the repository does not exist and :class:`ConfigError` when a
    remote one cannot be reached or needs a package that is not installed.
    """
    parsed = parse_location(location)
    if parsed.is_remote:
        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir(parsed.protocol)
        return _open_remote(parsed, cache), parsed.url
    path = Path(parsed.url).expanduser()
    if not path.exists():
        raise NotFound(f"model repository '{parsed.url}' does not exist")
    if not path.is_dir():
        raise NotFound(f"model repository '{parsed.url}' is not a folder")
    return LocalStorage(), str(path.resolve())


def _open_remote(location: Location, cache_dir: Path) -> FsspecStorage:
    package = _PACKAGE[location.protocol]
    try:
        import fsspec
    except ImportError:
        raise ConfigError(
            f"model repository '{location.url}' needs the fsspec package (pip install fsspec {package})"
        ) from None
    try:
        fs = fsspec.filesystem(location.protocol, **filesystem_options(location))
    except (ImportError, ValueError) as exc:
        raise ConfigError(
            f"model repository '{location.url}' needs the {package} package (pip install {package}): {exc}"
        ) from None
    try:
        found = fs.isdir(location.root)
    except PermissionError as exc:
        raise ConfigError(
            f"model repository '{location.url}': {exc.strerror or exc} (check the credentials in the environment)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"model repository '{location.url}': {exc.strerror or exc}") from None
    if not found:
        if _access_denied(fs, location.root):
            raise ConfigError(
                f"model repository '{location.url}': access denied (check the credentials in the environment)"
            )
        raise NotFound(f"model repository '{location.url}' does not exist")
    return FsspecStorage(fs, location, cache_dir)


def _access_denied(fs: Any, root: str) -> bool:
    """Whether listing the bucket is refused (some clients answer 'not a folder' to that)."""
    try:
        fs.ls(root.split("/", 1)[0], detail=False)
    except PermissionError:
        return True
    except OSError:
        return False
    return False


def repository_snapshot(location: str | PurePath) -> dict[str, dict[str, str]]:
    """Per model folder of the repository, :meth:`Storage.stat_tree` of it: one recursive listing.

    What a poller compares between two scans: a model whose entries or signatures differ changed
    (a version folder added or removed, a config edited, a model file replaced).
    """
    storage, root = open_storage(location)
    models: dict[str, dict[str, str]] = {}
    for rel, signature in storage.stat_tree(root).items():
        if "__pycache__" in rel.split("/"):
            continue  # written by importing a model.py, not by the operator
        model, sep, inner = rel.partition("/")
        if sep and inner:
            models.setdefault(model, {})[inner] = signature
        elif sep:
            models.setdefault(model, {})
    return models
