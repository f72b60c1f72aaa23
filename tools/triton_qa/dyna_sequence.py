"""``L0_dyna_sequence_batcher``: the sequence batcher's ``oldest`` strategy, a fresh server per test.

``test.sh`` puts every model of ``qa_dyna_sequence_model_repository`` (or its implicit-state twin) and
the custom ``dyna_sequence`` models in one folder, with ``count: 1`` on each instance group, and runs:

* ``test_simple_sequence`` and ``test_length1_sequence`` with ``NO_BATCHING=1`` (each backend's
  batching model and its ``nobatch`` model);
* the multi-sequence and backlog tests after ``max_candidate_sequences:4`` and
  ``max_queue_delay_microseconds:5000000`` edits, with ``NO_BATCHING=0``;
* ``test_multi_sequence_different_shape_allow_ragged`` on the custom model with ``allow_ragged_batch``.

``TRITONSERVER_DELAY_SCHEDULER`` is never set (the tests assert so). Each backend here is a set of runs
of its own, with ``BACKENDS`` naming it, so a server that cannot load one backend's models fails only
that backend's tests:

* ``onnx``: the ONNX models of ``gen_qa_dyna_sequence_models.py`` (``READY * (INPUT + START + END *
  CORRID)``, no state); the tritonserver here has the Python backend only, so only this server can
  run them;
* ``onnx implicit state``: ``IMPLICIT_STATE=1`` and the ONNX models of
  ``gen_qa_dyna_sequence_implicit_models.py`` (a running sum in the sequence's implicit state);
* ``custom``: ``custom_dyna_sequence_int32`` and its ``TYPE_STRING`` CORRID copy. Triton's is a C++
  backend (``src/test/dyna_sequence``), not in the checkout's models; here a Python stand-in with the
  same configuration and behaviour (an accumulator per correlation ID in each instance, the ID added on
  END, the sum in every element of ``OUTPUT``, ``execute_delay_ms`` before each batch), on both
  servers. Its runs are the only ones where both servers run the same models, and the only ones where
  the ``different_shape`` tests have a trial (``_ragged_batch_supported_trials`` is ``custom``).
"""

from __future__ import annotations

from tools.triton_qa.models import OWN_MODELS
from tools.triton_qa.suites import Edit, Model, Run, Suite, env, generated, register

NO_BATCHING_TESTS = ("test_simple_sequence", "test_length1_sequence")
QUEUE_DELAY_TESTS = (
    "test_multi_sequence_different_shape",
    "test_multi_sequence",
    "test_multi_parallel_sequence",
    "test_backlog",
    "test_backlog_fill",
    "test_backlog_fill_no_end",
    "test_backlog_sequence_timeout",
)
RAGGED_TESTS = ("test_multi_sequence_different_shape_allow_ragged",)

# test.sh's sed edits: one instance per group, then (for the queue-delay tests) four candidate
# sequences and a five-second queue delay
ONE_INSTANCE = Edit("kind: KIND_CPU", "kind: KIND_CPU\ncount: 1")
QUEUE_DELAY = (
    Edit("max_candidate_sequences:.*", "max_candidate_sequences:4"),
    Edit("max_queue_delay_microseconds:.*", "max_queue_delay_microseconds:5000000"),
)
RAGGED = Edit(r'name:.*"INPUT"', 'name: "INPUT"\nallow_ragged_batch: true')

# the dyna_sequence C++ backend's accumulator, as a Python model
_DYNA_SEQUENCE_MODEL = '''"""Triton's ``dyna_sequence`` test backend: an INT32 accumulator per correlation ID in each instance.

READY=1, START=1 sets it to the sum of INPUT's elements; READY=1, START=0 adds that sum; END=1 adds the
correlation ID (a STRING one read as a number) and forgets it; the value fills every element of OUTPUT.
READY=0 leaves it and answers nothing useful. Two requests of one ID in a batch are an error.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        delay = config.get("parameters", {}).get("execute_delay_ms", {}).get("string_value") or "0"
        self.delay_s = int(delay) / 1000
        self.accumulators = {}

    def execute(self, requests):
        if self.delay_s:
            time.sleep(self.delay_s)
        responses = []
        seen = set()
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            start, end, ready = (
                int(pb_utils.get_input_tensor_by_name(request, n).as_numpy().flatten()[0])
                for n in ("START", "END", "READY")
            )
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy().flatten()[0]
            if isinstance(corrid, (bytes, np.bytes_, str)):
                text = corrid.decode() if isinstance(corrid, bytes) else str(corrid)
                try:
                    corrid = int(text)
                except ValueError:
                    message = "dyna sequence backend expects correlation ID to be decodable into an integer"
                    responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)))
                    continue
            corrid = int(corrid)
            if corrid in seen:
                message = (
                    "Execute() called with batch containing multiple inferences requests for the same "
                    "Correlation ID"
                )
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)))
                continue
            seen.add(corrid)
            value = 0
            if ready:
                total = int(values.astype(np.int64).sum())
                base = 0 if start else self.accumulators.get(corrid, 0)
                value = base + total + (corrid if end else 0)
                if end:
                    self.accumulators.pop(corrid, None)
                else:
                    self.accumulators[corrid] = value
            output = np.full(values.shape, value, dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", output)]))
        return responses
'''

