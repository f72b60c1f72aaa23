"""Triton's trace extension on the shared server (started with ``--trace-config mode=opentelemetry``
and the url of the receiver below; tracing OFF until a test turns it on): the settings over HTTP and
gRPC with the real tritonclient, and the spans every replica exports over OTLP/HTTP, received and
decoded here (tests/serve/otlp_receiver.py): the tree of a plain model, an ensemble whose step runs
on another replica, an ensemble whose steps run in its own replica, a BLS call, and a gRPC call."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serve.otlp_receiver import OtlpReceiver, ReceivedSpan

pytestmark = pytest.mark.serve

CLEARED = {"trace_level": None, "trace_rate": None, "trace_count": None, "log_frequency": None}
HTTP_ROOT_EVENTS = (
    "HTTP_RECV_START",
    "HTTP_RECV_END",
    "INFER_RESPONSE_COMPLETE",
    "HTTP_SEND_START",
    "HTTP_SEND_END",
)
MODEL_EVENTS = ("REQUEST_START", "QUEUE_START", "REQUEST_END")
COMPUTE_EVENTS = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")


@pytest.fixture(scope="module")
def receiver(server_url: str, session_ports: dict[str, int]) -> Iterator[OtlpReceiver]:
    found = OtlpReceiver(session_ports["otlp"])
    yield found
    found.close()


@pytest.fixture
def http(server_url: str) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server_url)
    yield client
    for model in ("", "add_sub"):  # back to the flags' settings, whatever the test changed
        client.update_trace_settings(model_name=model, settings=CLEARED)
    client.close()


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def _add_sub_inputs(module, names: tuple[str, str] = ("INPUT0", "INPUT1")) -> list:
    inputs = []
    for name, value in zip(names, (1.0, 2.0), strict=True):
        tensor = module.InferInput(name, [1, 4], "FP32")
        tensor.set_data_from_numpy(np.full((1, 4), value, np.float32))
        inputs.append(tensor)
    return inputs


def _tree(spans: list[ReceivedSpan]) -> dict[str, list[str]]:
    """Triton's check of a trace's shape: each parent's name -> its children's names, sorted."""
    names = {s.span_id: s.name for s in spans}
    tree: dict[str, list[str]] = {}
    for span in spans:
        if span.parent_span_id in names:
            tree.setdefault(names[span.parent_span_id], []).append(span.name)
    return {parent: sorted(children) for parent, children in tree.items()}


def _received(receiver: OtlpReceiver, trace_id: str, count: int) -> list[ReceivedSpan]:
    receiver.wait_for(lambda spans: sum(s.trace_id == trace_id for s in spans) >= count)
    return receiver.trace(trace_id)


def test_settings_follow_tritons_rules_over_both_protocols(http, grpc_url: str) -> None:
    started = http.get_trace_settings()
    assert started["trace_level"] == ["OFF"] and started["trace_mode"] == "opentelemetry"
    assert started["url"].endswith("/v1/traces") and "trace_file" not in started
    assert http.get_trace_settings(model_name="add_sub") == started
    changed = http.update_trace_settings(model_name="add_sub", settings={"trace_rate": "7"})
    assert changed["trace_rate"] == "7" and http.get_trace_settings()["trace_rate"] == "1000"
    with grpcclient.InferenceServerClient(grpc_url) as grpc:
        answer = grpc.get_trace_settings(model_name="add_sub")
        assert list(answer.settings["trace_rate"].value) == ["7"]
        grpc.update_trace_settings(settings={"trace_count": "5"})
        with pytest.raises(InferenceServerException, match="Request for unknown model : does-not-exist"):
            grpc.get_trace_settings(model_name="does-not-exist")
    assert http.get_trace_settings(model_name="add_sub")["trace_count"] == "5"  # the global one
    cleared = http.update_trace_settings(model_name="add_sub", settings={"trace_rate": None})
    assert cleared["trace_rate"] == "1000"
    with pytest.raises(InferenceServerException, match="trace file location can not be updated"):
        http.update_trace_settings(settings={"trace_file": "model.log"})
    with pytest.raises(InferenceServerException, match="Request for unknown model : does-not-exist"):
        http.get_trace_settings(model_name="does-not-exist")


def test_a_models_request_is_a_root_a_model_span_and_a_compute_span(http, receiver: OtlpReceiver) -> None:
    """Under the client's ``traceparent``, as in Triton's OpenTelemetry tests."""
    http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    header, trace_id, client_span = _traceparent()
    http.infer("add_sub", _add_sub_inputs(httpclient), headers={"traceparent": header}, request_id="r-1")
    spans = _received(receiver, trace_id, 3)
    assert sorted(s.name for s in spans) == ["InferRequest", "add_sub", "compute"]
    assert _tree(spans) == {"InferRequest": ["add_sub"], "add_sub": ["compute"]}
    by_name = {s.name: s for s in spans}
    root, model, compute = by_name["InferRequest"], by_name["add_sub"], by_name["compute"]
    assert root.parent_span_id == client_span and root.events == HTTP_ROOT_EVENTS
    assert model.events == MODEL_EVENTS and compute.events == COMPUTE_EVENTS
    assert (
        model.attributes["triton.model_name"] == "add_sub" and model.attributes["triton.model_version"] == 1
    )
    assert model.attributes["triton.request_id"] == "r-1"
    assert root.resource["service.name"] == "triton-serve-tests"


def test_an_ensemble_step_on_another_replica_is_a_child_of_the_ensembles_span(
    http, receiver: OtlpReceiver
) -> None:
    """The step reaches add_sub's replica over its HTTP port, with ``traceparent``."""
    http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    header, trace_id, _ = _traceparent()
    result = http.infer(
        "add_sub_separate", _add_sub_inputs(httpclient, ("A", "B")), headers={"traceparent": header}
    )
    np.testing.assert_array_equal(result.as_numpy("SUM"), np.full((1, 4), 3.0, np.float32))
    spans = _received(receiver, trace_id, 4)
    assert _tree(spans) == {
        "InferRequest": ["add_sub_separate"],
        "add_sub_separate": ["add_sub"],
        "add_sub": ["compute"],
    }
    ensemble = next(s for s in spans if s.name == "add_sub_separate")
    step = next(s for s in spans if s.name == "add_sub")
    assert step.attributes["triton.trace_parent_id"] == ensemble.attributes["triton.trace_id"]


