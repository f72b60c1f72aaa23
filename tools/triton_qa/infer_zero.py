"""``L0_infer_zero`` with ``BACKENDS=onnx``: zero-sized tensors through identity models, one server.

The ONNX identity models (batching and ``_nobatch``) come from ``gen_qa_identity_models.py``; the
``simple_zero``, ``sequence_zero`` and ``fan_zero`` ensembles, which every test also asks for whatever
``BACKENDS`` says, from the same script's ``--ensemble``. Their steps are ``nop`` models on Triton's
``identity`` backend (C++), which neither server has: here they are the generated ``nop``
configurations on the Python backend with ``qa/python_models/identity_fp32`` (each ensemble step maps
only ``OUTPUT0``), on both servers. ``infer_zero_test.py`` knows no ``python`` backend (it looks each
name of ``BACKENDS`` up in its validators), so there is no Python variant of the ONNX models.
"""

from __future__ import annotations

from tools.triton_qa.suites import Edit, Model, Run, Suite, env, register

BACKENDS = "onnx"
_IDENTITY = "qa_identity_model_repository"
_ENSEMBLE = "qa_ensemble_identity_model_repository"
# (inputs, dtype) of the identity models the tests ask for, as the generator writes them
IDENTITY_SHAPES = (
    (1, "bool"),
    (1, "float32"),
    (3, "float32"),
    (1, "float16"),
    (3, "float16"),
    (1, "object"),
    (3, "object"),
)
ENSEMBLES = ("simple_zero", "sequence_zero", "fan_zero")
# the nop model each dtype's ensembles step through (STRING has no zero ensembles)
NOP_MODELS = {"bool": "nop_TYPE_BOOL_-1", "float32": "nop_TYPE_FP32_-1", "float16": "nop_TYPE_FP16_-1,-1"}


def _names(prefix: str) -> list[str]:
    return [
        f"{prefix}{batching}_zero_{io}_{dtype}"
        for io, dtype in IDENTITY_SHAPES
        for batching in ("", "_nobatch")
        if not (prefix != "onnx" and dtype == "object")
    ]


def nop_model(name: str) -> Model:
    """A ``nop`` model of the zero ensembles on the Python backend instead of Triton's identity backend."""
    return Model(
        name,
        "generated",
        f"{_ENSEMBLE}/{name}",
        files=(
            ("config.pbtxt", "config.pbtxt"),
            ("qa/python_models/identity_fp32/model.py", "1/model.py"),
        ),
        edits=(Edit(r'backend: "identity"', 'backend: "python"'),),
    )


ONNX_MODELS = tuple(Model(n, "generated", f"{_IDENTITY}/{n}") for n in _names("onnx"))
ENSEMBLE_MODELS = tuple(Model(n, "generated", f"{_ENSEMBLE}/{n}") for e in ENSEMBLES for n in _names(e))
MODELS = (*ONNX_MODELS, *ENSEMBLE_MODELS, *(nop_model(n) for n in NOP_MODELS.values()))

L0_INFER_ZERO = Suite(
    "L0_infer_zero",
    (
        # 47 models, 61 replicas without hosts: on a 2-core machine one model host holds them, as for
        # L0_infer (a replica process per model did not all start within the runner's 300 s here)
        Run(
            "infer_zero",
            "infer_zero_test.py",
            MODELS,
            server_args=("this:--model-hosts=1",),
            env=env(BACKENDS=BACKENDS),
        ),
    ),
    (
        ("graphdef savedmodel libtorch plan models", "TensorFlow / LibTorch / TensorRT do not run here"),
        (
            "onnx models on tritonserver",
            "the tritonserver 2.51 here has the Python backend only: each test stops there at its first "
            "ONNX model, before the ensembles",
        ),
        (
            "nop models of the zero ensembles",
            "Triton's identity backend (C++) is on neither server; a Python identity "
            "(qa/python_models/identity_fp32) stands in on both",
        ),
        (
            "Python variants of the identity models",
            "infer_zero_test.py validates only graphdef savedmodel onnx libtorch (python in BACKENDS "
            "raises KeyError), and test.sh has no Python recipe",
        ),
    ),
)

register(L0_INFER_ZERO)
