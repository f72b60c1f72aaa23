"""The tritonserver peer in tests: skipped where it is not installed, a failure where the run needs it.

``make test`` (what CI runs) installs the peer first and sets ``TRITON_SERVE_REQUIRE_PEERS=1``, so a
comparison with tritonserver never silently skips there.
"""

from __future__ import annotations

import os

import pytest

from bench import peers

REQUIRE_ENV = "TRITON_SERVE_REQUIRE_PEERS"


def require_tritonserver() -> None:
    """Skip (or fail, under ``make test``) unless tritonserver and its Python-stub environment are here."""
    missing = None
    if not peers.tritonserver_path().exists():
        missing = "the tritonserver peer is not installed (python -m bench.peers)"
    elif not peers.stub_environment_ready():
        # the 2.51 stub reads numpy 1's array layout: it needs its own environment (numpy < 2)
        missing = "the peer's Python-stub environment is missing (python -m bench.peers)"
    if missing is None:
        return
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(missing)
    pytest.skip(missing)
