"""``L0_iterative_sequence``: a decoupled model that reschedules its request until it is done.

The suite's model is on Triton's C++ test backend ``iterative_sequence`` (``src/test/iterative_sequence``
of the server repository, source only). Here it is a Python-based backend written by the runner, in the
run's backend directory, on both servers: per correlation ID it counts down from the value of ``INPUT``,
answers each step's count in ``OUTPUT`` (``[1, 1]`` where the model batches), takes half a second per
step, and releases the request with ``RESCHEDULE`` until the count reaches 0, whose response is FINAL.
The tests load it with configurations of their own: an iterative sequence (a backlog, a short idle
limit), and the direct, oldest and dynamic schedulers, which must refuse the rescheduling.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.triton_qa.python_based import link_python_backend
from tools.triton_qa.suites import Model, Run, Suite, register

BACKENDS = "backends"  # the run's --backend-directory, relative to the suite's folder

STAND_IN = """import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import json

        self.batching = json.loads(args["model_config"]).get("max_batch_size", 0) > 0
        self.remaining = {}

    def execute(self, requests):
        for request in requests:
            cid = request.correlation_id()
            start = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().flatten()[0])
            left = self.remaining.setdefault(cid, start) - 1
            if left <= 0:
                self.remaining.pop(cid, None)
            else:
                self.remaining[cid] = left
            shape = (1, 1) if self.batching else (1,)
            output = pb_utils.Tensor("OUTPUT", np.full(shape, left, dtype=np.int32))
            time.sleep(0.5)
            sender = request.get_response_sender()
            if left > 0:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(pb_utils.InferenceResponse([output]))
            else:
                sender.send(
                    pb_utils.InferenceResponse([output]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                )
        return None
"""


def prepare(suite_dir: Path, build: Callable[[Any, Path], None]) -> None:
    backends = suite_dir / BACKENDS
    shutil.rmtree(backends, ignore_errors=True)
    (backends / "iterative_sequence").mkdir(parents=True)
    (backends / "iterative_sequence" / "model.py").write_text(STAND_IN)
    link_python_backend(backends)


L0_ITERATIVE_SEQUENCE = Suite(
    "L0_iterative_sequence",
    (
        Run(
            "iterative_sequence",
            "iterative_sequence_e2e.py",
            (
                Model(
                    "iterative_sequence",
                    "folder",
                    "qa/L0_iterative_sequence/models/iterative_sequence",
                    version_folders=("1",),
                ),
            ),
            server_args=(
                f"--backend-directory={{qa}}/L0_iterative_sequence/{BACKENDS}",
                "--model-control-mode=explicit",
            ),
            prepare=prepare,
            # a refused RESCHEDULE never reaches the client on tritonserver's Python backend (it logs the
            # release's error and ends the request): its unsupported-scheduler tests wait for the answer
            timeout_s=180.0,
        ),
    ),
    (
        (
            "model iterative_sequence",
            "on Triton's C++ iterative_sequence test backend; a Python-based backend with the same behaviour "
            "is used on both servers",
        ),
    ),
)

register(L0_ITERATIVE_SEQUENCE)