OWN_MODELS["dyna_sequence"] = {"model.py": _DYNA_SEQUENCE_MODEL}

_CUSTOM = "qa/custom_models/custom_dyna_sequence_int32"
_ON_PYTHON = (
    Edit(r'^backend: "dyna_sequence"', 'backend: "python"'),
    Edit(r"^default_model_filename:.*", ""),
    ONE_INSTANCE,
)


def custom_models(*edits: Edit) -> tuple[Model, ...]:
    """``custom_dyna_sequence_int32`` and ``custom_string_dyna_sequence_int32`` (CORRID ``TYPE_STRING``)
    on the Python stand-in, with ``test.sh``'s edits and then ``edits``."""
    stand_in = (("own:dyna_sequence/model.py", "1/model.py"),)
    string = (
        Edit("custom_dyna_sequence_int32", "custom_string_dyna_sequence_int32", scope="all"),
        Edit("data_type: TYPE_UINT64", "data_type: TYPE_STRING"),  # the CORRID control's type
    )
    return (
        Model("custom_dyna_sequence_int32", "folder", _CUSTOM, files=stand_in, edits=(*_ON_PYTHON, *edits)),
        Model(
            "custom_string_dyna_sequence_int32",
            "folder",
            _CUSTOM,
            files=stand_in,
            edits=(*_ON_PYTHON, *string, *edits),
        ),
    )


def onnx_models(repository: str, *edits: Edit) -> tuple[Model, ...]:
    """The batching and ``nobatch`` ONNX models of ``repository``, with ``count: 1`` and ``edits``."""
    return tuple(
        generated(name, f"{repository}/{name}", ONE_INSTANCE, *edits)
        for name in ("onnx_dyna_sequence_int32", "onnx_nobatch_dyna_sequence_int32")
    )


def _phase(
    label: str, backends: str, implicit: bool, models: tuple[Model, ...], tests: tuple[str, ...]
) -> Run:
    """One of ``test.sh``'s loops for one backend: a server per test, ``NO_BATCHING`` as the loop sets it."""
    return Run(
        label,
        "dyna_sequence_batcher_test.py",
        models,
        env=env(
            BACKENDS=backends,
            NO_BATCHING="1" if tests == NO_BATCHING_TESTS else "0",
            IMPLICIT_STATE="1" if implicit else "0",
        ),
        tests=tuple(f"DynaSequenceBatcherTest.{t}" for t in tests),
        server_per_test=True,
    )


def _runs() -> list[Run]:
    """Each backend's no-batching run, then its queue-delay run (and the custom model's ragged run)."""
    runs = []
    for label, repository, implicit in (
        ("onnx", "qa_dyna_sequence_model_repository", False),
        ("onnx implicit state", "qa_dyna_sequence_implicit_model_repository", True),
    ):
        runs.append(
            _phase(f"{label}, no batching", "onnx", implicit, onnx_models(repository), NO_BATCHING_TESTS)
        )
        queue_tests = QUEUE_DELAY_TESTS[1:]  # different_shape has no onnx trial: it would pass empty
        runs.append(
            _phase(
                f"{label}, queue delay", "onnx", implicit, onnx_models(repository, *QUEUE_DELAY), queue_tests
            )
        )
    custom = "custom custom_string"
    runs.append(_phase("custom, no batching", custom, False, custom_models(), NO_BATCHING_TESTS))
    runs.append(_phase("custom, queue delay", custom, False, custom_models(*QUEUE_DELAY), QUEUE_DELAY_TESTS))
    ragged = custom_models(RAGGED, *QUEUE_DELAY)[:1]  # test.sh's ragged_models: the UINT64 model alone
    runs.append(_phase("custom, ragged", custom, False, ragged, RAGGED_TESTS))
    return runs


L0_DYNA_SEQUENCE_BATCHER = Suite(
    "L0_dyna_sequence_batcher",
    tuple(_runs()),
    (
        ("graphdef, savedmodel, libtorch and plan trials", "TensorFlow, TorchScript and TensorRT models"),
        (
            "custom_dyna_sequence_int32 (C++ dyna_sequence backend)",
            "not built here; a Python stand-in with the same configuration and behaviour runs, on both servers",
        ),
        ("onnx trials on tritonserver", "the tritonserver 2.51 here has the Python backend only"),
        (
            "test_multi_sequence_different_shape on the onnx runs",
            "it has trials for the custom backend only; it runs in the custom run",
        ),
        ("test.sh's grep of the client log for HTTP 200 responses", "a shell step, not a Python test"),
    ),
)

register(L0_DYNA_SEQUENCE_BATCHER)
