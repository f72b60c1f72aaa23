"""Triton's CUDA shared-memory queries with the real tritonclient (HTTP and gRPC): no CUDA region is
listed, and registering one fails with Triton's errors (system shared memory:
tests/serve/test_shared_memory_e2e.py; trace settings: tests/serve/test_tracing_e2e.py)."""

from __future__ import annotations

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.serve


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, server_url: str, grpc_url: str):
    c = (
        httpclient.InferenceServerClient(server_url)
        if request.param == "http"
        else grpcclient.InferenceServerClient(grpc_url)
    )
    yield request.param, c
    c.close()


def test_cuda_shared_memory_queries_answer_as_with_no_region(client) -> None:
    protocol, c = client
    cuda = c.get_cuda_shared_memory_status()
    assert cuda == [] if protocol == "http" else list(cuda.regions) == []
    c.unregister_cuda_shared_memory()
    c.unregister_system_shared_memory("never_registered")
    with pytest.raises(InferenceServerException, match="Unable to open shared memory region: ''"):
        c.register_system_shared_memory("r", "", 0)
    empty_name = "empty segment" if protocol == "http" else "Unable to open shared memory region: ''"
    with pytest.raises(InferenceServerException, match=empty_name):  # HTTP: the path has '//'
        c.register_system_shared_memory("", "", 0)
    with pytest.raises(
        InferenceServerException, match="failed to register shared memory region.*invalid args"
    ):
        c.register_cuda_shared_memory("gpu_input", b"", 0, 0)
