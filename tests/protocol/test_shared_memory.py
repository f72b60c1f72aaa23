"""System shared memory without Ray: the parameters' parsing, the registration checks, the table and
its followers, the mappings, and the HTTP and gRPC front ends end to end with the real tritonclient
and its ``tritonclient.utils.shared_memory`` helpers (in-process servers over a fake data plane that
holds the table itself, as the server application does)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from deployments.protocol import codec, grpc_codec, shared_memory
from deployments.protocol.http import ServerHTTPApp
from deployments.protocol.proto import grpc_service_pb2 as pb
from deployments.protocol.region_table import Answer, RegionTable, open_region
from deployments.protocol.shared_memory import MappedRegion, SharedInput, SharedMemory, SharedRef
from repository_loader.errors import AlreadyExists, InternalError, InvalidArgument, NotFound
from tests.protocol.grpc_fakes import StreamingFakeDataPlane, grpc_models
from tests.protocol.test_end_to_end import BackgroundServer
from tests.protocol.test_grpc import running_server

TAG = uuid.uuid4().hex[:10]  # keys of this run: /dev/shm is shared with everything on the machine


def key(name: str) -> str:
    return f"/test_shm_{name}_{TAG}"


@pytest.fixture
def region_file() -> Iterator[tuple[str, object]]:
    """A 64-byte object holding 0..15 as FP32."""
    handle = shm.create_shared_memory_region("unit", key("unit"), 64)
    shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.float32)])
    yield key("unit"), handle
    shm.destroy_shared_memory_region(handle)


# --- parsing the parameters ----------------------------------------------------------------


def test_an_http_input_in_shared_memory_is_left_for_the_front_end_to_read():
    params = {"shared_memory_region": "r", "shared_memory_byte_size": 64, "shared_memory_offset": 8}
    body = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 16], "parameters": params}]})
    request, _ = codec.decode_infer_request(body.encode(), None, "m")
    placeholder = request.inputs["X"]
    assert type(placeholder) is SharedInput and placeholder.ref == SharedRef("r", 64, 8)
    assert request.shared_memory


def test_a_request_without_shared_memory_is_not_marked():
    body = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": [1.0]}]})
    request, _ = codec.decode_infer_request(body.encode(), None, "m")
    assert not request.shared_memory


@pytest.mark.parametrize(
    ("extra", "params", "message"),
    [
        (
            {"data": [1.0]},
            {},
            "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
            "'shared_memory_region' in 'parameters'. But set 'data' 'shared_memory_region'",
        ),
        ({}, {"shared_memory_byte_size": "4"}, "Unable to parse 'shared_memory_byte_size'"),
        ({}, {"shared_memory_byte_size": -1}, "Unable to parse 'shared_memory_byte_size'"),
        ({}, {"shared_memory_offset": 1.5}, "Unable to parse 'shared_memory_offset'"),
        ({}, {"shared_memory_region": 5}, "Unable to parse 'shared_memory_region': attempt to access JSON"),
    ],
)
def test_http_input_parameters_are_checked_in_tritons_words(extra, params, message):
    parameters = {"shared_memory_region": "r", "shared_memory_byte_size": 4, **params}
    item = {"name": "X", "datatype": "FP32", "shape": [1], "parameters": parameters, **extra}
    with pytest.raises((InvalidArgument, InternalError), match=message.replace("(", r"\(")):
        codec.decode_infer_request(json.dumps({"inputs": [item]}).encode(), None, "m")


def test_an_http_output_cannot_be_both_binary_and_in_shared_memory():
    output = {"name": "Y", "parameters": {"shared_memory_region": "r", "binary_data": True}}
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": [1.0]}], "outputs": [output]}
    with pytest.raises(
        InvalidArgument, match="Output can't set both 'shared_memory_region' and 'binary_data'"
    ):
        codec.decode_infer_request(json.dumps(body).encode(), None, "m")
    output["parameters"]["binary_data"] = False  # what tritonclient sends for an output it moved to a region
    request, _ = codec.decode_infer_request(json.dumps(body).encode(), None, "m")
    assert request.requested_outputs[0].shared == SharedRef("r", -1, 0) and request.shared_memory


def test_grpc_raw_contents_belong_to_the_inputs_outside_shared_memory():
    message = pb.ModelInferRequest(model_name="m")
    first = message.inputs.add(name="A", datatype="FP32", shape=[2])
    first.parameters["shared_memory_region"].string_param = "r"
    first.parameters["shared_memory_byte_size"].int64_param = 8
    message.inputs.add(name="B", datatype="FP32", shape=[2])
    message.raw_input_contents.append(np.array([1, 2], np.float32).tobytes())
    out = message.outputs.add(name="Y")
    out.parameters["shared_memory_region"].string_param = "o"
    out.parameters["shared_memory_byte_size"].int64_param = 8
    request = grpc_codec.decode_infer_request(message)
    assert request.inputs["A"].ref == SharedRef("r", 8, 0)
    assert request.inputs["B"].tolist() == [1, 2]
    assert request.requested_outputs[0].shared == SharedRef("o", 8, 0) and request.shared_memory


def test_register_request_fields_in_tritons_words():
    assert shared_memory.register_request({"key": "/k", "byte_size": 8}) == ("/k", 0, 8)
    with pytest.raises(InvalidArgument, match="Shared memory register request has no 'byte_size' field"):
        shared_memory.register_request({"key": "/k"})
    with pytest.raises(InvalidArgument, match="has no 'key' field"):
        shared_memory.register_request({"byte_size": 8})
    with pytest.raises(InternalError, match="non-string as string"):
        shared_memory.register_request({"key": 1, "byte_size": 8})
    with pytest.raises(InternalError, match="non-unsigned-integer as unsigned-integer"):
        shared_memory.register_request({"key": "/k", "byte_size": 8, "offset": -1})


# --- registration, the table and its followers --------------------------------------------


def test_a_registration_is_checked_against_the_object(region_file):
    path, _ = region_file
    region = open_region("r", path, 16, 48)
    assert region.status() == {"name": "r", "key": path, "offset": 16, "byte_size": 48}
    with pytest.raises(InternalError, match=r"Unable to open shared memory region: '/no_such_key'"):
        open_region("r", "/no_such_key", 0, 8)
    for offset, size in ((0, 65), (1, 64), (64, 1), (65, 0)):
        with pytest.raises(
            InvalidArgument, match="failed to register shared memory region 'r': invalid args"
        ):
            open_region("r", path, offset, size)
    with pytest.raises(InvalidArgument, match="unable to process address space"):
        open_region("r", path, 0, 0)


async def test_the_table_registers_once_lists_and_unregisters(region_file):
    path, _ = region_file
    table = RegionTable()
    await table.register("a", path, 0, 64)
    await table.register("b", path, 32, 32)
    with pytest.raises(AlreadyExists, match="shared memory region 'a' already in manager") as error:
        await table.register("a", path, 0, 64)
    assert error.value.http_status == 400 and error.value.grpc_status == "ALREADY_EXISTS"
    assert [entry["name"] for entry in await table.status()] == ["a", "b"]
    assert await table.status("b") == [{"name": "b", "key": path, "offset": 32, "byte_size": 32}]
    with pytest.raises(NotFound, match="Unable to find system shared memory region: 'c'"):
        await table.status("c")
    with pytest.raises(NotFound, match="Unable to find shared memory region: 'c'"):
        await table.region("c", "f")
    await table.unregister("c")  # not registered: no error
    await table.unregister("a")
    assert [entry["name"] for entry in await table.status()] == ["b"]
    await table.unregister()
    assert await table.status() == []


async def test_an_unregister_returns_once_every_follower_dropped_its_mapping(region_file):
    path, handle = region_file
    table = RegionTable()
    await table.register("r", path, 0, 64)
    view = SharedMemory(table, follower="replica-1")
    mapped = await view.mapped("r")
    assert np.frombuffer(mapped.span(SharedRef("r", 64)), np.float32)[3] == 3
    await asyncio.sleep(0)  # the follower asks the table
    await table.unregister("r")
    assert view._mapped == {}  # dropped before the unregister answered
    await view.aclose()


async def test_a_follower_that_went_away_holds_an_unregister_back_only_until_the_timeout(region_file):
    path, _ = region_file
    table = RegionTable(settle_timeout_s=0.05)
    await table.register("r", path, 0, 64)
    await table.region("r", "gone")  # a replica that mapped it, then died
    await table.unregister("r")
    await table.register("r", path, 0, 64)
    await table.unregister("r")  # forgotten: nothing to wait for


async def test_a_lookup_answered_before_a_change_the_follower_saw_is_not_kept(region_file):
    path, _ = region_file
    table = RegionTable()
    await table.register("r", path, 0, 64)
    view = SharedMemory(table)
    view._seen = table.generation + 1  # the follower is already past the generation the answer carries
    await view.mapped("r")
    assert view._mapped == {}


async def _following(table: RegionTable, name: str, *regions: str) -> SharedMemory:
    """A follower that mapped ``regions`` and asks the table for changes."""
    view = SharedMemory(table, follower=name)
    for region in regions:
        await view.mapped(region)
    await asyncio.sleep(0)  # the follower asks the table
    return view


async def test_a_region_a_request_in_flight_uses_is_not_unregistered_until_it_ends(region_file):
    path, _ = region_file
    table = RegionTable()
    await table.register("r", path, 0, 64)
    view = await _following(table, "replica-1", "r")
    with view.using(["r", "r"]):  # a request that reads and writes r
        assert view.in_use() == ["r"]
        with pytest.raises(InternalError) as error:
            await table.unregister("r")
        assert str(error.value) == "Cannot unregister shared memory region 'r', it is currently in use."
        assert error.value.http_status == 500 and error.value.grpc_status == "INTERNAL"
        assert [e["name"] for e in await table.status()] == ["r"] and "r" in view._mapped
        await view.mapped("r")  # the request goes on with its mapping
    assert view.in_use() == []
    await table.unregister("r")
    assert await table.status() == [] and view._mapped == {}
    await view.aclose()


async def test_unregistering_every_region_keeps_and_names_the_ones_in_use(region_file):
    path, _ = region_file
    table = RegionTable()
    for name in ("c", "a", "b"):
        await table.register(name, path, 0, 64)
    busy = await _following(table, "replica-1", "b")
    idle = await _following(table, "replica-2", "a")
    with busy.using(["c", "b"]):
        with pytest.raises(InternalError) as error:
            await table.unregister()
        assert str(error.value) == "Failed to unregister the following system shared memory regions: b ,c ,"
        assert [e["name"] for e in await table.status()] == ["b", "c"]  # a is gone, everywhere
        assert busy._mapped == {} and idle._mapped == {}
    await table.unregister()
    assert await table.status() == []
    await busy.aclose()
    await idle.aclose()


async def test_a_request_that_starts_while_the_table_asks_waits_for_the_verdict(region_file):
    path, _ = region_file
    table = RegionTable()
    await table.register("r", path, 0, 64)
    view = await _following(table, "replica-1", "r")
    _, seen = await table.region("r", "replica-2")  # a follower that answers when the test says
    unregister = asyncio.ensure_future(table.unregister("r"))
    question = (await table.follow("replica-2", seen, 30)).question
    assert question is not None and question.names == ("r",)
    await _until(lambda: view._fenced == {"r"})  # replica-1 answered "not in use"
    assert not unregister.done()
    with view.using(["r"]):  # a request in replica-1 after its answer: waits, then finds r gone
        lookup = asyncio.ensure_future(view.mapped("r"))
        await asyncio.sleep(0)
        assert not lookup.done()
        state = await table.follow("replica-2", seen, 30, Answer(question.id, ()))
        assert state.generation > seen  # r is dropped; replica-2 acknowledges it
        await table.follow("replica-2", state.generation, 30)
        with pytest.raises(NotFound, match="Unable to find shared memory region: 'r'"):
            await lookup
        assert unregister.done()
    with pytest.raises(NotFound):
        await table.region("r", "replica-3")
    await unregister
    await view.aclose()


async def _until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Until ``condition()`` holds (other tasks run meanwhile); fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.001)


async def test_a_lookup_while_the_table_asks_waits_and_then_finds_the_region_kept(region_file):
    path, _ = region_file
    table = RegionTable()
    await table.register("r", path, 0, 64)
    view = await _following(table, "replica-1", "r")
    with view.using(["r"]):
        unregister = asyncio.ensure_future(table.unregister("r"))
        await asyncio.sleep(0)  # the question is open
        region, _ = await table.region("r", "replica-2")  # waits until the unregister decided
        assert region.name == "r" and unregister.done()
        with pytest.raises(InternalError, match="it is currently in use"):
            await unregister
    await view.aclose()


async def test_a_follower_that_does_not_answer_holds_an_unregister_back_only_until_the_timeout(
    region_file,
):
    path, _ = region_file
    table = RegionTable(settle_timeout_s=0.1)
    await table.register("r", path, 0, 64)
    view = await _following(table, "replica-1", "r")
    await table.region("r", "gone")  # mapped it, then went away: answers no question
    started = time.monotonic()
    await asyncio.wait_for(table.unregister("r"), 10)
    assert time.monotonic() - started >= 0.1  # waited for it, then gave up
    assert await table.status() == [] and view._mapped == {}
    await table.register("r", path, 0, 64)
    table._settle_timeout_s = 60.0  # a wait now would outlast the test's
    await asyncio.wait_for(table.unregister("r"), 10)  # forgotten: nothing to wait for
    await view.aclose()


# --- mappings ------------------------------------------------------------------------------


def test_a_mapping_checks_each_span_in_tritons_words(region_file):
    path, _ = region_file
    mapped = MappedRegion(open_region("r", path, 16, 32))
    assert len(mapped.view) == 32  # the region's bytes only
    assert np.frombuffer(mapped.span(SharedRef("r", 8, 8)), np.float32).tolist() == [6.0, 7.0]
    with pytest.raises(InvalidArgument, match="Invalid offset for shared memory region: 'r'"):
        mapped.span(SharedRef("r", 4, 32))
    with pytest.raises(InvalidArgument, match=r"Invalid offset \+ byte size for shared memory region: 'r'"):
        mapped.span(SharedRef("r", 32, 4))
    with pytest.raises(InvalidArgument, match=r"Invalid offset \+ byte size"):
        mapped.span(SharedRef("r", -1, 0))  # no byte size given
    mapped.close()


def test_an_output_that_does_not_fit_is_refused(region_file):
    path, _ = region_file
    mapped = MappedRegion(open_region("r", path, 0, 64))
    span = mapped.span(SharedRef("r", 8))
    with pytest.raises(InternalError, match=r"output 'Y' \(8 bytes\) should be at least 12 bytes"):
        shared_memory.write_into(span, np.zeros(3, np.float32).view(np.uint8), "Y")
    shared_memory.write_into(span, np.array([7, 8], np.float32).view(np.uint8), "Y")
    assert np.frombuffer(mapped.view, np.float32)[:2].tolist() == [7.0, 8.0]
    del span
    mapped.close()


def test_a_region_of_another_host_is_refused(region_file):
    path, _ = region_file
    elsewhere = replace(open_region("r", path, 0, 64), host="another-boot:1")
    with pytest.raises(InvalidArgument, match="registered on another host"):
        MappedRegion(elsewhere)


def test_a_key_made_again_since_the_registration_is_refused(region_file):
    path, _ = region_file
    moved = replace(open_region("r", path, 0, 64), file_id=(0, 0))
    with pytest.raises(InvalidArgument, match="no longer holds region 'r'"):
        MappedRegion(moved)


# --- end to end with tritonclient (HTTP and gRPC, no Ray) --------------------------------------


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[dict[str, tuple[str, StreamingFakeDataPlane]]]:
    """Each front end's address and data plane (every model of ``grpc_models``: echo_slow too)."""
    folder = tmp_path_factory.mktemp("models")
    http_plane = StreamingFakeDataPlane(grpc_models(folder))
    grpc_plane = StreamingFakeDataPlane(grpc_models(folder))
    with BackgroundServer(ServerHTTPApp(http_plane)) as http, running_server(grpc_plane) as grpc_url:
        yield {"http": (http.url, http_plane), "grpc": (grpc_url, grpc_plane)}


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, servers: dict[str, str]):
    module = httpclient if request.param == "http" else grpcclient
    c = module.InferenceServerClient(servers[request.param][0])
    c.unregister_system_shared_memory()
    yield module, c
    c.unregister_system_shared_memory()
    c.close()


