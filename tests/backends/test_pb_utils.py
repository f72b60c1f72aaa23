"""The public API of triton_python_backend_utils, checked against Triton's definitions."""

from __future__ import annotations

import json

import numpy as np
import pytest

import triton_python_backend_utils as pb_utils
from deployments.backends.registry import backend_class, create_backend
from repository_loader.errors import ErrorCode, Unavailable, Unsupported
from tests.backends.helpers import context, describe


def test_type_tables_follow_triton_codes() -> None:
    assert pb_utils.triton_to_numpy_type(11) == np.float32
    assert pb_utils.triton_to_numpy_type(13) == np.object_
    assert pb_utils.numpy_to_triton_type(np.int64) == 9
    assert pb_utils.numpy_to_triton_type(np.object_) == 13
    assert pb_utils.triton_string_to_numpy("TYPE_FP16") == np.float16
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") == np.object_


def test_bytes_serialization_round_trips() -> None:
    values = np.array([[b"a", b""], ["é".encode(), b"\x00\xff"]], dtype=object)
    wire = pb_utils.serialize_byte_tensor(values)
    assert wire.item()[:5] == b"\x01\x00\x00\x00a"
    assert list(pb_utils.deserialize_bytes_tensor(wire.item())) == list(values.reshape(-1))
    assert pb_utils.serialize_byte_tensor(np.array([], dtype=object)) is None


def test_tensor_api() -> None:
    data = np.arange(6, dtype=np.int32).reshape(2, 3)
    tensor = pb_utils.Tensor("T", data)
    assert tensor.name() == "T" and tensor.is_cpu() and tensor.shape() == [2, 3]
    assert tensor.triton_dtype() == 8
    assert tensor.as_numpy() is data
    shared = pb_utils.Tensor.from_dlpack("S", tensor.to_dlpack())
    assert shared.as_numpy().ctypes.data == data.ctypes.data
    strings = pb_utils.Tensor("S", np.array(["x", "yz"]))
    assert strings.as_numpy().dtype == np.object_ and list(strings.as_numpy()) == [b"x", b"yz"]
    with pytest.raises(pb_utils.TritonModelException):
        strings.to_dlpack()


def test_errors_carry_triton_codes() -> None:
    error = pb_utils.TritonError("nope", pb_utils.TritonError.NOT_FOUND)
    assert error.message() == "nope" and error.code() == 2
    assert pb_utils.TritonError("x").code() == pb_utils.TritonError.INTERNAL
    codes = [
        getattr(pb_utils.TritonError, n)
        for n in (
            "UNKNOWN",
            "INTERNAL",
            "NOT_FOUND",
            "INVALID_ARG",
            "UNAVAILABLE",
            "UNSUPPORTED",
            "ALREADY_EXISTS",
            "CANCELLED",
        )
    ]
    assert codes == list(range(8))
    from deployments.backends.python_api.errors import to_server_error

    assert [to_server_error(pb_utils.TritonError("m", c)).code for c in codes] == list(ErrorCode)


def test_request_and_response_objects() -> None:
    x = pb_utils.Tensor("X", np.ones(2, np.float32))
    req = pb_utils.InferenceRequest(
        model_name="m", requested_output_names=["Y"], inputs=[x], parameters={"k": 1}
    )
    assert req.model_name() == "m" and req.requested_output_names() == ["Y"]
    assert (
        pb_utils.get_input_tensor_by_name(req, "X") is x
        and pb_utils.get_input_tensor_by_name(req, "Z") is None
    )
    assert json.loads(req.parameters()) == {"k": 1}
    server = req.to_server()
    assert server.inputs["X"] is x.data() and [o.name for o in server.requested_outputs] == ["Y"]
    response = pb_utils.InferenceResponse(output_tensors=[x])
    assert not response.has_error() and pb_utils.get_output_tensor_by_name(response, "X") is x
    # as Triton's bindings take them: any sequence of tensors; None is a TypeError, a None in it is refused
    assert pb_utils.InferenceResponse(output_tensors=(x,)).output_tensors() == [x]
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse(output_tensors=None)  # type: ignore[arg-type]
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceResponse(output_tensors=[None])  # type: ignore[list-item]
    with pytest.raises(pb_utils.TritonModelException, match="response sender"):
        req.get_response_sender()


def test_config_helpers() -> None:
    config = {
        "input": [{"name": "A", "data_type": "TYPE_FP32"}],
        "output": [{"name": "B"}],
        "model_transaction_policy": {"decoupled": True},
    }
    assert pb_utils.get_input_config_by_name(config, "A")["data_type"] == "TYPE_FP32"
    assert pb_utils.get_output_config_by_name(config, "A") is None
    assert pb_utils.using_decoupled_model_transaction_policy(config)
    assert pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL == 1


