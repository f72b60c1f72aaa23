"""The gRPC front end with the real ``tritonclient.grpc`` clients (sync, aio, streaming), without Ray.

The server runs in this process, on its own event loop in a thread, over the
in-memory data plane of ``grpc_fakes``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2 as triton_pb
from tritonclient.grpc import service_pb2_grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from deployments.protocol.dataplane import DataPlane
from deployments.protocol.grpc import (
    GRPCInferenceServicer,
    GrpcOptions,
    build_grpc_server,
)
from deployments.protocol.grpc_http1 import GrpcOverHttp1
from deployments.protocol.http1_server import TRAILERS_EXTENSION
from deployments.protocol.proto import grpc_service_pb2 as pb
from deployments.serve.response_writes import coalesce_response_writes
from tests.protocol.fakes import LABELS, softmax
from tests.protocol.grpc_fakes import StreamingFakeDataPlane, grpc_models
from tests.protocol.haproxy import running_haproxy


@contextmanager
def running_server(dataplane: Any, transport: str = "grpc", **options: Any) -> Iterator[str]:
    """Serve ``dataplane`` on a free local port from a thread; yield ``host:port``.

    ``transport`` "grpc": the gRPC server (grpcio) alone. "http1": HAProxy's HTTP/2 frontend in front,
    handing every call, streams included, to an HTTP/1.1 server (uvicorn, httptools, as in a replica)
    answering it with trailers (``deployments.protocol.grpc_http1``), as on Serve.
    """
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: dict[str, Any] = {}
    grpc_options = GrpcOptions(host="127.0.0.1", port=0, **options)

    async def main() -> None:
        server, port = build_grpc_server(dataplane, grpc_options)
        await server.start()
        stop = asyncio.Event()
        holder["stop"], holder["port"] = stop, port
        http1 = None
        if transport == "http1":
            http1 = _http1_server(GRPCInferenceServicer(dataplane, grpc_options))
            serving = asyncio.ensure_future(http1.serve())
            while not http1.started:
                await asyncio.sleep(0.02)
            holder["http1_port"] = http1.servers[0].sockets[0].getsockname()[1]
        started.set()
        await stop.wait()
        if http1 is not None:
            http1.should_exit = True
            await serving
        await server.stop(0)
        regions = getattr(dataplane, "shared_memory", None)
        if regions is not None:  # its follow of the region table ends with the loop
            await regions.aclose()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert started.wait(10), "the gRPC server did not start"
    try:
        if transport == "http1":
            with tempfile.TemporaryDirectory() as folder:
                front = _free_port()
                config = _HTTP1_FRONT.format(front=front, h1=holder["http1_port"], h2=holder["port"])
                with running_haproxy(config, Path(folder), front) as address:
                    yield address
        else:
            yield f"127.0.0.1:{holder['port']}"
    finally:
        loop.call_soon_threadsafe(holder["stop"].set)
        thread.join(10)
        assert not thread.is_alive(), "the gRPC server did not stop"
        loop.close()


_HTTP1_FRONT = """
defaults
    mode http
    option http-no-delay
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend grpc
    bind 127.0.0.1:{front} proto h2
    use_backend streams if {{ path /inference.GRPCInferenceService/ModelStreamInfer }}
    default_backend unary
backend unary
    http-reuse always
    server http1 127.0.0.1:{h1}
backend streams
    server http1 127.0.0.1:{h1}
"""


def _http1_server(servicer: GRPCInferenceServicer) -> Any:
    """uvicorn (httptools) answering the servicer's unary calls over HTTP/1.1 with trailers."""
    import uvicorn

    assert coalesce_response_writes()
    lane = GrpcOverHttp1(servicer)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            scope.setdefault("extensions", {})[TRAILERS_EXTENSION] = {}
            await lane(scope, receive, send)

    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, http="httptools", lifespan="off", log_level="warning"
    )
    return uvicorn.Server(config)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def dataplane(tmp_path_factory) -> StreamingFakeDataPlane:
    return StreamingFakeDataPlane(grpc_models(tmp_path_factory.mktemp("models")))


