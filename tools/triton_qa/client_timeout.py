"""``L0_client_timeout``: client-side timeouts on every API, and a server that serves on after them.

``client_infer_timeout_test.py`` calls a model that takes 3 s per request with a short timeout (gRPC
unary and async, a gRPC stream's timeout, HTTP's network timeout), expects the client's deadline error,
then calls again with a long one and expects the answer. ``client_non_infer_timeout_test.py`` runs
under ``TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC=2`` (a test hook that delays every gRPC answer but
inference by that many seconds) and expects every non-inference gRPC call with a 0.1 s deadline to fail
and the same call with a long one to answer.

``custom_identity_int32`` is on Triton's C++ identity backend: here the runner's Python identity with
the suite's configuration (it sleeps ``execute_delay_ms``), on both servers.
"""

from __future__ import annotations

from tools.triton_qa.suites import Edit, Model, Run, Suite, env, register

MODELS = (
    Model(
        "custom_identity_int32",
        "folder",
        "qa/L0_client_timeout/models/custom_identity_int32",
        files=(("own:identity/1/model.py", "1/model.py"),),
        edits=(Edit(r'^backend: "identity"', 'backend: "python"'),),
        version_folders=("1",),
    ),
)
_VERBOSE = "--log-verbose=2"

L0_CLIENT_TIMEOUT = Suite(
    "L0_client_timeout",
    (
        Run("client_infer_timeout_test", "client_infer_timeout_test.py", MODELS, server_args=(_VERBOSE,)),
        Run(
            "client_non_infer_timeout_test",
            "client_non_infer_timeout_test.py",
            MODELS,
            server_args=(_VERBOSE, "--model-control-mode=explicit", "--load-model=custom_identity_int32"),
            env=env(TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC="2"),
        ),
    ),
    (
        (
            "model custom_identity_int32",
            "on Triton's C++ identity backend; the runner's Python identity with the same configuration is "
            "used on both servers",
        ),
        ("client_timeout_test (C++)", "built C++ clients are not in the checkout"),
    ),
)

register(L0_CLIENT_TIMEOUT)