@pytest.fixture
def regions() -> Iterator[dict[str, object]]:
    handles = {name: shm.create_shared_memory_region(name, key(name), 64) for name in ("in0", "in1", "out0")}
    shm.set_shared_memory_region(handles["in0"], [np.arange(16, dtype=np.float32)])
    shm.set_shared_memory_region(handles["in1"], [np.ones(16, dtype=np.float32)])
    yield handles
    for handle in handles.values():
        shm.destroy_shared_memory_region(handle)


def _status(client, name: str = "") -> list[str]:
    answer = client.get_system_shared_memory_status(name)
    return sorted(e["name"] for e in answer) if isinstance(answer, list) else sorted(answer.regions)


def _infer(module, client, in1: str = "in1", out_size: int = 64, out_offset: int = 0):
    inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_shared_memory("in0", 64)
    inputs[1].set_shared_memory(in1, 64)
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("out0", out_size, offset=out_offset)
    return client.infer("add_sub", inputs, outputs=outputs)


def test_register_status_and_unregister(client, regions):
    _, c = client
    for name in regions:
        c.register_system_shared_memory(name, key(name), 64)
    assert _status(c) == ["in0", "in1", "out0"]
    assert _status(c, "in1") == ["in1"]
    with pytest.raises(InferenceServerException, match="shared memory region 'in0' already in manager"):
        c.register_system_shared_memory("in0", key("in0"), 64)
    with pytest.raises(
        InferenceServerException, match="failed to register shared memory region 'big': invalid args"
    ):
        c.register_system_shared_memory("big", key("in0"), 65)
    with pytest.raises(InferenceServerException, match="Unable to open shared memory region: '/nokey"):
        c.register_system_shared_memory("x", "/nokey" + TAG, 64)
    c.unregister_system_shared_memory("in1")
    assert _status(c) == ["in0", "out0"]
    with pytest.raises(InferenceServerException, match="Unable to find system shared memory region: 'in1'"):
        c.get_system_shared_memory_status("in1")
    c.unregister_system_shared_memory()
    assert _status(c) == []


