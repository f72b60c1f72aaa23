"""``instance_group { passive: true }`` on the shared server (EXPLICIT mode): a passive group's
instances are loaded, as Triton loads them, but no request reaches them, over HTTP (HAProxy) or gRPC,
even where the passive group comes first in the config; a model whose groups are all passive is
READY and answers each request UNAVAILABLE instead of waiting forever."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serve.test_model_control_e2e import post

pytestmark = pytest.mark.serve

MIXED = "pv_mixed"
IDLE = "pv_idle"

MODEL_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.instance = args["model_instance_name"]

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            name = np.array([self.instance.encode()], dtype=np.object_)
            out.append(
                pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("OUTPUT0", x), pb_utils.Tensor("INSTANCE", name)]
                )
            )
        return out
"""


def _write(repo: Path, name: str, groups: str) -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "1" / "model.py").write_text(MODEL_PY)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },'
        ' { name: "INSTANCE" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
        f"instance_group [ {groups} ]\n"
    )


def _serve_apps(model: str) -> dict[str, list[str]]:
    """The model's Serve applications now, each with its replicas' states."""
    from deployments.serve import hooks
    from repository_loader.plan import is_group_app, model_app_name

    return {
        name: [
            str(getattr(r["state"], "value", r["state"]))
            for deployment in app["deployments"].values()
            for r in deployment["replicas"]
        ]
        for name, app in hooks.serve_details()["applications"].items()
        if name == model_app_name(model) or is_group_app(name, model)
    }


@pytest.fixture
def loaded(server_url: str, test_repository: Path):
    _write(
        test_repository,
        MIXED,
        '{ name: "idle" count: 1 kind: KIND_CPU passive: true }, { name: "busy" count: 1 kind: KIND_CPU }',
    )
    _write(test_repository, IDLE, '{ name: "still" count: 1 kind: KIND_CPU passive: true }')
    try:
        for name in (MIXED, IDLE):
            status, body = post(server_url, f"/v2/repository/models/{name}/load")
            assert status == 200, body
        yield
    finally:
        for name in (MIXED, IDLE):
            post(server_url, f"/v2/repository/models/{name}/unload")


def test_a_passive_group_is_loaded_and_never_given_a_request(
    loaded: None, server_url: str, grpc_url: str
) -> None:
    apps = _serve_apps(MIXED)
    # both groups run: the passive one loaded apart from the model's own application
    assert apps == {"model-pv_mixed": ["RUNNING"], "model-pv_mixed--passive-1": ["RUNNING"]}, apps
    x = np.arange(4, dtype=np.float32)
    answered: list[str] = []
    http = httpclient.InferenceServerClient(server_url)
    try:
        assert http.is_model_ready(MIXED)
        for _ in range(10):
            inp = httpclient.InferInput("INPUT0", [4], "FP32")
            inp.set_data_from_numpy(x)
            result = http.infer(MIXED, [inp])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
            answered.append(result.as_numpy("INSTANCE")[0].decode())
    finally:
        http.close()
    grpc = grpcclient.InferenceServerClient(grpc_url)
    try:
        for _ in range(6):
            inp = grpcclient.InferInput("INPUT0", [4], "FP32")
            inp.set_data_from_numpy(x)
            answered.append(grpc.infer(MIXED, [inp]).as_numpy("INSTANCE")[0].decode())
    finally:
        grpc.close()
    # Triton's instance names: "<group name>_<index>"; only the group that is not passive answers
    assert answered == ["busy_0"] * 16, answered


def test_a_model_whose_groups_are_all_passive_is_ready_and_refuses_each_request(
    loaded: None, server_url: str, grpc_url: str
) -> None:
    assert _serve_apps(IDLE) == {"model-pv_idle": ["RUNNING"]}
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]}
    ).encode()
    request = urllib.request.Request(f"http://{server_url}/v2/models/{IDLE}/infer", data=body, method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 503
    error = json.loads(refused.value.read())["error"]
    assert "every instance group of the model is passive" in error and IDLE in error, error
    grpc = grpcclient.InferenceServerClient(grpc_url)
    try:
        assert grpc.is_model_ready(IDLE)
        inp = grpcclient.InferInput("INPUT0", [4], "FP32")
        inp.set_data_from_numpy(np.zeros(4, dtype=np.float32))
        with pytest.raises(InferenceServerException) as failed:
            grpc.infer(IDLE, [inp], client_timeout=60)
        assert failed.value.status() == "StatusCode.UNAVAILABLE", failed.value
        assert "passive" in failed.value.message()
    finally:
        grpc.close()
