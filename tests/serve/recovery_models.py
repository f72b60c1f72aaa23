"""Small Python models for the recovery, timeout and soak tests: ``OUTPUT0 = INPUT0 + 1`` after a short
sleep, one with two replicas, and one that never returns for a negative input (touching the file named
by the request parameter ``hang_marker`` first, when there is one)."""

from __future__ import annotations

import textwrap
from pathlib import Path

MODEL_PY = textwrap.dedent(
    """
    import json
    import pathlib
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                if float(x.reshape(-1)[0]) < 0:
                    marker = json.loads(request.parameters()).get("hang_marker")
                    if marker:  # tells a test that the instance is now held
                        pathlib.Path(marker).touch()
                    while True:  # a hung model: never returns
                        time.sleep(3600)
                time.sleep(0.01)
                out = pb_utils.Tensor("OUTPUT0", (x + 1).astype(np.float32))
                responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            return responses
    """
)


def _config(name: str, count: int, extra: str = "") -> str:
    return (
        textwrap.dedent(
            f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 8
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        instance_group [ {{ count: {count} kind: KIND_CPU }} ]
        """
        )
        + extra
    )


def build(root: Path) -> Path:
    """``add_one`` (1 replica), ``add_two_replicas`` (2), ``hangs`` (1, execution_timeout_ms 1500), and
    ``api_loaded`` and ``doomed`` (1 each), which tests load through the repository API."""
    repo = root / "recovery_repo"
    for name, count, extra in (
        ("add_one", 1, ""),
        ("api_loaded", 1, ""),
        ("doomed", 1, ""),
        ("add_two_replicas", 2, ""),
        ("hangs", 1, 'parameters { key: "execution_timeout_ms" value: { string_value: "1500" } }\n'),
    ):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(MODEL_PY)
        (repo / name / "config.pbtxt").write_text(_config(name, count, extra))
    return repo


def infer_body(value: float, **parameters: object) -> dict[str, object]:
    body: dict[str, object] = {
        "inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [value] * 4}]
    }
    if parameters:
        body["parameters"] = parameters
    return body
