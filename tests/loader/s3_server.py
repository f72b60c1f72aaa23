"""A real S3-compatible server for tests: moto's server mode in a subprocess on a loopback port.

The server enforces request signatures: after the few unsigned calls that create an IAM user, its
policy and its access key, only requests signed with that key are answered. So a test that reads
the repository proves the credentials came from where the test put them (the environment).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REGION = "us-east-1"
# IAM calls made before signatures are enforced: create_user, put_user_policy, create_access_key.
_UNSIGNED_SETUP_CALLS = 3
_ALLOW_ALL_S3 = (
    '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}'
)


@dataclass(frozen=True)
class S3Server:
    """A running server: where it listens and the one key pair it accepts."""

    pid: int
    port: int
    access_key: str
    secret_key: str

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def hostport(self) -> str:
        return f"127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The credentials as the AWS SDKs read them from the environment (no shared files, no IMDS)."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self, service: str = "s3") -> Any:
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_until_up(port: int, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto server exited with status {proc.returncode}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"moto server did not answer on port {port} within {timeout_s:g} s")


def _create_key(port: int) -> tuple[str, str]:
    import boto3

    iam = boto3.client(
        "iam",
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name=REGION,
        aws_access_key_id="setup",
        aws_secret_access_key="setup",
    )
    iam.create_user(UserName="repository-reader")
    iam.put_user_policy(UserName="repository-reader", PolicyName="s3", PolicyDocument=_ALLOW_ALL_S3)
    key = iam.create_access_key(UserName="repository-reader")["AccessKey"]
    return str(key["AccessKeyId"]), str(key["SecretAccessKey"])


@contextlib.contextmanager
def running_s3_server(log_dir: Path, timeout_s: float = 30.0) -> Iterator[S3Server]:
    """Start moto's server on a free loopback port; stop it (by its pid) on exit."""
    port = free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(_UNSIGNED_SETUP_CALLS)}
    log = (log_dir / "moto.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        _wait_until_up(port, proc, timeout_s)
        access_key, secret_key = _create_key(port)
        yield S3Server(proc.pid, port, access_key, secret_key)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def upload_tree(server: S3Server, local: Path, bucket: str, prefix: str) -> None:
    """Upload every file under ``local`` to ``s3://bucket/prefix/...`` (multipart for large files)."""
    client = server.client()
    for path in sorted(local.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            key = f"{prefix}/{path.relative_to(local).as_posix()}"
            client.upload_file(str(path), bucket, key)