def test_logger(caplog: pytest.LogCaptureFixture) -> None:
    from deployments.backends.python_api.bls import BlsBridge
    from deployments.backends.python_api.context import reset_bridge, set_bridge

    token = set_bridge(BlsBridge(None, model_name="m"), default=False)
    try:
        with caplog.at_level("DEBUG", logger="triton_python_backend"):
            pb_utils.Logger.log_info("info line")
            pb_utils.Logger.log_warn("warn line")
            pb_utils.Logger.log_error("error line")
            pb_utils.Logger.log_verbose("verbose line")
            pb_utils.Logger.log("leveled", pb_utils.Logger.LogLevel.ERROR)
            pb_utils.Logger.log("default level")
            pb_utils.Logger.log("exported level", pb_utils.Logger.WARNING)
    finally:
        reset_bridge(token)
    levels = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert levels == [
        ("INFO", "model 'm': info line"),
        ("WARNING", "model 'm': warn line"),
        ("ERROR", "model 'm': error line"),
        ("DEBUG", "model 'm': verbose line"),
        ("ERROR", "model 'm': leveled"),
        ("INFO", "model 'm': default level"),
        ("WARNING", "model 'm': exported level"),
    ]
    assert {r.filename for r in caplog.records} == {"test_pb_utils.py"}  # the caller's line, as Triton logs


def test_registry_errors(tmp_path) -> None:
    with pytest.raises(Unsupported, match="caffe"):
        backend_class("caffe2", "m")
    ensemble = describe("ens", tmp_path, "", [], [])
    ensemble = type(ensemble)(**{**ensemble.__dict__, "platform": "ensemble"})
    # ensembles are registered like any other backend, by the ensembles package as it is imported
    import ensembles  # noqa: F401

    assert type(create_backend(context(ensemble))).__name__ == "EnsembleBackend"
    assert backend_class("onnxruntime_onnx").__name__ == "OnnxRuntimeBackend"
    assert backend_class("pytorch_libtorch").__name__ == "PyTorchBackend"
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        with pytest.raises(Unavailable, match="'tensorrt' package"):
            backend_class("tensorrt_plan", "plan_model")


def test_metric_family_api() -> None:
    from deployments import custom_metrics

    family = pb_utils.MetricFamily("api_requests", "Requests", pb_utils.MetricFamily.COUNTER)
    metric = family.Metric(labels={"model": "m", "version": "1"})
    metric.increment(2)
    metric.increment(0.5)
    assert metric.value() == 2.5
    same = pb_utils.MetricFamily("api_requests", "Requests", pb_utils.MetricFamily.COUNTER).Metric(
        labels={"version": "1", "model": "m"}
    )
    assert same.value() == 2.5  # one metric per family and label set
    with pytest.raises(pb_utils.TritonModelException, match="negative"):
        metric.increment(-1)
    with pytest.raises(pb_utils.TritonModelException, match="gauge"):
        metric.set(3)
    with pytest.raises(pb_utils.TritonModelException, match="already exists as a counter"):
        pb_utils.MetricFamily("api_requests", "Requests", pb_utils.MetricFamily.GAUGE)
    # another description: the same family, its first description kept
    again = pb_utils.MetricFamily("api_requests", "Other", pb_utils.MetricFamily.COUNTER)
    assert again.Metric(labels={"model": "m", "version": "1"}).value() == 2.5
    (described,) = [f for f in custom_metrics.snapshot() if f["name"] == "api_requests"]
    assert described["description"] == "Requests"
    # its family object is gone: as in tritonserver, the family is deleted and its metric refuses use
    dropped = pb_utils.MetricFamily("api_dropped", "Dropped", pb_utils.MetricFamily.COUNTER).Metric()
    with pytest.raises(
        pb_utils.TritonModelException, match="Failed to increment metric value: .*has been deleted"
    ):
        dropped.increment(1)
    gauge_family = pb_utils.MetricFamily("api_temperature", "A gauge", pb_utils.MetricFamily.GAUGE)
    gauge = gauge_family.Metric()
    gauge.set(-1.25)
    gauge.increment(-1)
    assert gauge.value() == -2.25
    histogram_family = pb_utils.MetricFamily(
        "api_latency", 'Latency "quoted"\\n', pb_utils.MetricFamily.HISTOGRAM, buckets=[0.1, 1]
    )
    histogram = histogram_family.Metric(labels={"path": 'a"b'})
    for value in (0.05, 0.1, 0.5, 3):
        histogram.observe(value)
    with pytest.raises(pb_utils.TritonModelException, match="histogram"):
        histogram.value()
    with pytest.raises(pb_utils.TritonModelException, match="buckets"):
        pb_utils.MetricFamily("api_nobuckets", "h", pb_utils.MetricFamily.HISTOGRAM).Metric()
    text = custom_metrics.render_prometheus()
    assert "api_dropped" not in text
    assert (
        "# HELP api_requests Requests\n# TYPE api_requests counter\n"
        'api_requests{model="m",version="1"} 2.5\n' in text
    )
    assert "# TYPE api_temperature gauge\napi_temperature -2.25\n" in text
    assert (
        '# HELP api_latency Latency "quoted"\\\\n\n# TYPE api_latency histogram\n'
        'api_latency_count{path="a\\"b"} 4\n'
        'api_latency_sum{path="a\\"b"} 3.65\n'
        'api_latency_bucket{path="a\\"b",le="0.1"} 2\n'
        'api_latency_bucket{path="a\\"b",le="1"} 3\n'
        'api_latency_bucket{path="a\\"b",le="+Inf"} 4\n' in text
    )
    assert (
        text.index("# TYPE api_requests")
        < text.index("# TYPE api_temperature")
        < text.index("# TYPE api_latency")
    )
    del metric, same, family
    import gc

    gc.collect()
    assert "api_requests" not in custom_metrics.render_prometheus()  # gone with the model's objects


