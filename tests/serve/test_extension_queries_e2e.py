"""Triton's shared-memory queries with the real tritonclient (HTTP and gRPC): no shared-memory region
is listed, unregistering succeeds, and registering fails with Triton's errors (the server does not
read tensors from shared memory). Trace settings: tests/serve/test_tracing_e2e.py."""

from __future__ import annotations

from multiprocessing import shared_memory

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


def test_shared_memory_queries_answer_as_with_no_region(client) -> None:
    protocol, c = client
    system = c.get_system_shared_memory_status()
    cuda = c.get_cuda_shared_memory_status()
    if protocol == "http":
        assert system == [] and cuda == []
    else:
        assert list(system.regions) == [] and list(cuda.regions) == []
    c.unregister_system_shared_memory()
    c.unregister_system_shared_memory("never_registered")
    c.unregister_cuda_shared_memory()
    with pytest.raises(InferenceServerException, match="Unable to open shared memory region: ''"):
        c.register_system_shared_memory("r", "", 0)
    empty_name = "empty segment" if protocol == "http" else "Unable to open shared memory region: ''"
    with pytest.raises(InferenceServerException, match=empty_name):  # HTTP: the path has '//'
        c.register_system_shared_memory("", "", 0)
    region = shared_memory.SharedMemory(create=True, size=64)
    try:
        with pytest.raises(InferenceServerException, match="does not read or write tensors in shared memory"):
            c.register_system_shared_memory("input", "/" + region.name, 64)
    finally:
        region.close()
        region.unlink()
    with pytest.raises(
        InferenceServerException, match="failed to register shared memory region.*invalid args"
    ):
        c.register_cuda_shared_memory("gpu_input", b"", 0, 0)