def test_in_process_ensemble_steps_and_a_bls_call_hang_under_their_models(
    http, receiver: OtlpReceiver
) -> None:
    http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    header, trace_id, _ = _traceparent()
    image = httpclient.InferInput("IMAGE", [1, 32, 100], "UINT8")
    image.set_data_from_numpy(np.random.default_rng(3).integers(0, 255, size=(1, 32, 100), dtype=np.uint8))
    http.infer("text_recognition", [image], headers={"traceparent": header})
    spans = _received(receiver, trace_id, 8)
    assert _tree(spans) == {
        "InferRequest": ["text_recognition"],
        "text_recognition": ["crnn", "crnn_postprocess", "image_preprocess"],
        "crnn": ["compute"],
        "crnn_postprocess": ["compute"],
        "image_preprocess": ["compute"],
    }
    header, trace_id, _ = _traceparent()
    http.infer("bls_traced", _add_sub_inputs(httpclient), headers={"traceparent": header})
    spans = _received(receiver, trace_id, 5)
    assert _tree(spans) == {
        "InferRequest": ["bls_traced"],
        "bls_traced": ["add_sub", "compute"],
        "add_sub": ["compute"],
    }


def test_an_ensemble_with_a_bls_step_is_one_tree_across_three_replicas(http, receiver: OtlpReceiver) -> None:
    """The ensemble's replica calls bls_traced's over its HTTP port, whose BLS call reaches add_sub's:
    each hop carries the parent context, so the spans of three processes make one tree."""
    http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    header, trace_id, _ = _traceparent()
    result = http.infer(
        "bls_ensemble", _add_sub_inputs(httpclient, ("A", "B")), headers={"traceparent": header}
    )
    np.testing.assert_array_equal(result.as_numpy("SUM"), np.full((1, 4), 3.0, np.float32))
    spans = _received(receiver, trace_id, 6)
    assert _tree(spans) == {
        "InferRequest": ["bls_ensemble"],
        "bls_ensemble": ["bls_traced"],
        "bls_traced": ["add_sub", "compute"],
        "add_sub": ["compute"],
    }
    assert len({s.trace_id for s in spans}) == 1


def test_a_grpc_call_and_a_models_own_level(http, grpc_url: str, receiver: OtlpReceiver) -> None:
    """Only add_sub traces (its own setting); the gRPC root span has Triton's GRPC events."""
    http.update_trace_settings(
        model_name="add_sub", settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}
    )
    assert http.get_trace_settings()["trace_level"] == ["OFF"]
    header, trace_id, _ = _traceparent()
    with grpcclient.InferenceServerClient(grpc_url) as grpc:
        grpc.infer("add_sub", _add_sub_inputs(grpcclient), headers={"traceparent": header})
    spans = _received(receiver, trace_id, 3)
    root = next(s for s in spans if s.name == "InferRequest")
    assert (
        root.events[:2] == ("GRPC_WAITREAD_START", "GRPC_WAITREAD_END") and root.events[-1] == "GRPC_SEND_END"
    )
    assert _tree(spans) == {"InferRequest": ["add_sub"], "add_sub": ["compute"]}


def test_the_count_runs_out_and_a_sent_context_is_traced_anyway(http, receiver: OtlpReceiver) -> None:
    """``trace_count`` 2 with rate 1: two requests are traced and the setting reads 0; a request with
    a ``traceparent`` is traced still (Triton's rule for propagated context)."""
    http.update_trace_settings(
        settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "2"}
    )
    marker = f"count-{uuid.uuid4().hex[:8]}"
    for i in range(4):
        http.infer("add_sub", _add_sub_inputs(httpclient), request_id=f"{marker}-{i}")
    assert http.get_trace_settings(model_name="add_sub")["trace_count"] == "0"
    header, trace_id, _ = _traceparent()
    http.infer("add_sub", _add_sub_inputs(httpclient), headers={"traceparent": header})
    assert len(_received(receiver, trace_id, 3)) == 3
    counted = receiver.wait_for(
        lambda spans: (
            sum(str(s.attributes.get("triton.request_id", "")).startswith(marker) for s in spans) >= 2
        )
    )
    assert sum(str(s.attributes.get("triton.request_id", "")).startswith(marker) for s in counted) == 2
