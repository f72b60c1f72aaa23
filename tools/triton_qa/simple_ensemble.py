"""``L0_simple_ensemble``: an ensemble of four steps over two versions of ``simple``, and sequence flags
sent through an ensemble on a gRPC stream.

``test.sh`` starts a server for each ``EnsembleTest`` method (the tests read ``simple``'s statistics per
version). ``simple`` is Triton's example TensorFlow GraphDef, in versions 1 and 2: here the suite's own
``config.pbtxt`` on the Python backend with the add/sub stand-in of the runner's ``simple`` in both
versions, on both servers.
"""

from __future__ import annotations

from tools.triton_qa.suites import NO_SIMPLE_WHY, Edit, Model, Run, Suite, register

_FOLDER = "qa/L0_simple_ensemble/models"
MODELS = (
    Model(
        "simple",
        "folder",
        f"{_FOLDER}/simple",
        files=(("own:simple/1/model.py", "1/model.py"), ("own:simple/1/model.py", "2/model.py")),
        edits=(Edit(r"^platform:.*", 'backend: "python"'),),
    ),
    Model(
        "ensemble_add_sub_int32_int32_int32",
        "folder",
        f"{_FOLDER}/ensemble_add_sub_int32_int32_int32",
        version_folders=("1",),
    ),
)
TESTS = tuple(
    f"EnsembleTest.{name}"
    for name in ("test_ensemble_add_sub", "test_ensemble_sequence_flags", "test_ensemble_add_sub_one_output")
)

L0_SIMPLE_ENSEMBLE = Suite(
    "L0_simple_ensemble",
    (Run("ensemble", "ensemble_test.py", MODELS, tests=TESTS, server_per_test=True),),
    (("model simple (versions 1 and 2)", NO_SIMPLE_WHY),),
)

register(L0_SIMPLE_ENSEMBLE)
