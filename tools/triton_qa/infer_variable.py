"""``L0_infer_variable``: variable-shape add/sub models, ``test.sh``'s ``cpu`` target, one server.

``test.sh`` copies the variable-shape model repository that ``gen_qa_models.py --variable`` writes,
appends a ``KIND_CPU`` instance group to each model's configuration and runs every test of
``infer_variable_test.py`` (then again with ``KIND_GPU``). Of that repository the ONNX models are
built here: the non-batching ones, the only ONNX models the tests ask for, one per dtype triple.
The test file does not read ``BACKENDS``: each test asks for the GraphDef, SavedModel, TensorRT and
LibTorch models (and their ensembles) as well, gated only by ``test_util``'s validators, so the run
has ``only_backends=("onnx",)``: those validators of every other backend say no
(``tools/triton_qa/restrict``) on both servers, and the tests try the ONNX models alone.
"""

from __future__ import annotations

from tools.triton_qa.suites import Model, Run, Suite, register

_VARIABLE = "qa_variable_model_repository"
# (input, output0, output1) dtypes of the tests, as the models' names spell them
DTYPES = (
    ("float32", "float32", "float32"),
    ("float32", "int32", "int32"),
    ("float32", "int64", "int64"),
    ("float32", "int32", "int64"),
    ("float32", "float32", "int32"),
    ("int32", "int32", "int32"),
    ("int32", "int32", "float32"),
    ("object", "object", "object"),
    ("object", "int32", "int32"),
    ("object", "object", "int32"),
    ("object", "int32", "object"),
)
CPU_INSTANCES = "instance_group [ { kind: KIND_CPU }]\n"

ONNX_MODELS = tuple(
    Model(name, "generated", f"{_VARIABLE}/{name}", append=CPU_INSTANCES)
    for name in ("onnx_nobatch_" + "_".join(dtypes) for dtypes in DTYPES)
)

L0_INFER_VARIABLE = Suite(
    "L0_infer_variable",
    (
        Run(
            "cpu",
            "infer_variable_test.py",
            ONNX_MODELS,
            server_args=("--exit-timeout-secs=120",),
            only_backends=("onnx",),
        ),
    ),
    (
        (
            "graphdef savedmodel plan libtorch models and their ensembles",
            "TensorFlow / TensorRT / LibTorch do not run here; infer_variable_test.py asks for them "
            "regardless of BACKENDS, so test_util's validators of those backends say no on both servers "
            "(only_backends)",
        ),
        (
            "onnx models on tritonserver",
            "the tritonserver 2.51 here has the Python backend only",
        ),
        ("the gpu target (KIND_GPU)", "no GPU here; with KIND_CPU it would repeat the cpu run"),
        (
            "batching ONNX models and the ONNX ensembles",
            "built by test.sh but asked for by no test (only the LibTorch models are tried with batching)",
        ),
    ),
)

register(L0_INFER_VARIABLE)