def test_inputs_are_read_from_and_outputs_written_into_shared_memory(client, regions):
    module, c = client
    for name in regions:
        c.register_system_shared_memory(name, key(name), 64)
    result = _infer(module, c)
    written = shm.get_contents_as_numpy(regions["out0"], np.float32, [1, 16])
    assert written.tolist() == [list(np.arange(16) + 2.0)]  # version 2 adds one
    assert result.as_numpy("OUTPUT1").tolist() == [list(np.arange(16) - 1.0)]
    if module is httpclient:
        entry = result.get_output("OUTPUT0")
        assert entry == {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16]}  # no data, as Triton
    else:
        assert len(result.get_response().raw_output_contents[0]) == 0


def test_a_region_registered_again_is_read_afresh(client, regions):
    module, c = client
    for name in regions:
        c.register_system_shared_memory(name, key(name), 64)
    _infer(module, c)
    c.unregister_system_shared_memory("in1")
    c.register_system_shared_memory("in1", key("in0"), 64)  # same name, another object
    _infer(module, c)
    written = shm.get_contents_as_numpy(regions["out0"], np.float32, [1, 16])
    assert written.tolist() == [list(np.arange(16) * 2 + 1.0)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"in1": "nope"}, "Unable to find shared memory region: 'nope'"),
        ({"out_offset": 64}, "Invalid offset for shared memory region: 'out0'"),
        ({"out_offset": 60}, "Invalid offset + byte size for shared memory region: 'out0'"),
        (
            {"out_size": 32},
            "shared memory size specified with the request for output 'OUTPUT0' (32 bytes) should be at "
            "least 64 bytes to hold the results",
        ),
    ],
)
def test_requests_that_do_not_fit_their_regions_are_refused_in_tritons_words(
    client, regions, kwargs, message
):
    module, c = client
    for name in regions:
        c.register_system_shared_memory(name, key(name), 64)
    with pytest.raises(InferenceServerException) as error:
        _infer(module, c, **kwargs)
    assert message in str(error.value)


