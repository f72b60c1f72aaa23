"""``L0_implicit_state`` with ``BACKENDS=onnx``: a sequence model's implicit state as an output.

The ONNX sequence model with implicit state (``gen_qa_implicit_models.py``), as ``test.sh`` copies it,
and a copy renamed ``..._output`` that lists the state tensor ``OUTPUT_STATE`` among its outputs, so a
request may ask for it; without that, asking for it is refused. The suite's other five tests are about
Triton's C++ ``implicit_state`` test backend (``libtriton_implicit_state.so``, built from
``src/test/implicit_state``): the errors of its state API calls (an undefined state, a state
configuration missing), a single buffer for input and output state, growable state memory, and a
state never updated. They check what that backend does through Triton's C state API, which a model
here has no counterpart of, so they are left out on both servers.
"""

from __future__ import annotations

from tools.triton_qa.suites import Edit, Model, Run, Suite, env, register

_REPOSITORY = "qa_sequence_implicit_model_repository"
MODEL = "onnx_nobatch_sequence_int32"
CPU = Edit("kind: KIND_GPU", "kind: KIND_CPU")  # the generator asks for a GPU; this machine has none
MODELS = (
    Model(MODEL, "generated", f"{_REPOSITORY}/{MODEL}", edits=(CPU,)),
    Model(
        f"{MODEL}_output",
        "generated",
        f"{_REPOSITORY}/{MODEL}",
        edits=(Edit(r"^name:.*", f'name: "{MODEL}_output"'), CPU),
        append='output [{ name: "OUTPUT_STATE" \n data_type: TYPE_INT32 \n dims: [ 1 ] }]\n',
    ),
)
TESTS = tuple(
    f"ImplicitStateTest.{name}" for name in ("test_request_output_not_allowed", "test_request_output")
)

L0_IMPLICIT_STATE = Suite(
    "L0_implicit_state",
    (
        Run(
            "implicit_state",
            "implicit_state.py",
            MODELS,
            env=env(BACKENDS="onnx", IMPLICIT_STATE="1", ENSEMBLES="0"),
            tests=TESTS,
        ),
    ),
    (
        (
            "test_no_implicit_state, test_wrong_implicit_state_name, test_implicit_state_single_buffer, "
            "test_implicit_state_growable_memory, test_no_update",
            "their models are on Triton's C++ implicit_state test backend, which calls Triton's C state API "
            "(TRITONBACKEND_StateNew and its errors); no model here has that API",
        ),
        ("libtorch and plan models", "LibTorch's implicit-state models and TensorRT do not run here"),
        ("onnx models on tritonserver", "the tritonserver 2.51 here has the Python backend only"),
        ("KIND_GPU instances", "no GPU here: the generated configurations get KIND_CPU on both servers"),
    ),
)

register(L0_IMPLICIT_STATE)
