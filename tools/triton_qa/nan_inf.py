"""``L0_nan_inf``: a Python model whose output holds NaN and the infinities, read back over HTTP
(binary and JSON) and gRPC. ``test.sh`` serves the suite's own repository and runs the test file once.
The suite's model and test build the expected values with ``np.NINF``, which NumPy 2 removed: the test
runs with the alias restored (``unittest_junit.keep_numpy1_aliases``); the model runs as it is, in the
server's own environment.
"""

from __future__ import annotations

from tools.triton_qa.suites import Model, Run, Suite, register

L0_NAN_INF = Suite(
    "L0_nan_inf",
    (
        Run(
            "nan_inf",
            "nan_inf_test.py",
            (Model("nan_inf_output", "folder", "qa/L0_nan_inf/models/nan_inf_output"),),
        ),
    ),
)

register(L0_NAN_INF)