@pytest.fixture(scope="module", params=["grpc", "http1"])
def transport(request: pytest.FixtureRequest) -> str:
    """Every test runs against the gRPC server, and with its unary calls over HTTP/1.1 behind HAProxy."""
    return str(request.param)


@pytest.fixture(scope="module")
def url(dataplane, transport) -> Iterator[str]:
    with running_server(dataplane, transport) as address:
        yield address


@pytest.fixture
def client(url) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(url)
    yield c
    c.close()


def add_sub_inputs(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    inputs = [
        grpcclient.InferInput("INPUT0", list(a.shape), "FP32"),
        grpcclient.InferInput("INPUT1", list(b.shape), "FP32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def int_input(name: str, values: list[int], datatype: str = "INT32", module: Any = grpcclient) -> Any:
    array = np.array(values, dtype=np.int32 if datatype == "INT32" else np.int64)
    tensor = module.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def status_of(error: InferenceServerException) -> str:
    return str(error.status())


# --- the schema -------------------------------------------------------------------


def test_every_message_matches_tritons_field_names_and_numbers():
    """The client's own compiled grpc_service.proto is the reference for the wire."""
    ours, theirs = pb.DESCRIPTOR, triton_pb.DESCRIPTOR
    assert ours.package == theirs.package == "inference"
    assert set(ours.message_types_by_name) == set(theirs.message_types_by_name)

    def compare(a: Any, b: Any) -> None:
        assert {f.name: f.number for f in a.fields} == {f.name: f.number for f in b.fields}, a.full_name
        for fa in a.fields:
            fb = b.fields_by_name[fa.name]
            if a.full_name == "inference.ModelConfigResponse":
                assert fa.type == fa.TYPE_BYTES and fb.type == fb.TYPE_MESSAGE  # both length-delimited
                continue
            assert (fa.type, fa.is_repeated) == (fb.type, fb.is_repeated), fa.full_name
            if fa.message_type is not None:
                assert fa.message_type.full_name == fb.message_type.full_name
        assert set(a.nested_types_by_name) == set(b.nested_types_by_name)
        for name, nested in a.nested_types_by_name.items():
            compare(nested, b.nested_types_by_name[name])

    for name, message in ours.message_types_by_name.items():
        compare(message, theirs.message_types_by_name[name])
    service, reference = (
        ours.services_by_name["GRPCInferenceService"],
        theirs.services_by_name["GRPCInferenceService"],
    )

    def signature(m: Any) -> tuple:
        return (m.input_type.full_name, m.output_type.full_name, m.client_streaming, m.server_streaming)

    assert {m.name: signature(m) for m in service.methods} == {
        m.name: signature(m) for m in reference.methods
    }


def test_every_rpc_has_a_method():
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        assert callable(getattr(GRPCInferenceServicer, method.name, None)), method.name


def test_the_fake_streams(dataplane):
    assert isinstance(dataplane, DataPlane)


def test_generated_module_is_current(tmp_path):
    from deployments.protocol.proto import regenerate

    for path in regenerate.generate(tmp_path):
        assert path.read_text() == (regenerate.PROTO_DIR / path.name).read_text(), path.name


def test_options_are_checked():
    with pytest.raises(ValueError, match="compression"):
        GrpcOptions(compression="brotli")
    with pytest.raises(ValueError, match="positive"):
        GrpcOptions(max_receive_message_bytes=0)


# --- health, metadata, configuration ------------------------------------------------


def test_health(client):
    assert client.is_server_live()
    assert not client.is_server_ready()  # 'broken' is not ready
    assert client.is_model_ready("add_sub")
    assert client.is_model_ready("add_sub", "2")
    assert not client.is_model_ready("broken")
    # a name the server does not know is not ready, without an error (tritonserver 2.51 answers so)
    assert not client.is_model_ready("nope") and not client.is_model_ready("add_sub", "9")


def test_metadata(client):
    server = client.get_server_metadata(as_json=True)
    assert server["name"] == "triton" and "classification" in server["extensions"]
    model = client.get_model_metadata("add_sub", as_json=True)
    assert model["name"] == "add_sub" and model["versions"] == ["1", "2"]
    assert model["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "16"]}
    with pytest.raises(InferenceServerException) as error:
        client.get_model_metadata("add_sub", "7")
    assert status_of(error.value) == "StatusCode.NOT_FOUND"


def test_model_config_arrives_as_tritons_model_config(client):
    config = client.get_model_config("add_sub").config
    assert isinstance(config, grpcclient.model_config_pb2.ModelConfig)
    assert config.name == "add_sub" and config.max_batch_size == 8 and config.backend == "python"
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [
        ("INPUT0", grpcclient.model_config_pb2.TYPE_FP32, [16]),
        ("INPUT1", grpcclient.model_config_pb2.TYPE_FP32, [16]),
    ]
    decoupled = client.get_model_config("repeat", as_json=True)["config"]
    assert decoupled["model_transaction_policy"]["decoupled"] is True


def test_statistics(client):
    a = np.ones((1, 16), np.float32)
    client.infer("add_sub", add_sub_inputs(a, a))
    stats = client.get_inference_statistics("add_sub", "2", as_json=True)["model_stats"]
    assert [s["name"] for s in stats] == ["add_sub"] and int(stats[0]["inference_count"]) >= 1
    assert int(stats[0]["inference_stats"]["success"]["count"]) >= 1
    everything = client.get_inference_statistics(as_json=True)["model_stats"]
    assert {"add_sub", "strings", "repeat"} <= {s["name"] for s in everything}


def test_repository(client, dataplane):
    index = {m["name"]: m for m in client.get_model_repository_index(as_json=True)["models"]}
    assert index["add_sub"]["state"] == "READY" and index["broken"]["state"] == "UNAVAILABLE"
    client.load_model("add_sub", config='{"max_batch_size": 4}', files={"file:1/model.py": b"\x00bin"})
    name, params = dataplane.loaded[-1]
    assert name == "add_sub" and params["config"] == '{"max_batch_size": 4}'
    assert base64.b64decode(params["file:1/model.py"]) == b"\x00bin"
    client.unload_model("strings", unload_dependents=True)
    assert dataplane.unloaded[-1] == ("strings", {"unload_dependents": True})
    with pytest.raises(InferenceServerException) as error:
        client.unload_model("nope")
    assert status_of(error.value) == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as error:
        client.load_model("nope")
    assert status_of(error.value) == "StatusCode.INVALID_ARGUMENT"


def _log_settings(answer: Any) -> dict[str, Any]:
    return {
        name: getattr(value, value.WhichOneof("parameter_choice")) for name, value in answer.settings.items()
    }


def test_log_settings_are_read_and_changed(client, dataplane, url):
    defaults = {
        "log_file": "",
        "log_info": True,
        "log_warning": True,
        "log_error": True,
        "log_verbose_level": 0,
        "log_format": "default",
    }
    assert _log_settings(client.get_log_settings()) == defaults
    try:
        changed = client.update_log_settings(
            {"log_info": False, "log_verbose_level": 2, "log_format": "ISO8601"}
        )
        wanted = {**defaults, "log_info": False, "log_verbose_level": 2, "log_format": "ISO8601"}
        assert _log_settings(changed) == wanted
        assert dataplane.logs.current.to_json() == wanted
        for settings, code, message in (
            ({"log_file": "other.log"}, "StatusCode.UNIMPLEMENTED", "log file location can not be updated"),
            (
                {"log_format": "json"},
                "StatusCode.INVALID_ARGUMENT",
                "invalid argument for log_format, got: json",
            ),
        ):
            with pytest.raises(InferenceServerException) as error:
                client.update_log_settings(settings)
            assert status_of(error.value) == code and message in error.value.message()
        with grpc.insecure_channel(url) as channel:  # a value of the wrong type (tritonclient types by name)
            request = triton_pb.LogSettingsRequest()
            request.settings["log_error"].uint32_param = 0
            with pytest.raises(grpc.RpcError) as refused:
                triton_grpc.GRPCInferenceServiceStub(channel).LogSettings(request)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert refused.value.details() == "expect boolean for 'log_error'"
        assert _log_settings(client.get_log_settings()) == wanted  # a refused update changed nothing
    finally:
        client.update_log_settings({"log_info": True, "log_verbose_level": 0, "log_format": "default"})


@pytest.mark.parametrize(
    ("call", "code"),
    [
        (lambda c: c.register_system_shared_memory("r", "/no-such-key", 64), "StatusCode.INTERNAL"),
        (lambda c: c.register_cuda_shared_memory("r", b"\x00" * 64, 0, 64), "StatusCode.INVALID_ARGUMENT"),
        (lambda c: c.update_trace_settings(settings={"trace_file": "x.json"}), "StatusCode.UNIMPLEMENTED"),
        (lambda c: c.update_trace_settings(settings={"trace_rate": "often"}), "StatusCode.INVALID_ARGUMENT"),
        (lambda c: c.get_trace_settings(model_name="no_such_model"), "StatusCode.INVALID_ARGUMENT"),
        (lambda c: c.get_system_shared_memory_status("r"), "StatusCode.NOT_FOUND"),
    ],
)
def test_shared_memory_and_trace_settings_are_refused_with_tritons_codes(client, call, code):
    with pytest.raises(InferenceServerException) as error:
        call(client)
    assert status_of(error.value) == code, error.value.message()


def test_shared_memory_and_trace_queries_answer(client):
    assert list(client.get_system_shared_memory_status().regions) == []
    assert list(client.get_cuda_shared_memory_status().regions) == []
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory("r")
    assert list(client.get_trace_settings().settings["trace_level"].value) == ["OFF"]


def test_trace_setting_rpc_updates_and_clears_a_models_setting(client):
    """gRPC's form: values are lists of strings; a key sent with no value is cleared, so the model
    follows the global setting again."""
    model = client.get_model_repository_index().models[0].name

    def values(answer):
        return {k: list(v.value) for k, v in answer.settings.items()}

    changed = values(client.update_trace_settings(model_name=model, settings={"trace_rate": "7"}))
    assert changed["trace_rate"] == ["7"] and values(client.get_trace_settings())["trace_rate"] == ["1000"]
    cleared = values(client.update_trace_settings(model_name=model, settings={"trace_rate": None}))
    assert cleared["trace_rate"] == ["1000"]


# --- ModelInfer -------------------------------------------------------------------


def test_infer_raw_tensors(client):
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.full((2, 16), 0.5, np.float32)
    result = client.infer("add_sub", add_sub_inputs(a, b), model_version="1", request_id="r-1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == ("add_sub", "1", "r-1")
    v2 = client.infer("add_sub", add_sub_inputs(a, b), model_version="2")
    np.testing.assert_array_equal(v2.as_numpy("OUTPUT0"), a + b + 1)


def test_infer_requested_outputs(client):
    a = np.ones((1, 16), np.float32)
    result = client.infer(
        "add_sub", add_sub_inputs(a, a), outputs=[grpcclient.InferRequestedOutput("OUTPUT1")]
    )
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT1"]
    assert result.as_numpy("OUTPUT0") is None


def test_infer_bytes(client):
    text = np.array([b"abc", b"", "h\u00e9".encode(), b"\x00\xff"], dtype=object)
    tensor = grpcclient.InferInput("TEXT", [4], "BYTES")
    tensor.set_data_from_numpy(text)
    result = client.infer("strings", [tensor])
    assert result.as_numpy("UPPER").tolist() == [b"ABC", b"", "H\u00e9".encode(), b"\x00\xff"]
    assert result.as_numpy("LENGTH").tolist() == [3, 0, 3, 2]


def test_infer_classification(client, dataplane):
    x = np.array([[1, 0, 0, 0], [0, 0, 1, 0]], dtype=np.float32)
    tensor = grpcclient.InferInput("INPUT", [2, 4], "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer(
        "classifier", [tensor], outputs=[grpcclient.InferRequestedOutput("PROB", class_count=2)]
    )
    top = result.as_numpy("PROB")
    assert top.shape == (2, 2)
    probs = softmax(x @ dataplane.models["classifier"].compute.weights)
    for row, entries in zip(probs, top, strict=True):
        best = np.argsort(-row)[:2]
        expected = [f"{row[i]:f}:{i}:{LABELS[i]}" for i in best]
        assert [e.decode() for e in entries] == expected


def test_infer_parameters(client, dataplane):
    a = np.ones((1, 16), np.float32)
    client.infer(
        "add_sub",
        add_sub_inputs(a, a),
        sequence_id=42,
        sequence_start=True,
        sequence_end=False,
        priority=3,
        timeout=1000,
        parameters={"mode": "fast", "k": 2, "t": 0.5, "on": True},
    )
    request = dataplane.requests[-1]
    assert (request.correlation_id, request.sequence_start, request.sequence_end) == (42, True, False)
    assert (request.priority, request.timeout_us) == (3, 1000)
    assert request.parameters == {"mode": "fast", "k": 2, "t": 0.5, "on": True}
    client.infer("add_sub", add_sub_inputs(a, a), sequence_id="session-a", sequence_end=True)
    assert (dataplane.requests[-1].correlation_id, dataplane.requests[-1].sequence_end) == ("session-a", True)


def test_infer_typed_contents(url):
    """Inputs in InferTensorContents instead of raw contents (what other clients send)."""
    request = triton_pb.ModelInferRequest(model_name="add_sub", model_version="1")
    for name, value in (("INPUT0", 2.0), ("INPUT1", 0.5)):
        tensor = request.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        tensor.contents.fp32_contents.extend([value] * 16)
    with grpc.insecure_channel(url) as channel:
        response = triton_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    out = {o.name: i for i, o in enumerate(response.outputs)}
    total = np.frombuffer(response.raw_output_contents[out["OUTPUT0"]], np.float32)
    np.testing.assert_array_equal(total, np.full(16, 2.5, np.float32))

    request = triton_pb.ModelInferRequest(model_name="strings")
    request.inputs.add(name="TEXT", datatype="BYTES", shape=[2]).contents.bytes_contents.extend([b"a", b"bc"])
    with grpc.insecure_channel(url) as channel:
        response = triton_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert response.outputs[0].name == "UPPER" and response.outputs[0].shape == [2]
    assert response.raw_output_contents[0] == b"\x01\x00\x00\x00A\x02\x00\x00\x00BC"


@pytest.mark.parametrize(
    ("model", "build", "status", "words"),
    [
        ("nope", lambda: [int_input("X", [1], "INT64")], "NOT_FOUND", "unknown model"),
        ("broken", lambda: [int_input("X", [1], "INT64")], "UNAVAILABLE", "not ready"),
        ("add_sub", lambda: [int_input("INPUT0", [1] * 16)], "INVALID_ARGUMENT", "data-type"),
        (
            "add_sub",
            lambda: add_sub_inputs(np.ones((9, 16), np.float32), np.ones((9, 16), np.float32)),
            "INVALID_ARGUMENT",
            "batch-size",
        ),
        (
            "add_sub",
            lambda: add_sub_inputs(np.ones((1, 16), np.float32), np.ones((1, 16), np.float32))[:1],
            "INVALID_ARGUMENT",
            "missing required input",
        ),
        (
            "repeat",
            lambda: [int_input("COUNT", [1]), int_input("VALUE", [1])],
            "UNIMPLEMENTED",
            "ModelInfer RPC doesn't support models with decoupled transaction policy",
        ),
    ],
)
def test_infer_errors(client, model, build, status, words):
    with pytest.raises(InferenceServerException) as error:
        client.infer(model, build())
    assert status_of(error.value) == f"StatusCode.{status}"
    assert words in error.value.message()


def test_a_call_past_its_deadline_is_deadline_exceeded_and_the_next_one_is_answered(url):
    client = grpcclient.InferenceServerClient(url)
    x = [int_input("X", [1, 2, 3], "INT64")]
    with pytest.raises(InferenceServerException) as error:
        client.infer("echo_slow", x, client_timeout=1e-5, parameters={"delay_s": 1.0})
    assert status_of(error.value) == "StatusCode.DEADLINE_EXCEEDED"
    for _ in range(3):
        assert client.infer("echo_slow", x, client_timeout=30).as_numpy("Y").tolist() == [1, 2, 3]
    client.close()


def test_infer_raw_size_mismatch(url):
    request = triton_pb.ModelInferRequest(model_name="echo_slow")
    request.inputs.add(name="X", datatype="INT64", shape=[2])
    request.raw_input_contents.append(b"\x00" * 12)
    with grpc.insecure_channel(url) as channel, pytest.raises(grpc.RpcError) as error:
        triton_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input byte size mismatch for input 'X' for model 'echo_slow'. Expected 16, got 12" in (
        error.value.details()
    )


def test_an_input_in_an_unregistered_region_is_not_found(url):
    request = triton_pb.ModelInferRequest(model_name="echo_slow")
    tensor = request.inputs.add(name="X", datatype="INT64", shape=[1])
    tensor.parameters["shared_memory_region"].string_param = "region"
    tensor.parameters["shared_memory_byte_size"].int64_param = 8
    with grpc.insecure_channel(url) as channel, pytest.raises(grpc.RpcError) as error:
        triton_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    assert error.value.details() == "Unable to find shared memory region: 'region'"


async def test_a_thousand_concurrent_unary_calls_each_get_their_own_answer(url):
    async with aioclient.InferenceServerClient(url) as client:

        async def call(i: int) -> tuple[int, Any]:
            result = await client.infer(
                "echo_slow", [int_input("X", [i, -i], "INT64", aioclient)], request_id=str(i)
            )
            return i, result

        results = await asyncio.gather(*(call(i) for i in range(1000)))
    for i, result in results:
        assert result.get_response().id == str(i)
        assert result.as_numpy("Y").tolist() == [i, -i]


async def test_aio_client_covers_the_unary_rpcs(url):
    async with aioclient.InferenceServerClient(url) as client:
        assert await client.is_server_live()
        assert await client.is_model_ready("strings")
        assert (await client.get_model_metadata("strings", as_json=True))["platform"] == "python"
        assert (await client.get_model_config("add_sub")).config.name == "add_sub"
        with pytest.raises(InferenceServerException) as error:
            await client.get_model_config("nope")
        assert status_of(error.value) == "StatusCode.NOT_FOUND"


# --- ModelStreamInfer ----------------------------------------------------------------


def test_stream_non_decoupled_and_errors_keep_the_stream_open(client):
    answers: list[tuple[Any, Any]] = []
    done = threading.Event()

    def callback(result: Any, error: Any) -> None:
        answers.append((result, error))
        if len(answers) == 3:
            done.set()

    client.start_stream(callback)
    a = np.ones((1, 16), np.float32)
    client.async_stream_infer("add_sub", add_sub_inputs(a, a), request_id="first")
    client.async_stream_infer("nope", add_sub_inputs(a, a), request_id="lost")
    client.async_stream_infer("add_sub", add_sub_inputs(a, 2 * a), request_id="third")
    assert done.wait(10)
    client.stop_stream()
    errors = [e for r, e in answers if e is not None]
    results = {r.get_response().id: r for r, e in answers if r is not None}
    assert len(errors) == 1 and "unknown model" in errors[0].message()
    np.testing.assert_array_equal(results["first"].as_numpy("OUTPUT0"), 2 * a + 1)  # version 2 adds 1
    np.testing.assert_array_equal(results["third"].as_numpy("OUTPUT1"), -a)


def test_a_stream_started_with_triton_grpc_error_ends_at_its_first_error_with_its_status(client):
    """Triton's gRPC status-code mode: the header at the stream's start turns the first error into the
    stream's status (NOT_FOUND for an unknown model); nothing after it is answered."""
    answers: list[tuple[Any, Any]] = []
    ended = threading.Event()

    def callback(result: Any, error: Any) -> None:
        answers.append((result, error))
        if error is not None:
            ended.set()

    client.start_stream(callback, headers={"triton_grpc_error": "true"})
    a = np.ones((1, 16), np.float32)
    client.async_stream_infer("add_sub", add_sub_inputs(a, a), request_id="first")
    assert _wait_for(lambda: len(answers) == 1)
    client.async_stream_infer("nope", add_sub_inputs(a, a), request_id="lost")
    assert ended.wait(10)
    with contextlib.suppress(Exception):  # the stream is over: a later request is not answered
        client.async_stream_infer("add_sub", add_sub_inputs(a, a), request_id="after")
    time.sleep(0.5)
    client.stop_stream()
    (result, _), (_, error) = answers[0], answers[-1]
    assert result.get_response().id == "first" and len(answers) == 2
    assert status_of(error) == "StatusCode.NOT_FOUND" and "unknown model" in error.message()


def _wait_for(check: Any, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False


def test_stream_decoupled_sync_client(client):
    answers: list[Any] = []
    done = threading.Event()

    def callback(result: Any, error: Any) -> None:
        assert error is None, error
        answers.append(result)
        if result.get_response().parameters["triton_final_response"].bool_param:
            done.set()

    client.start_stream(callback)
    client.async_stream_infer(
        "repeat",
        [int_input("COUNT", [3]), int_input("VALUE", [7])],
        request_id="x",
        enable_empty_final_response=True,
    )
    assert done.wait(10)
    client.stop_stream()
    assert [r.as_numpy("INDEX").tolist() for r in answers[:-1]] == [[0], [1], [2]]
    assert all(r.as_numpy("VALUE").tolist() == [7] for r in answers[:-1])
    assert answers[-1].get_response().outputs == [] and len(answers) == 4


@pytest.mark.parametrize("count", [0, 2])
def test_an_empty_final_response_asked_for_carries_no_outputs_whatever_outputs_were_requested(client, count):
    """The flags-only final response of a request that names its outputs (or of one the model answers
    with no data at all) is sent as it is: no outputs, ``triton_final_response`` true."""
    answers: list[Any] = []
    done = threading.Event()

    def callback(result: Any, error: Any) -> None:
        answers.append(result if error is None else error)
        if error is not None or result.get_response().parameters["triton_final_response"].bool_param:
            done.set()

    client.start_stream(callback)
    client.async_stream_infer(
        "repeat",
        [int_input("COUNT", [count]), int_input("VALUE", [7])],
        request_id="x",
        outputs=[grpcclient.InferRequestedOutput("INDEX"), grpcclient.InferRequestedOutput("VALUE")],
        enable_empty_final_response=True,
    )
    assert done.wait(10)
    client.stop_stream()
    assert len(answers) == count + 1 and all(not isinstance(a, Exception) for a in answers), answers
    assert [r.as_numpy("INDEX").tolist() for r in answers[:-1]] == [[i] for i in range(count)]
    final = answers[-1].get_response()
    assert final.outputs == [] and final.id == "x"
    assert final.parameters["triton_final_response"].bool_param


async def test_decoupled_streams_run_concurrently_with_nothing_crossed(url):
    streams, per_stream, count = 6, 8, 5

    async def one_stream(s: int) -> dict[str, list[tuple[int, int]]]:
        async with aioclient.InferenceServerClient(url) as client:

            async def requests():
                for r in range(per_stream):
                    value = s * 1000 + r
                    yield {
                        "model_name": "repeat",
                        "inputs": [
                            int_input("COUNT", [count], module=aioclient),
                            int_input("VALUE", [value], module=aioclient),
                        ],
                        "request_id": f"{s}-{r}",
                    }

            seen: dict[str, list[tuple[int, int]]] = {}
            responses = client.stream_infer(requests())
            async for result, error in responses:
                assert error is None, error
                response = result.get_response()
                assert not response.parameters[
                    "triton_final_response"
                ].bool_param  # empty finals are left out
                pair = (int(result.as_numpy("INDEX")[0]), int(result.as_numpy("VALUE")[0]))
                seen.setdefault(response.id, []).append(pair)
                if sum(len(v) for v in seen.values()) == per_stream * count:
                    responses.cancel()
                    break
            return seen

    results = await asyncio.gather(*(one_stream(s) for s in range(streams)))
    for s, seen in enumerate(results):
        assert sorted(seen) == sorted(f"{s}-{r}" for r in range(per_stream))
        for request_id, pairs in seen.items():
            value = s * 1000 + int(request_id.split("-")[1])
            assert pairs == [(i, value) for i in range(count)]


async def test_stream_error_of_a_decoupled_request_names_it(url):
    async with aioclient.InferenceServerClient(url) as client:

        async def requests():
            yield {
                "model_name": "repeat",
                "inputs": [
                    int_input("COUNT", [-1], module=aioclient),
                    int_input("VALUE", [0], module=aioclient),
                ],
                "request_id": "bad",
            }
            yield {
                "model_name": "repeat",
                "inputs": [
                    int_input("COUNT", [1], module=aioclient),
                    int_input("VALUE", [5], module=aioclient),
                ],
                "request_id": "good",
            }

        answers = []
        responses = client.stream_infer(requests())
        async for result, error in responses:
            answers.append((result, error))
            if len(answers) == 2:
                responses.cancel()
                break
    errors = [e for _, e in answers if e is not None]
    assert len(errors) == 1 and "COUNT must be non-negative" in errors[0].message()
    assert [r.as_numpy("VALUE").tolist() for r, _ in answers if r is not None] == [[5]]


async def test_a_cancelled_stream_cancels_the_models_work(url, dataplane):
    async with aioclient.InferenceServerClient(url) as client:

        async def requests():
            yield {
                "model_name": "repeat",
                "inputs": [
                    int_input("COUNT", [100000], module=aioclient),
                    int_input("VALUE", [1], module=aioclient),
                ],
                "request_id": "long",
            }
            await asyncio.sleep(3600)

        responses = client.stream_infer(requests())
        async for _result, error in responses:
            assert error is None
            responses.cancel()
            break
    for _ in range(100):
        if "long" in dataplane.cancelled:
            break
        await asyncio.sleep(0.05)
    assert "long" in dataplane.cancelled


# --- options ------------------------------------------------------------------


def test_message_size_limits_answer_resource_exhausted(dataplane, transport):
    with running_server(
        dataplane, transport, max_receive_message_bytes=1024, max_send_message_bytes=1024
    ) as address:
        client = grpcclient.InferenceServerClient(address)
        big = np.zeros(4096, np.int64)
        with pytest.raises(InferenceServerException) as error:
            client.infer("echo_slow", [int_input("X", big.tolist(), "INT64")])
        assert status_of(error.value) == "StatusCode.RESOURCE_EXHAUSTED"
        assert "larger than max" in error.value.message()
        client.close()


def test_gzip_compression_both_ways(dataplane, transport):
    with running_server(dataplane, transport, compression="gzip") as address:
        client = grpcclient.InferenceServerClient(address)
        x = np.arange(10000, dtype=np.int64) % 7
        result = client.infer(
            "echo_slow", [int_input("X", x.tolist(), "INT64")], compression_algorithm="gzip"
        )
        np.testing.assert_array_equal(result.as_numpy("Y"), x)
        client.close()


def test_the_response_delay_hook_holds_every_answer_but_inference(dataplane):
    """tritonserver's TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC: a non-inference call misses a short
    deadline and is answered within a long one; inference is not held."""
    with running_server(dataplane, response_delay_s=1.0) as address:
        client = grpcclient.InferenceServerClient(address)
        with pytest.raises(InferenceServerException) as error:
            client.is_server_live(client_timeout=0.2)
        assert status_of(error.value) == "StatusCode.DEADLINE_EXCEEDED"
        with pytest.raises(InferenceServerException) as error:
            client.get_model_metadata("no_such_model", client_timeout=0.2)  # an error is held too
        assert status_of(error.value) == "StatusCode.DEADLINE_EXCEEDED"
        started = time.monotonic()
        assert client.is_server_live(client_timeout=10)
        assert time.monotonic() - started >= 1.0
        x = [int_input("X", [1, 2, 3], "INT64")]
        assert client.infer("echo_slow", x, client_timeout=0.8).as_numpy("Y").tolist() == [1, 2, 3]
        client.close()


def test_the_response_delay_comes_from_tritonservers_variable():
    from deployments.serve.grpc_ingress import grpc_options
    from deployments.settings import GRPC_RESPONSE_DELAY_ENV, ServerSettings

    settings = ServerSettings.from_args({"model_repository": "/tmp"}, environ={GRPC_RESPONSE_DELAY_ENV: "2"})
    assert grpc_options(settings).response_delay_s == 2
    assert (
        grpc_options(ServerSettings.from_args({"model_repository": "/tmp"}, environ={})).response_delay_s == 0
    )
