"""Triton's logging extension on the shared server, with the real tritonclient (HTTP and gRPC): the
settings read and change on either protocol, with Triton's errors, and a change reaches the model
replicas' logs, of a replica already running and of one started after it."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.serve

DEFAULTS = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}
RESET = {k: v for k, v in DEFAULTS.items() if k != "log_file"}
LOGGER_MODEL = Path(__file__).resolve().parents[1] / "backends" / "python_models" / "logger_api"


@pytest.fixture
def http(server_url: str) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server_url)
    yield client
    client.update_log_settings(RESET)  # the server is shared: its settings as the other tests expect
    _until_logged(client, "logger_api", "info", without="verbose")  # the reset reached the replicas
    client.close()


def _grpc_settings(answer: grpcclient.service_pb2.LogSettingsResponse) -> dict[str, object]:
    return {name: getattr(v, v.WhichOneof("parameter_choice")) for name, v in answer.settings.items()}


def _log_lines(pid: int, marker: str) -> list[str]:
    """Lines with ``marker`` in Ray's log files of the replica process ``pid`` (its stderr is one)."""
    logs = Path(os.readlink(f"/proc/{pid}/fd/2")).parent
    return [
        line
        for f in logs.glob(f"worker-*-{pid}.*")
        for line in f.read_text(errors="replace").splitlines()
        if marker in line
    ]


def _log_through(client: httpclient.InferenceServerClient, model: str) -> tuple[int, str]:
    """Have ``model`` (logger_api's code) log a fresh token at every level; its pid and the token."""
    token = f"logged-{uuid.uuid4().hex}"
    text = httpclient.InferInput("TEXT", [1], "BYTES")
    text.set_data_from_numpy(np.array([token.encode()], np.object_))
    result = client.infer(model, [text])
    return int(result.as_numpy("PID")[0]), token


def _until_logged(
    client: httpclient.InferenceServerClient,
    model: str,
    level: str,
    without: str = "",
    timeout_s: float = 30.0,
) -> tuple[int, list[str]]:
    """Log tokens through ``model`` until one shows at ``level`` (and not at ``without``) in its
    replica's log: a change of the settings reaches a replica a moment after it is answered. That
    replica's pid and the token's lines."""
    deadline = time.monotonic() + timeout_s
    while True:
        pid, token = _log_through(client, model)
        settle = time.monotonic() + 2.0  # Ray writes the worker's stderr to its file as it comes
        while time.monotonic() < settle:
            lines = _log_lines(pid, token)
            if any(f"{token} {level}" in line for line in lines):
                if not without or not any(f"{token} {without}" in line for line in lines):
                    return pid, lines
                break
            time.sleep(0.1)
        assert time.monotonic() < deadline, f"model '{model}' does not log {level} lines as asked"


def test_settings_read_and_change_on_both_protocols(
    http: httpclient.InferenceServerClient, grpc_url: str
) -> None:
    assert "logging" in http.get_server_metadata()["extensions"]
    assert http.get_log_settings() == DEFAULTS
    with grpcclient.InferenceServerClient(grpc_url) as grpc:
        assert "logging" in grpc.get_server_metadata().extensions
        assert _grpc_settings(grpc.get_log_settings()) == DEFAULTS
        changed = http.update_log_settings({"log_warning": False, "log_verbose_level": 2})
        assert changed == {**DEFAULTS, "log_warning": False, "log_verbose_level": 2}
        assert _grpc_settings(grpc.get_log_settings()) == changed  # one server state behind both
        answer = grpc.update_log_settings({"log_warning": True, "log_format": "ISO8601"})
        assert _grpc_settings(answer) == {**changed, "log_warning": True, "log_format": "ISO8601"}
        for client in (http, grpc):
            with pytest.raises(InferenceServerException, match="log file location can not be updated"):
                client.update_log_settings({"log_file": "elsewhere.log"})
        with pytest.raises(InferenceServerException, match="invalid argument for log_format, got: json"):
            grpc.update_log_settings({"log_format": "json"})
    with pytest.raises(InferenceServerException, match="invalid argument for --log_format, got: json"):
        http.update_log_settings({"log_format": "json"})
    assert http.get_log_settings()["log_format"] == "ISO8601"  # refused updates changed nothing


def test_a_change_reaches_running_and_later_replicas(
    http: httpclient.InferenceServerClient, grpc_url: str, test_repository: Path
) -> None:
    running = {_until_logged(http, "logger_api", "info", without="verbose")[0]}
    with grpcclient.InferenceServerClient(grpc_url) as grpc:  # gRPC answers on a thread of its own
        grpc.update_log_settings({"log_verbose_level": 1, "log_info": False, "log_format": "ISO8601"})
    pid, lines = _until_logged(http, "logger_api", "verbose")
    running.add(pid)
    assert not any(" info" in line for line in lines)  # INFO off, verbose or not, as in tritonserver
    assert all(line[:4].isdigit() and "Z " in line for line in lines)  # ISO8601: the date first

    late = test_repository / "logger_late"  # a model loaded now: its replica starts after the change
    shutil.copytree(LOGGER_MODEL, late)
    config = late / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "logger_api"', 'name: "logger_late"'))
    try:
        http.load_model("logger_late")
        late_pid, lines = _until_logged(http, "logger_late", "verbose")
        assert late_pid not in running and not any(" info" in line for line in lines)
    finally:
        http.unload_model("logger_late")
        shutil.rmtree(late)


def test_serves_replica_log_file_has_the_replicas_start(server_url: str) -> None:
    """Serve's own log file of a model replica (``logs/serve/replica_<app>_<deployment>_<id>.log``,
    what the Ray dashboard shows) holds its lines as they come: the replica's start is there, not held
    back until a thousand lines (``RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE``)."""
    client = httpclient.InferenceServerClient(server_url)
    pid, _ = _log_through(client, "logger_api")
    client.close()
    logs = Path(os.readlink(f"/proc/{pid}/fd/2")).parent / "serve"
    files = {
        f.stem.rsplit("_", 1)[1]: f.read_text(errors="replace")
        for f in logs.glob("replica_model-logger_api_*.log")
    }
    assert files, sorted(logs.iterdir())
    # every replica of the model, the one that answered included, has its start line in its file
    for replica, text in files.items():
        assert any(f" {replica} -- Start" in line for line in text.splitlines()), (replica, text[:500])
