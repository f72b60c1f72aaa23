"""The shared server's Serve logs outlive the test session where ``TRITON_SERVE_TEST_LOGS`` asks."""

from __future__ import annotations

import os
from pathlib import Path

from tests.serve.conftest import keep_logs


def _ray_folder(root: Path) -> Path:
    serve = root / "session_2026" / "logs" / "serve"
    serve.mkdir(parents=True)
    (serve / "replica_triton_server_x.log").write_text("started\n")
    (serve.parent / "worker-ab-01000000-7.err").write_text("model 'm' is unavailable: why\n")
    (serve.parent / "worker-ab-01000000-8.out").write_text("")  # empty: not copied
    (root / "session_latest").symlink_to(root / "session_2026")
    return root


def test_the_serve_logs_are_copied_under_the_sessions_pid(tmp_path: Path) -> None:
    ray_tmp = _ray_folder(tmp_path / "ray")
    kept = keep_logs(ray_tmp, str(tmp_path / "kept"))
    assert kept == tmp_path / "kept" / f"session-{os.getpid()}"
    assert (kept / "replica_triton_server_x.log").read_text() == "started\n"
    assert [f.name for f in (kept / "workers").iterdir()] == ["worker-ab-01000000-7.err"]


def test_nothing_is_copied_unless_asked_or_where_ray_wrote_no_logs(tmp_path: Path) -> None:
    assert keep_logs(_ray_folder(tmp_path / "ray"), "") is None
    assert keep_logs(tmp_path / "no-ray", str(tmp_path / "kept")) is None
    assert not (tmp_path / "kept").exists()