def test_an_input_of_the_wrong_size_is_refused(client, regions):
    module, c = client
    big = shm.create_shared_memory_region("big", key("big"), 128)
    try:
        for name in regions:
            c.register_system_shared_memory(name, key(name), 64)
        c.register_system_shared_memory("big", key("big"), 128)
        inputs = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
        inputs[0].set_shared_memory("in0", 64)
        inputs[1].set_shared_memory("big", 128)
        with pytest.raises(
            InferenceServerException,
            match="input byte size mismatch for input 'INPUT1' for model 'add_sub'. Expected 64, got 128",
        ):
            c.infer("add_sub", inputs)
    finally:
        shm.destroy_shared_memory_region(big)


def test_regions_a_request_in_flight_uses_are_not_unregistered_until_it_ends(client, regions, servers):
    """Triton's qa TestSharedMemoryUnregister, on a model that answers after a pause."""
    module, c = client
    url, plane = servers["http" if module is httpclient else "grpc"]
    for name in regions:
        c.register_system_shared_memory(name, key(name), 64)
    shm.set_shared_memory_region(regions["in0"], [np.arange(8, dtype=np.int64)])
    inputs = [module.InferInput("X", [8], "INT64")]
    inputs[0].set_shared_memory("in0", 64)
    outputs = [module.InferRequestedOutput("Y")]
    outputs[0].set_shared_memory("out0", 64)

    def slow_request() -> None:  # answered once the test releases it
        other = module.InferenceServerClient(url)
        other.infer("echo_slow", inputs, outputs=outputs, parameters={"hold": True})
        other.close()

    plane.released.clear()
    try:
        with ThreadPoolExecutor(1) as pool:
            request = pool.submit(slow_request)
            deadline = time.monotonic() + 10
            while plane.shared_memory.in_use() != ["in0", "out0"]:  # until the request is in flight
                assert time.monotonic() < deadline and not request.done()
                time.sleep(0.01)
            with pytest.raises(InferenceServerException) as error:
                c.unregister_system_shared_memory()
            assert "Failed to unregister the following system shared memory regions: in0 ,out0 ," in str(
                error.value
            )
            assert error.value.status() in ("500", "StatusCode.INTERNAL")
            for name in ("in0", "out0"):
                with pytest.raises(
                    InferenceServerException,
                    match=f"Cannot unregister shared memory region '{name}', it is currently in use.",
                ):
                    c.unregister_system_shared_memory(name)
            assert _status(c) == ["in0", "out0"]  # in1 was not in use: unregistered
            plane.released.set()
            request.result()
    finally:
        plane.released.set()
    assert shm.get_contents_as_numpy(regions["out0"], np.int64, [8]).tolist() == list(range(8))
    c.unregister_system_shared_memory()
    assert _status(c) == []


