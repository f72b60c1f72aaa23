"""``L0_parameters``: request parameters, and headers forwarded as parameters, reach a Python model
directly and through an ensemble.

``test.sh`` starts one server per test with ``parameters_test.py``'s ``TEST_HEADER`` naming it: no
header forwarding, ``--grpc-header-forward-pattern`` and ``--http-header-forward-pattern my_header.*``,
the same in upper case (matching ignores case), and ``(?-i)MY_HEADER.*`` for gRPC alone (case-sensitive:
nothing forwarded). The suite's ``identity`` model is on Triton's C++ identity backend: here a Python
identity with the same configuration, on both servers.

One header the tests send ends in a space. HTTP (RFC 9110) and HTTP/2 (RFC 9113) leave whitespace around
a field value out of it, and HAProxy in front of this server does so: the model gets the value without
the space, where tritonserver (no proxy in front) keeps it.
"""

from __future__ import annotations

from types import MappingProxyType

from tools.triton_qa.suites import Edit, Model, Run, Suite, register

_FOLDER = "qa/L0_parameters/model_repository"
MODELS = (
    Model(
        "identity",
        "folder",
        f"{_FOLDER}/identity",
        files=(("own:identity/1/model.py", "1/model.py"),),
        version_folders=("1",),
        edits=(Edit(r'^backend: "identity"', 'backend: "python"'),),
    ),
    Model("parameter", "folder", f"{_FOLDER}/parameter"),
    Model("ensemble", "folder", f"{_FOLDER}/ensemble", version_folders=("1",)),
)
_TIMEOUT = "--exit-timeout-secs=120"
# (TEST_HEADER, the server's flags besides the timeout)
RUNS = (
    ("test_params", ()),
    (
        "test_headers",
        ("--grpc-header-forward-pattern=my_header.*", "--http-header-forward-pattern=my_header.*"),
    ),
    (
        "test_header_forward_pattern_case_insensitive",
        ("--grpc-header-forward-pattern=MY_HEADER.*", "--http-header-forward-pattern=MY_HEADER.*"),
    ),
    ("test_grpc_header_forward_pattern_case_sensitive", ("--grpc-header-forward-pattern=(?-i)MY_HEADER.*",)),
)

L0_PARAMETERS = Suite(
    "L0_parameters",
    tuple(
        Run(
            label,
            "parameters_test.py",
            MODELS,
            server_args=(_TIMEOUT, *flags),
            env=MappingProxyType({"TEST_HEADER": label}),
        )
        for label, flags in RUNS
    ),
    (
        (
            "model identity",
            "on Triton's C++ identity backend; a Python identity with the same configuration is used on both "
            "servers",
        ),
    ),
)

register(L0_PARAMETERS)
