"""Model hosts in poll mode (docs/hosts.md): a pooled model's changed configuration reaches the host,
which loads it anew on its next request, with no failed request. A server of its own, in a module of its
own: two standalone servers at once would share HAProxy's stats ports."""

from __future__ import annotations

import shutil
import time

import pytest

from tests.serve.standalone import Server
from tests.serve.test_model_hosts import MODEL_PY, _config, _http, _infer_http


def test_poll_reloads_a_changed_pooled_model_without_failing_requests(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The client keeps calling the model while its configuration changes; a removed model goes."""
    repo = tmp_path_factory.mktemp("hosts_poll") / "repo"
    for name, add in (("polled", 1), ("removed", 2)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(MODEL_PY)
        (repo / name / "config.pbtxt").write_text(_config(name, add, 1))
    srv = Server(
        repo,
        args={
            "model_control_mode": "poll",
            "repository_poll_secs": 1,
            "model_hosts": 1,
            "model_host_cpus": 0.2,
        },
    )
    try:
        srv.wait_ready(["polled", "removed"])
        client = _http(srv)
        assert _infer_http(client, "polled") == 2.0
        seen: list[float] = []
        (repo / "polled" / "config.pbtxt").write_text(_config("polled", 10, 1))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            seen.append(_infer_http(client, "polled"))  # raises on any failed request
            if seen[-1] == 11.0:
                break
            time.sleep(0.2)
        assert seen[-1] == 11.0, seen[-5:]
        assert set(seen) <= {2.0, 11.0} and seen == sorted(seen)  # old answers, then new ones only
        shutil.rmtree(repo / "removed")
        deadline = time.monotonic() + 60
        while client.is_model_ready("removed") and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not client.is_model_ready("removed")
        assert _infer_http(client, "polled") == 11.0
    finally:
        srv.close()