def test_snapshots_sum_across_replicas() -> None:
    from deployments.custom_metrics import format_value, merge_snapshots, render_prometheus

    replica = [
        {
            "name": "c",
            "description": "d",
            "kind": "counter",
            "metrics": [{"labels": {"model": "m"}, "value": 2.0}],
        },
        {
            "name": "h",
            "description": "d",
            "kind": "histogram",
            "metrics": [{"labels": {}, "buckets": [1.0], "counts": [1, 2], "sum": 7.5}],
        },
    ]
    merged = merge_snapshots([replica, replica])
    assert render_prometheus(merged) == (
        '# HELP c d\n# TYPE c counter\nc{model="m"} 4\n'
        "# HELP h d\n# TYPE h histogram\nh_count 6\nh_sum 15\n"
        'h_bucket{le="1"} 2\nh_bucket{le="+Inf"} 6\n'
    )
    assert [format_value(v) for v in (1e20, 0.1, float("nan"), float("-inf"))] == [
        "1e+20",
        "0.1",
        "Nan",
        "-Inf",
    ]


def test_model_config_helpers_for_auto_complete() -> None:
    config = pb_utils.ModelConfig('{"name": "m", "max_batch_size": 0, "input": [], "output": []}')
    config.set_max_batch_size(4)
    config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [2], "optional": True})
    config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [2]})
    config.set_dynamic_batching()
    config.set_model_transaction_policy({"decoupled": True})
    completed = config.as_dict()
    assert completed["max_batch_size"] == 4 and "dynamic_batching" in completed
    assert completed["model_transaction_policy"] == {"decoupled": True}
    assert pb_utils.get_input_config_by_name(completed, "IN")["optional"] is True
    with pytest.raises(ValueError):
        config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [2]})


def test_arguments_are_checked_as_tritons_bindings_check_them() -> None:
    """L0_backend_python's argument_validation: None where a typed argument is expected is a TypeError."""
    x = pb_utils.Tensor("X", np.zeros(2, np.float32))
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceRequest(inputs=[None], model_name="m", requested_output_names=[])  # type: ignore[list-item]
    for bad in (
        {"inputs": None},
        {"model_name": None},
        {"requested_output_names": None},
        {"requested_output_names": [None]},
        {"correlation_id": None},
        {"request_id": None},
        {"model_version": None},
        {"flags": None},
    ):
        arguments = {"inputs": [x], "model_name": "m", "requested_output_names": ["Y"], **bad}
        with pytest.raises(TypeError):
            pb_utils.InferenceRequest(**arguments)  # type: ignore[arg-type]
    assert pb_utils.InferenceRequest(inputs=[], model_name="m", requested_output_names=[], correlation_id=5)
    for name, data in ((None, np.zeros(1)), ("OUTPUT0", None), ("", None)):
        with pytest.raises(TypeError):
            pb_utils.Tensor(name, data)  # type: ignore[arg-type]
    for name in ("OUTPUT0", ""):
        with pytest.raises(pb_utils.TritonModelException):
            pb_utils.Tensor.from_dlpack(name, None)
    logger = pb_utils.Logger
    for call in (
        lambda: logger.log("x", None),
        lambda: logger.log("x", 1),
        lambda: logger.log_info(None),
        lambda: logger.log_warn(None),
        lambda: logger.log_error(None),
        lambda: logger.log_verbose(None),
    ):
        with pytest.raises(TypeError):
            call()
    logger.log("Level unspecified")
