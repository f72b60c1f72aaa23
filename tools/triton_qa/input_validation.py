"""``L0_input_validation``: missing, empty and optional inputs, and inputs whose data does not match their
shape, each refused with Triton's words.

``test.sh`` runs ``InputValTest`` against the suite's three Python models, then ``InputShapeTest``
against a TorchScript identity (``pt_identity``, made with ``torch.jit.script`` as ``test.sh`` makes it),
a TensorFlow model of BYTES inputs and two TensorRT shape-tensor models. TensorFlow does not run here:
``graphdef_object_int32_int32`` is a Python stand-in with the configuration of the ONNX model of the same
types, on both servers. The TensorRT models cannot be built here; the C++ ``input_byte_size_test`` is a
binary, not a Python test.
"""

from __future__ import annotations

from tools.triton_qa.suites import Edit, Model, Run, Suite, register

_FOLDER = "qa/L0_input_validation/models"
PYTHON_MODELS = tuple(
    Model(name, "folder", f"{_FOLDER}/{name}")
    for name in ("input_all_optional", "input_all_required", "input_optional")
)
PT_IDENTITY = Model("pt_identity", "own", "pt_identity")
OBJECT_STAND_IN = Model(
    "graphdef_object_int32_int32",
    "generated",
    "qa_model_repository/onnx_object_int32_int32",
    files=(
        ("config.pbtxt", "config.pbtxt"),
        ("output0_labels.txt", "output0_labels.txt"),
        ("own:object_addsub/1/model.py", "1/model.py"),
    ),
    edits=(
        Edit(r'^name: ".*"', 'name: "graphdef_object_int32_int32"'),
        Edit(r"^platform:.*", 'backend: "python"'),
    ),
)
TENSORRT_SHAPE_MODELS = (
    "plan_nobatch_zero_1_float32_int32: a TensorRT plan with shape tensors",
    "plan_zero_1_float32_int32: a TensorRT plan with shape tensors",
)

L0_INPUT_VALIDATION = Suite(
    "L0_input_validation",
    (
        Run("input_val", "input_validation_test.py", PYTHON_MODELS, tests=("InputValTest",), runner="pytest"),
        Run(
            "input_shape",
            "input_validation_test.py",
            (PT_IDENTITY, OBJECT_STAND_IN),
            tests=("InputShapeTest",),
            runner="pytest",
            not_here=(
                ("InputShapeTest.test_wrong_input_shape_tensor_size", "asks for TensorRT shape-tensor plans"),
            ),
        ),
    ),
    (
        (
            "model graphdef_object_int32_int32",
            "a TensorFlow GraphDef; a Python stand-in with the ONNX model's configuration of the same types "
            "is used on both servers",
        ),
        *((name, why) for name, _, why in (m.partition(": ") for m in TENSORRT_SHAPE_MODELS)),
        ("input_byte_size_test", "a C++ client binary"),
        ("pt_identity on tritonserver", "the tritonserver here has the Python backend only"),
    ),
)

register(L0_INPUT_VALIDATION)
