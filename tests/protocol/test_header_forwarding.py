"""Triton's --http-header-forward-pattern and --grpc-header-forward-pattern: request headers whose name
matches become string parameters of the inference request the model gets (L0_parameters)."""

from __future__ import annotations

import queue
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from deployments.protocol.http import ServerHTTPApp
from deployments.settings import ServerSettings, SettingsError, compile_header_pattern
from tests.protocol.grpc_fakes import StreamingFakeDataPlane, grpc_models
from tests.protocol.test_grpc import add_sub_inputs, running_server
from tests.protocol.test_http_app import call, infer_body


def test_the_patterns_are_settings_checked_at_start(tmp_path: Path) -> None:
    settings = ServerSettings.from_args(
        {"model_repository": str(tmp_path), "http_header_forward_pattern": "my_header.*"}
    )
    assert (
        settings.http_header_forward_pattern == "my_header.*" and settings.grpc_header_forward_pattern == ""
    )
    assert settings.to_args()["http_header_forward_pattern"] == "my_header.*"
    with pytest.raises(
        SettingsError, match="args.grpc_header_forward_pattern: invalid header forward pattern"
    ):
        ServerSettings.from_args(
            {"model_repository": str(tmp_path), "grpc_header_forward_pattern": "my_(header"}
        )
    assert compile_header_pattern("") is None
    insensitive = compile_header_pattern("MY_HEADER.*")
    sensitive = compile_header_pattern("(?-i)MY_HEADER.*")
    assert insensitive is not None and insensitive.search("my_header_1")
    assert sensitive is not None and not sensitive.search("my_header_1") and sensitive.search("MY_HEADER_1")


async def test_http_headers_that_match_become_request_parameters(tmp_path: Path) -> None:
    plane = StreamingFakeDataPlane(grpc_models(tmp_path))
    app = ServerHTTPApp(plane)
    a = np.ones((1, 16), np.float32)
    headers = {"My_Header_1": "one", "my_header_2": "two", "other": "three"}
    body = infer_body(a, a)
    reply = await call(app, "POST", "/v2/models/add_sub/infer", body, headers)
    assert reply.status == 200 and plane.requests[-1].parameters == {}  # no pattern: nothing forwarded
    app.header_forward = compile_header_pattern("MY_HEADER.*")
    reply = await call(app, "POST", "/v2/models/add_sub/infer", body, headers)
    assert reply.status == 200
    assert plane.requests[-1].parameters == {"my_header_1": "one", "my_header_2": "two"}


@pytest.mark.parametrize("transport", ["grpc", "http1"])
def test_grpc_metadata_that_matches_becomes_request_parameters(tmp_path: Path, transport: str) -> None:
    plane = StreamingFakeDataPlane(grpc_models(tmp_path))
    pattern = compile_header_pattern("MY_HEADER.*")  # ignores case: gRPC metadata keys are lower case
    a = np.ones((1, 16), np.float32)
    metadata = {"my_header_1": "one", "my_header_2": "two", "other": "three"}
    with running_server(plane, transport, header_forward=pattern) as url:
        client = grpcclient.InferenceServerClient(url)
        try:
            client.infer("add_sub", add_sub_inputs(a, a), headers=metadata)
            assert plane.requests[-1].parameters == {"my_header_1": "one", "my_header_2": "two"}
            answers: queue.Queue = queue.Queue()
            client.start_stream(
                callback=lambda result, error: answers.put(error), headers={"my_header_3": "x"}
            )
            client.async_stream_infer("add_sub", add_sub_inputs(a, a))
            assert answers.get(timeout=10) is None
            client.stop_stream()
            assert plane.requests[-1].parameters == {"my_header_3": "x"}
        finally:
            client.close()


def test_a_grpc_parameter_of_tritons_own_prefix_is_refused_in_the_grpc_front_ends_words() -> None:
    from deployments.protocol import grpc_codec
    from deployments.protocol.proto import grpc_service_pb2 as pb
    from repository_loader.errors import InvalidArgument

    message = pb.ModelInferRequest(model_name="m")
    message.parameters["triton_x"].int64_param = 1
    with pytest.raises(InvalidArgument, match="Only the following keys starting with 'triton_' are allowed"):
        grpc_codec.decode_infer_request(message)
    del message.parameters["triton_x"]
    message.parameters["triton_enable_empty_final_response"].bool_param = True
    assert grpc_codec.decode_infer_request(message).parameters == {"triton_enable_empty_final_response": True}
