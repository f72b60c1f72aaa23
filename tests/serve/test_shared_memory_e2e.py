"""System shared memory on the shared server, with the real tritonclient (HTTP and gRPC) and its
``tritonclient.utils.shared_memory`` helpers: regions are registered with the server application and
read and written by the model's own replicas, which learn them from it (docs/architecture.md)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.serve

TAG = uuid.uuid4().hex[:10]
SIZE = 16  # add_sub: FP32 [4] -> 16 bytes a row


def key(name: str) -> str:
    return f"/serve_shm_{name}_{TAG}"


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, server_url: str, grpc_url: str) -> Iterator[tuple[Any, Any]]:
    module: Any = httpclient if request.param == "http" else grpcclient
    c = module.InferenceServerClient(server_url if request.param == "http" else grpc_url)
    yield module, c
    c.unregister_system_shared_memory()
    c.close()


@pytest.fixture
def regions() -> Iterator[dict[str, Any]]:
    handles = {n: shm.create_shared_memory_region(n, key(n), SIZE) for n in ("in0", "in1", "out0", "other")}
    shm.set_shared_memory_region(handles["in0"], [np.array([1, 2, 3, 4], np.float32)])
    shm.set_shared_memory_region(handles["in1"], [np.array([10, 20, 30, 40], np.float32)])
    shm.set_shared_memory_region(handles["other"], [np.array([100, 200, 300, 400], np.float32)])
    yield handles
    for handle in handles.values():
        shm.destroy_shared_memory_region(handle)


def _register(c: Any, *names: str) -> None:
    for name in names:
        c.register_system_shared_memory(name, key(name), SIZE)


def _names(c: Any, name: str = "") -> list[str]:
    answer = c.get_system_shared_memory_status(name)
    return sorted(e["name"] for e in answer) if isinstance(answer, list) else sorted(answer.regions)


def _infer(module: Any, c: Any, in1: str = "in1", out_size: int = SIZE) -> Any:
    inputs = [module.InferInput("INPUT0", [1, 4], "FP32"), module.InferInput("INPUT1", [1, 4], "FP32")]
    inputs[0].set_shared_memory("in0", SIZE)
    inputs[1].set_shared_memory(in1, SIZE)
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("out0", out_size)
    return c.infer("add_sub", inputs, outputs=outputs)


def test_the_server_lists_system_shared_memory_among_its_extensions(server_url: str) -> None:
    c = httpclient.InferenceServerClient(server_url)
    assert "system_shared_memory" in c.get_server_metadata()["extensions"]
    c.close()


def test_register_status_and_unregister(client: tuple[Any, Any], regions: dict[str, Any]) -> None:
    _, c = client
    _register(c, "in0", "in1")
    assert _names(c) == ["in0", "in1"] and _names(c, "in1") == ["in1"]
    with pytest.raises(InferenceServerException, match="shared memory region 'in0' already in manager"):
        c.register_system_shared_memory("in0", key("in0"), SIZE)
    with pytest.raises(
        InferenceServerException, match="failed to register shared memory region 'x': invalid args"
    ):
        c.register_system_shared_memory("x", key("in0"), SIZE, offset=1)
    c.unregister_system_shared_memory("in0")
    with pytest.raises(InferenceServerException, match="Unable to find system shared memory region: 'in0'"):
        c.get_system_shared_memory_status("in0")
    c.unregister_system_shared_memory()
    assert _names(c) == []


def test_a_model_replica_reads_inputs_from_and_writes_outputs_into_the_regions(
    client: tuple[Any, Any], regions: dict[str, Any]
) -> None:
    module, c = client
    _register(c, "in0", "in1", "out0")
    result = _infer(module, c)
    assert shm.get_contents_as_numpy(regions["out0"], np.float32, [1, 4]).tolist() == [[11, 22, 33, 44]]
    assert result.as_numpy("OUTPUT1").tolist() == [[-9, -18, -27, -36]]
    entry = result.get_output("OUTPUT0")  # in the region: the response names it, with no data
    if module is httpclient:
        assert entry == {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 4]}
    else:
        assert list(entry.shape) == [1, 4] and len(result.get_response().raw_output_contents[0]) == 0


def test_a_name_registered_again_reaches_the_replicas_before_the_register_answers(
    client: tuple[Any, Any], regions: dict[str, Any]
) -> None:
    module, c = client
    _register(c, "in0", "in1", "out0")
    _infer(module, c)  # the replica maps in1
    c.unregister_system_shared_memory("in1")
    c.register_system_shared_memory("in1", key("other"), SIZE)
    _infer(module, c)
    assert shm.get_contents_as_numpy(regions["out0"], np.float32, [1, 4]).tolist() == [[101, 202, 303, 404]]


def test_errors_in_tritons_words(client: tuple[Any, Any], regions: dict[str, Any]) -> None:
    module, c = client
    _register(c, "in0", "in1", "out0")
    with pytest.raises(
        InferenceServerException, match="Unable to find shared memory region: 'nope'"
    ) as error:
        _infer(module, c, in1="nope")
    assert error.value.status() in ("404", "StatusCode.NOT_FOUND")
    with pytest.raises(
        InferenceServerException,
        match=r"output 'OUTPUT0' \(8 bytes\) should be at least 16 bytes to hold the results",
    ):
        _infer(module, c, out_size=8)


def test_regions_a_request_in_flight_uses_are_not_unregistered_until_it_ends(
    client: tuple[Any, Any], regions: dict[str, Any], server_url: str, grpc_url: str
) -> None:
    """Triton's qa TestSharedMemoryUnregister: the model's replica, not the server application, knows
    the request, and tells the table which regions it uses when asked (docs/architecture.md)."""
    module, c = client
    url = server_url if module is httpclient else grpc_url
    _register(c, "in0", "out0", "other")
    shm.set_shared_memory_region(regions["in0"], [np.array([1, 2, 3, 4], np.int32)])
    inputs = [module.InferInput("X", [4], "INT32")]
    inputs[0].set_shared_memory("in0", SIZE)
    outputs = [module.InferRequestedOutput("Y")]
    outputs[0].set_shared_memory("out0", SIZE)

    def slow_request() -> None:
        other = module.InferenceServerClient(url)
        other.infer("slow", inputs, outputs=outputs)
        other.close()

    with ThreadPoolExecutor(1) as pool:
        request = pool.submit(slow_request)
        time.sleep(1.5)  # the model holds the request 4 s
        with pytest.raises(InferenceServerException) as error:
            c.unregister_system_shared_memory()
        assert "Failed to unregister the following system shared memory regions: in0 ,out0 ," in str(
            error.value
        )
        for name in ("in0", "out0"):
            with pytest.raises(
                InferenceServerException,
                match=f"Cannot unregister shared memory region '{name}', it is currently in use.",
            ):
                c.unregister_system_shared_memory(name)
        assert _names(c) == ["in0", "out0"]  # "other" was not in use: unregistered
        request.result()
    assert shm.get_contents_as_numpy(regions["out0"], np.int32, [4]).tolist() == [2, 3, 4, 5]
    c.unregister_system_shared_memory()
    assert _names(c) == []
