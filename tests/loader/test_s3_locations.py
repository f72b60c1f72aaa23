"""Repository locations as Triton writes them, and gs:// / as:// through the same storage layer.

No server here: S3 against a real server is in ``test_s3.py``. For gs:// and as:// no local
server is available from the package registries, so their file system is a local folder
standing in for the bucket; what is checked is the layer's own part (parsing, paths inside the
file system, copying to the cache), not the Google or Azure clients.
"""

from __future__ import annotations

from pathlib import Path, PurePath

import pytest

from repository_loader import load_repository
from repository_loader.errors import ConfigError
from repository_loader.storage import (
    Location,
    default_cache_dir,
    filesystem_options,
    open_storage,
    parse_location,
)

from .conftest import TORCH_IO


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("s3://bucket/path/models", Location("s3://bucket/path/models", "s3", "bucket/path/models")),
        ("s3://bucket", Location("s3://bucket", "s3", "bucket")),
        (
            "s3://minio.local:9000/bucket/models/",
            Location("s3://minio.local:9000/bucket/models", "s3", "bucket/models", "http://minio.local:9000"),
        ),
        (
            "s3://10.0.0.5:9000/bucket",
            Location("s3://10.0.0.5:9000/bucket", "s3", "bucket", "http://10.0.0.5:9000"),
        ),
        (
            "s3://https://s3.example.com:443/bucket/models",
            Location(
                "s3://https://s3.example.com:443/bucket/models",
                "s3",
                "bucket/models",
                "https://s3.example.com:443",
            ),
        ),
        (
            "s3://http://store.example.com/bucket/m",
            Location("s3://http://store.example.com/bucket/m", "s3", "bucket/m", "http://store.example.com"),
        ),
        ("gs://bucket/models", Location("gs://bucket/models", "gcs", "bucket/models")),
        (
            "as://acct/container/models",
            Location("as://acct/container/models", "abfs", "container/models", account="acct"),
        ),
        ("/srv/models", Location("/srv/models", "", "/srv/models")),
    ],
)
def test_locations_as_triton_writes_them(text: str, expected: Location) -> None:
    assert parse_location(text) == expected


@pytest.mark.parametrize(
    "url",
    ["s3://bucket/models", "s3://127.0.0.1:9000/bucket/models", "s3://https://host:443/bucket/m", "gs://b/m"],
)
def test_a_url_that_went_through_pathlib_is_read_as_the_url(url: str) -> None:
    assert str(PurePath(url)) != url  # pathlib drops a slash
    assert parse_location(PurePath(url)) == parse_location(url)


@pytest.mark.parametrize("text", ["s3://host:9000", "s3://host:9000/", "as://account", "gs://"])
def test_a_location_without_bucket_is_refused(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_location(text)


def test_filesystem_options() -> None:
    assert filesystem_options(parse_location("s3://bucket/m"), {}) == {"skip_instance_cache": True}
    assert filesystem_options(parse_location("s3://h:9/bucket/m"), {})["endpoint_url"] == "http://h:9"
    azure = filesystem_options(parse_location("as://acct/c/m"), {"AZURE_STORAGE_KEY": "k"})
    assert azure["account_name"] == "acct" and azure["account_key"] == "k"


def test_cache_dir_follows_triton_mount_directory_variables(tmp_path: Path) -> None:
    assert default_cache_dir("s3", {"TRITON_AWS_MOUNT_DIRECTORY": str(tmp_path)}) == tmp_path
    assert default_cache_dir("gcs", {"TRITON_GCS_MOUNT_DIRECTORY": str(tmp_path)}) == tmp_path
    assert default_cache_dir("abfs", {"TRITON_AZURE_MOUNT_DIRECTORY": str(tmp_path)}) == tmp_path
    assert default_cache_dir("s3", {"TRITON_GCS_MOUNT_DIRECTORY": str(tmp_path)}) != tmp_path


@pytest.mark.parametrize(
    ("url", "protocol", "inside"),
    [
        ("gs://bucket/models", "gcs", "bucket/models"),
        ("as://acct/container/models", "abfs", "container/models"),
    ],
)
def test_gs_and_as_go_through_the_same_layer(
    url: str, protocol: str, inside: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fsspec
    from fsspec.implementations.dirfs import DirFileSystem

    store = tmp_path / "store"
    model = store / inside / "m"
    (model / "1").mkdir(parents=True)
    (model / "2").mkdir()
    (model / "config.pbtxt").write_text(TORCH_IO)
    (model / "1" / "model.pt").write_bytes(b"old")
    (model / "2" / "model.pt").write_bytes(b"new")
    seen: list[tuple[str, dict[str, object]]] = []

    def filesystem(name: str, **options: object) -> DirFileSystem:
        seen.append((name, options))
        return DirFileSystem(path=str(store))

    monkeypatch.setattr(fsspec, "filesystem", filesystem)
    state = load_repository(url, cache_dir=tmp_path / "cache")
    assert state.root == url and seen[0][0] == protocol
    described = state.models["m"]
    assert described.path.is_relative_to(tmp_path / "cache") and described.path.name == "m"
    assert described.model_file(2).read_bytes() == b"new" and not (described.path / "1").exists()


@pytest.mark.parametrize(("url", "package"), [("gs://bucket/m", "gcsfs"), ("as://acct/container/m", "adlfs")])
def test_missing_client_package_is_named(url: str, package: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import fsspec

    def missing(protocol: str, **_: object) -> None:
        raise ImportError(f"Install {package} to access {protocol}")

    monkeypatch.setattr(fsspec, "filesystem", missing)
    with pytest.raises(ConfigError, match=f"needs the {package} package"):
        open_storage(url)
