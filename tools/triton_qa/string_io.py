"""``L0_string_io``: BYTES tensors, UTF-8 or not, through two string identity models, one server.

``string_client_test.py`` sends the same strings to ``graphdef_nobatch_zero_1_object`` (Triton's
TensorFlow identity model) and to the Python model ``string_identity`` (its dims ``[ 1 ]`` made
``[ 8 ]``, as ``test.sh`` does). TensorFlow does not run here, so the GraphDef model is a stand-in with
the same inputs and outputs: the ONNX identity model's configuration from ``gen_qa_identity_models.py``
on the Python backend with ``string_identity``'s ``model.py``, on both servers.
"""

from __future__ import annotations

from tools.triton_qa.suites import Edit, Model, Run, Suite, python_model, register

GRAPHDEF_STAND_IN = Model(
    "graphdef_nobatch_zero_1_object",
    "generated",
    "qa_identity_model_repository/onnx_nobatch_zero_1_object",
    files=(
        ("config.pbtxt", "config.pbtxt"),
        ("qa/python_models/string_identity/model.py", "1/model.py"),
    ),
    edits=(
        Edit(r'^name: ".*"', 'name: "graphdef_nobatch_zero_1_object"'),
        Edit(r"^platform:.*", 'backend: "python"'),
    ),
)
STRING_IDENTITY = python_model("string_identity", edits=(Edit(r"\[ 1 \]", "[ 8 ]"),))

L0_STRING_IO = Suite(
    "L0_string_io",
    (Run("string_client_test", "string_client_test.py", (GRAPHDEF_STAND_IN, STRING_IDENTITY)),),
    (
        (
            "model graphdef_nobatch_zero_1_object",
            "a TensorFlow GraphDef; a Python stand-in with the same inputs and outputs (the ONNX identity "
            "model's configuration, string_identity's model.py) is used on both servers",
        ),
    ),
)

register(L0_STRING_IO)
