"""``L0_sequence_stress``: eight client threads run random sequences over gRPC streams, 200 each.

``sequence_stress.py`` (a script: its exit status is the result) mixes sequences of every length,
sequences sent without START, and sequences whose requests pause between steps, each checked step by
step against the running sum, within 5 s per sequence. ``test.sh`` runs it on three repositories of the
one model: one instance with ``max_batch_size`` 4, two with 2, four with 1.

``custom_sequence_int32`` is on Triton's C++ ``sequence`` test backend (``src/test/sequence``): here a
Python stand-in written by the runner with the same behaviour, on both servers: an INT32 accumulator
per batch slot of each instance, set on START, added to while READY, its value in every element of
``OUTPUT``, ``execute_delay_ms`` before each batch.
"""

from __future__ import annotations

from tools.triton_qa.models import OWN_MODELS
from tools.triton_qa.suites import Edit, Model, Run, Suite, register

_SEQUENCE_MODEL = """import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.batching = config.get("max_batch_size", 0) > 0
        self.accumulators = [0] * max(config.get("max_batch_size", 0), 1)
        delay = config.get("parameters", {}).get("execute_delay_ms", {}).get("string_value") or "0"
        self.delay_s = int(delay) / 1000

    def execute(self, requests):
        if self.delay_s:
            time.sleep(self.delay_s)
        responses = []
        for slot, request in enumerate(requests):
            start = int(pb_utils.get_input_tensor_by_name(request, "START").as_numpy().reshape(-1)[0])
            ready = int(pb_utils.get_input_tensor_by_name(request, "READY").as_numpy().reshape(-1)[0])
            values = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().reshape(-1).astype(np.int32)
            if ready:
                if start:
                    self.accumulators[slot] = int(values.sum())
                else:
                    self.accumulators[slot] += int(values.sum())
            out = np.full(values.shape, self.accumulators[slot], dtype=np.int32)
            shape = (1, values.size) if self.batching else (values.size,)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out.reshape(shape))]))
        return responses
"""
OWN_MODELS["sequence"] = {"1/model.py": _SEQUENCE_MODEL}


def _model(instances: int, batch: int) -> Model:
    """``test.sh``'s copy of the model for one repository: ``instances`` instances of ``batch`` slots."""
    return Model(
        "custom_sequence_int32",
        "folder",
        "qa/custom_models/custom_sequence_int32",
        files=(("own:sequence/1/model.py", "1/model.py"),),
        edits=(
            Edit(r'^backend: "sequence"', 'backend: "python"'),
            Edit(r"^default_model_filename:.*", ""),
            Edit(r"max_sequence_idle_microseconds:.*", "max_sequence_idle_microseconds: 1000000"),
            Edit(r"^max_batch_size:.*", f"max_batch_size: {batch}"),
            Edit(r"kind: KIND_CPU", f"kind: KIND_CPU\ncount: {instances}"),
        ),
    )


L0_SEQUENCE_STRESS = Suite(
    "L0_sequence_stress",
    tuple(
        Run(f"models{instances}", "sequence_stress.py", (_model(instances, batch),), runner="script")
        for instances, batch in ((1, 4), (2, 2), (4, 1))
    ),
    (
        (
            "model custom_sequence_int32",
            "on Triton's C++ sequence test backend; a Python stand-in with the same behaviour is used on "
            "both servers",
        ),
    ),
)

register(L0_SEQUENCE_STRESS)