def test_bytes_tensors_are_read_from_and_written_into_regions_as_length_prefixed_elements(region_file):
    from repository_loader.datatypes import serialize_bytes_tensor

    path, handle = region_file
    data = serialize_bytes_tensor(np.array([b"ab", b"cde"], dtype=object))
    shm.set_shared_memory_region(handle, [np.frombuffer(data, np.uint8)])
    mapped = MappedRegion(open_region("r", path, 0, 64))
    tensor = codec.shared_tensor("T", "m", "BYTES", [2], mapped.span(SharedRef("r", len(data))))
    assert tensor.tolist() == [b"ab", b"cde"]
    with pytest.raises(InvalidArgument, match="expected 3 string elements for inference input 'T'"):
        codec.shared_tensor("T", "m", "BYTES", [3], mapped.span(SharedRef("r", len(data))))
    out = mapped.span(SharedRef("r", 32, 32))
    shared_memory.write_into(out, codec.tensor_bytes(np.array([b"xyz"], dtype=object)), "O")
    assert bytes(mapped.view[32:39]) == b"\x03\x00\x00\x00xyz"
    del out
    mapped.close()


def test_an_input_read_from_a_region_is_a_read_only_view_on_it(region_file):
    path, _ = region_file
    mapped = MappedRegion(open_region("r", path, 0, 64))
    tensor = codec.shared_tensor("X", "m", "FP32", [1, 16], mapped.span(SharedRef("r", 64)))
    assert tensor.tolist() == [list(np.arange(16, dtype=np.float32))] and not tensor.flags.writeable
    mapped.close()  # a tensor still views it: unmapped when the tensor goes
    assert tensor[0, 3] == 3
