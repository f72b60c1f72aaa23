"""``L0_decoupled``: decoupled models and ensembles of them over gRPC streams, and a decoupled model's
refusal outside a stream.

``test.sh`` runs ``DecoupledTest`` twice, on a repository whose ``repeat_int32`` and ``square_int32`` are
the Python backend's examples and on one where they are Triton's C++ ``repeat`` and ``square`` backends;
``identity_int32`` is on the C++ ``identity`` backend in both. None of those files is in the checkout
(Triton's qa image copies them in), so each is a Python stand-in written here with the same
configuration and behaviour, on both servers, and the two trials are one run:

* ``repeat_int32`` answers each element ``IN[i]`` of a request with a response ``OUT = [IN[i]]``,
  ``IDX = [i]`` after ``DELAY[i]`` milliseconds, then the final flag alone; ``IN`` and ``DELAY`` of
  different shapes is an error response;
* ``square_int32`` answers ``IN = [n]`` with ``n`` responses ``OUT = [n]``;
* ``libtorch_nobatch_int32_int32_int32`` (in ``fan_repeat``) is the real TorchScript model of
  ``gen_qa_models.py --libtorch``, with ``test.sh``'s ``dims: [ 1 ]`` edit.

``test_one_to_multi_many`` runs with ``TRITONSERVER_DELAY_GRPC_RESPONSE=2000`` (tritonserver delays each
gRPC response it writes by as many milliseconds), and ``NonDecoupledTest`` against ``repeat_int32`` made
non-decoupled, as ``test.sh`` does.
"""

from __future__ import annotations

from tools.triton_qa.models import OWN_MODELS
from tools.triton_qa.suites import Edit, Model, Run, Suite, env, generated, register

_REPEAT_CONFIG = """name: "repeat_int32"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: True }
input [
  { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
  { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] }
]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

# each request answered from a thread of its own in decoupled mode, in execute otherwise
_REPEAT_MODEL = """import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        import json

        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.threads = []

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
            sender = request.get_response_sender()
            if values.shape != delays.shape:
                message = (
                    f"expected IN and DELAY shape to match, got {list(values.shape)} and {list(delays.shape)}"
                )
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)), flags=FINAL)
                continue
            if not self.decoupled:
                self.answer(sender, values, delays)
                continue
            thread = threading.Thread(target=self.answer, args=(sender, values, delays), daemon=True)
            thread.start()
            self.threads.append(thread)
        self.threads = [t for t in self.threads if t.is_alive()]
        return None

    def answer(self, sender, values, delays):
        for i, (value, delay) in enumerate(zip(values.tolist(), delays.tolist())):
            time.sleep(delay / 1000)
            outputs = [
                pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                pb_utils.Tensor("IDX", np.array([i], dtype=np.uint32)),
            ]
            sender.send(pb_utils.InferenceResponse(output_tensors=outputs))
        sender.send(flags=FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
"""

_SQUARE_CONFIG = """name: "square_int32"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: True }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

_SQUARE_MODEL = """import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            thread = threading.Thread(target=self.answer, args=(request.get_response_sender(), value))
            thread.daemon = True
            thread.start()
            self.threads.append(thread)
        self.threads = [t for t in self.threads if t.is_alive()]
        return None

    def answer(self, sender, value):
        for _ in range(value):
            out = pb_utils.Tensor("OUT", np.array([value], dtype=np.int32))
            sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
"""

OWN_MODELS["repeat_int32"] = {"config.pbtxt": _REPEAT_CONFIG, "1/model.py": _REPEAT_MODEL}
OWN_MODELS["square_int32"] = {"config.pbtxt": _SQUARE_CONFIG, "1/model.py": _SQUARE_MODEL}

_FOLDER = "qa/L0_decoupled/models"
REPEAT = Model("repeat_int32", "own", "repeat_int32")
MODELS = (
    REPEAT,
    Model("square_int32", "own", "square_int32"),
    Model(
        "identity_int32",
        "folder",
        f"{_FOLDER}/identity_int32",
        files=(("own:identity/1/model.py", "1/model.py"),),
        edits=(Edit(r'^backend: "identity"', 'backend: "python"'),),
    ),
    generated(
        "libtorch_nobatch_int32_int32_int32",
        "qa_libtorch_model_repository/libtorch_nobatch_int32_int32_int32",
        Edit(r"dims:.*\[.*\]", "dims: [ 1 ]", scope="all"),
    ),
    *(
        Model(name, "folder", f"{_FOLDER}/{name}", version_folders=("1",))
        for name in ("fan_repeat", "nested_square", "repeat_square", "sequence_repeat", "simple_repeat")
    ),
)
TESTS = tuple(
    f"DecoupledTest.{name}"
    for name in (
        "test_one_to_none",
        "test_one_to_one",
        "test_one_to_many",
        "test_no_streaming",
        "test_response_order",
        "test_wrong_shape",
    )
)
_NON_DECOUPLED = Model(
    "repeat_int32", "own", "repeat_int32", edits=(Edit("decoupled: True", "decoupled: False"),)
)
_STAND_IN_WHY = "a Python stand-in with the same configuration and behaviour is used on both servers"

L0_DECOUPLED = Suite(
    "L0_decoupled",
    (
        Run("decoupled", "decoupled_test.py", MODELS, tests=TESTS, timeout_s=1800.0),
        Run(
            "delayed gRPC responses",
            "decoupled_test.py",
            MODELS,
            env=env(TRITONSERVER_DELAY_GRPC_RESPONSE="2000"),
            tests=("DecoupledTest.test_one_to_multi_many",),
            timeout_s=900.0,
        ),
        Run("non-decoupled", "decoupled_test.py", (_NON_DECOUPLED,), tests=("NonDecoupledTest",)),
    ),
    (
        (
            "models repeat_int32, square_int32",
            "the Python backend's examples and Triton's C++ repeat and square backends, copied in by Triton's "
            f"qa image; {_STAND_IN_WHY}, so test.sh's python and custom trials are one run",
        ),
        ("model identity_int32", f"on Triton's C++ identity backend; {_STAND_IN_WHY}"),
        (
            "libtorch_nobatch_int32_int32_int32 on tritonserver",
            "the tritonserver here has the Python backend only: fan_repeat fails there",
        ),
    ),
)

register(L0_DECOUPLED)
