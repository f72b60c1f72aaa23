"""``L0_optional_input``: optional inputs, sent or left out, through a batching model and ensembles.

``test.sh`` restarts the server before each test (the tests read the model's statistics: how requests
with different sets of inputs were batched) and runs one ``OptionalInputTest`` method against it. The
suite's ``identity_2_float32`` is on Triton's C++ identity backend: here a Python identity with the same
configuration (dynamic batching included), on both servers; ``optional_identity`` is the suite's own
Python model.
"""

from __future__ import annotations

from tools.triton_qa.suites import Edit, Model, Run, Suite, register

_FOLDER = "qa/L0_optional_input/models"
MODELS = (
    Model(
        "identity_2_float32",
        "folder",
        f"{_FOLDER}/identity_2_float32",
        files=(("own:identity/1/model.py", "1/model.py"),),
        edits=(Edit(r'^backend: "identity"', 'backend: "python"'),),
        version_folders=("1",),
    ),
    *(
        Model(name, "folder", f"{_FOLDER}/{name}", version_folders=("1",))
        for name in (
            "ensemble_identity_2_float32",
            "pipeline_identity_2_float32",
            "optional_connecting_tensor",
        )
    ),
    Model("optional_identity", "folder", f"{_FOLDER}/optional_identity"),
)
TESTS = tuple(
    f"OptionalInputTest.{name}"
    for name in (
        "test_all_inputs",
        "test_optional_same_input",
        "test_optional_mix_inputs",
        "test_optional_mix_inputs_2",
        "test_ensemble_all_inputs",
        "test_ensemble_optional_same_input",
        "test_ensemble_optional_mix_inputs",
        "test_ensemble_optional_mix_inputs_2",
        "test_ensemble_optional_pipeline",
        "test_ensemble_optional_connecting_tensor",
    )
)

L0_OPTIONAL_INPUT = Suite(
    "L0_optional_input",
    (
        Run(
            "optional_input",
            "optional_input_test.py",
            MODELS,
            server_args=("--log-verbose=1",),
            tests=TESTS,
            server_per_test=True,
        ),
    ),
    (
        (
            "model identity_2_float32",
            "on Triton's C++ identity backend; a Python identity with the same configuration is used on both "
            "servers",
        ),
    ),
)

register(L0_OPTIONAL_INPUT)
