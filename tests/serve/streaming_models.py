"""Decoupled Python models of the shared Serve instance's repository (tests/serve/test_grpc_e2e.py).

``word_stream`` answers a request with one response per word of ``text_input`` (at most
``max_tokens``) through its response sender, then the final flag alone; the word ``!error`` is
answered with an error that ends the request. ``until_cancelled`` answers every 10 ms until its
request is cancelled, then writes ``<marker dir>/<X>.cancelled``; ``until_cancelled_unary`` (not
decoupled) waits in ``execute`` for the same, and answers CANCELLED.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

WORD_STREAM_PY = textwrap.dedent(
    """
    import threading
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.threads = []

        def execute(self, requests):
            for request in requests:
                text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
                limit = pb_utils.get_input_tensor_by_name(request, "max_tokens")
                words = text.decode().split()
                if limit is not None:
                    words = words[: int(limit.as_numpy().reshape(-1)[0])]
                thread = threading.Thread(target=self.respond, args=(request.get_response_sender(), words))
                thread.start()
                self.threads.append(thread)
            return None

        def respond(self, sender, words):
            for index, word in enumerate(words):
                if word == "!error":
                    error = pb_utils.TritonError("the model refused the word '!error'")
                    sender.send(
                        pb_utils.InferenceResponse(error=error),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                    )
                    return
                time.sleep(0.001)
                out = pb_utils.Tensor("text_output", np.array([word.encode()], dtype=np.object_))
                idx = pb_utils.Tensor("index", np.array([index], dtype=np.int32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out, idx]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

        def finalize(self):
            for thread in self.threads:
                thread.join()
    """
)

WORD_STREAM_CONFIG = """
name: "word_stream"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true }
]
output [
  { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "index" data_type: TYPE_INT32 dims: [ 1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

# written whole, then renamed: a test that polls for the marker never reads it half-written
MARK_CANCELLED = textwrap.dedent(
    """
    def mark_cancelled(marker_dir, x, step):
        path = os.path.join(marker_dir, f"{x}.cancelled")
        with open(path + ".part", "w") as f:
            f.write(str(step))
        os.replace(path + ".part", path)

    """
)

UNTIL_CANCELLED_PY = textwrap.dedent(
    """
    import json
    import os
    import threading
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            config = json.loads(args["model_config"])
            self.marker_dir = config["parameters"]["MARKER_DIR"]["string_value"]
            self.threads = []

        def execute(self, requests):
            for request in requests:
                x = int(pb_utils.get_input_tensor_by_name(request, "X").as_numpy().reshape(-1)[0])
                thread = threading.Thread(target=self.respond, args=(request, x))
                thread.start()
                self.threads.append(thread)
            return None

        def respond(self, request, x):
            sender = request.get_response_sender()
            for step in range(3000):
                if request.is_cancelled():
                    mark_cancelled(self.marker_dir, x, step)
                    break
                out = pb_utils.Tensor("Y", np.array([step], dtype=np.int32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
                time.sleep(0.01)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

        def finalize(self):
            for thread in self.threads:
                thread.join()
    """
).replace("class TritonPythonModel", MARK_CANCELLED + "class TritonPythonModel")


UNTIL_CANCELLED_UNARY_PY = textwrap.dedent(
    """
    import json
    import os
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            config = json.loads(args["model_config"])
            self.marker_dir = config["parameters"]["MARKER_DIR"]["string_value"]

        def execute(self, requests):
            responses = []
            for request in requests:
                x = int(pb_utils.get_input_tensor_by_name(request, "X").as_numpy().reshape(-1)[0])
                error = None
                for step in range(3000):
                    if request.is_cancelled():
                        mark_cancelled(self.marker_dir, x, step)
                        error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
                        break
                    time.sleep(0.01)
                out = pb_utils.Tensor("Y", np.array([x], dtype=np.int32))
                responses.append(pb_utils.InferenceResponse(output_tensors=[out], error=error))
            return responses
    """
).replace("class TritonPythonModel", MARK_CANCELLED + "class TritonPythonModel")


def until_cancelled_config(marker_dir: Path, name: str = "until_cancelled", decoupled: bool = True) -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: {str(decoupled).lower()} }}
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }} ]
parameters {{ key: "MARKER_DIR" value: {{ string_value: "{marker_dir}" }} }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


def add_streaming_models(repo: Path) -> Path:
    """Write the models into ``repo``; returns the folder where the ``until_cancelled`` models leave
    their markers."""
    markers = repo.parent / "cancel_markers"
    markers.mkdir(exist_ok=True)
    for name, source, config in (
        ("word_stream", WORD_STREAM_PY, WORD_STREAM_CONFIG),
        ("until_cancelled", UNTIL_CANCELLED_PY, until_cancelled_config(markers)),
        (
            "until_cancelled_unary",
            UNTIL_CANCELLED_UNARY_PY,
            until_cancelled_config(markers, "until_cancelled_unary", decoupled=False),
        ),
    ):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(source)
        (repo / name / "config.pbtxt").write_text(config)
    return markers
