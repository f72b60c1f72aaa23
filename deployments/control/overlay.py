"""Triton's load overrides, and the temporary repositories a model is read from with them.

A repository API load may carry a ``config`` (a JSON object, or its text) and
``file:<version>/<name>`` contents (base64; refused unless
``allow_model_file_upload``). :class:`Overlays` writes each such load as a
one-model repository below one temporary folder, and the model is read and served
from there. A folder lives while a loaded model is described from it: the model
unloaded, or loaded again without the override or with another, its folder is
removed (:meth:`Overlays.retain`), and the controller's stop removes them all.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from repository_loader.errors import InvalidArgument

_FILE_KEY = re.compile(r"file:([0-9]+/[A-Za-z0-9_.\-]+(?:/[A-Za-z0-9_.\-]+)*)")
PREFIX = "triton-serve-overrides-"


_BARE_KEY = re.compile(r"([{,]\s*)([A-Za-z_][A-Za-z0-9_]*)(\s*:)")


def _config_json(text: str | bytes) -> Any:
    """The ``config`` parameter's JSON, read as Triton reads it: protobuf's JSON parser also takes an
    object key without quotes (``{ direct: { } }``, as Triton's own tests send). Keys are quoted only
    outside string values."""
    raw = text.decode() if isinstance(text, bytes) else text
    try:
        return json.loads(raw)
    except ValueError as first:
        pieces = re.split(r'("(?:[^"\\]|\\.)*")', raw)  # string literals at the odd indices
        quoted = "".join(
            piece if i % 2 else _BARE_KEY.sub(r'\1"\2"\3', piece) for i, piece in enumerate(pieces)
        )
        if quoted == raw:
            raise first from None
        try:
            return json.loads(quoted)
        except ValueError:
            raise first from None


def parse_overrides(
    parameters: Mapping[str, Any], allow_upload: bool
) -> tuple[dict[str, Any] | None, dict[str, bytes]]:
    """Triton's load parameters: the ``config`` object (None: none given) and the files by
    ``<version>/<name>``; other parameters are ignored."""
    config: dict[str, Any] | None = None
    files: dict[str, bytes] = {}
    for key, value in parameters.items():
        if key == "config":
            try:
                doc = _config_json(value) if isinstance(value, (str, bytes)) else value
            except ValueError as exc:
                raise InvalidArgument(f"failed to parse the 'config' parameter as JSON: {exc}") from None
            if not isinstance(doc, dict):
                raise InvalidArgument("the 'config' parameter must be a JSON object")
            config = doc
        elif key.startswith("file:"):
            if not allow_upload:
                raise InvalidArgument(
                    "loading model files through the repository API is not allowed on this server "
                    "(start it with allow_model_file_upload)"
                )
            match = _FILE_KEY.fullmatch(key)
            if match is None or ".." in key.split("/"):
                raise InvalidArgument(
                    f"invalid file parameter '{key[:80]}': expected 'file:<version>/<name>'"
                )
            try:
                files[match.group(1)] = base64.b64decode(str(value), validate=True)
            except (binascii.Error, ValueError):
                raise InvalidArgument(f"the '{key[:80]}' parameter is not base64 content") from None
    return config, files


class Overlays:
    """The override repositories, numbered folders below one temporary folder (``root``, made on
    the first override and removed when no override is left)."""

    def __init__(self) -> None:
        self.root: Path | None = None
        self._count = 0

    def write(
        self, name: str, config: dict[str, Any], files: Mapping[str, bytes], source: Path | None
    ) -> Path:
        """A one-model repository: the override config, and ``files`` or else the entries of the
        model's own folder ``source`` (linked, not copied). Returns the repository's folder."""
        from repository_loader.config import config_from_json, config_to_text

        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix=PREFIX)).resolve()
        self._count += 1
        folder = self.root / str(self._count)
        target = folder / name
        target.mkdir(parents=True)
        parsed = config_from_json(config, "the 'config' parameter")
        parsed.name = parsed.name or name
        (target / "config.pbtxt").write_text(config_to_text(parsed))
        if files:
            for rel, data in files.items():
                path = target / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            return folder
        assert source is not None
        for child in source.iterdir():
            if child.name not in ("config.pbtxt", "configs", "__pycache__"):
                (target / child.name).symlink_to(child, target_is_directory=child.is_dir())
        return folder

    def retain(self, used: Iterable[Path]) -> None:
        """Remove every override repository but those ``used`` names (the temporary folder too when
        none is left). Links are removed, never what they point to."""
        if self.root is None or not self.root.is_dir():
            self.root = None
            return
        keep = {path.resolve() for path in used}
        for folder in list(self.root.iterdir()):
            if folder.resolve() not in keep:
                shutil.rmtree(folder, ignore_errors=True)
        if not any(self.root.iterdir()):
            self.close()

    def close(self) -> None:
        """Remove every override repository."""
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
