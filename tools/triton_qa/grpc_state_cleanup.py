"""``L0_grpc_state_cleanup``: gRPC calls and streams that end early (cancelled by the client, past their
deadline, refused by the restricted protocol) leave a server that answers the next ones.

``cleanup_test.py`` runs unary calls, streams and decoupled streams to ``custom_zero_1_float32`` (an
identity that takes 1 s per request) and ``repeat_int32``, cancels them, lets them time out, or sends
them without the restricted protocol's header (``--grpc-restricted-protocol``), then checks the answers
of the next calls; ``test_non_decoupled_streaming_multi_response`` sends a stream request to
``repeat_int32`` made non-decoupled. ``test.sh`` starts a server per test and counts the state objects
tritonserver's verbose log says it created and released: a check of that log, not a Python test.

``custom_zero_1_float32`` is on Triton's C++ identity backend, and ``repeat_int32`` comes from outside the
checkout (Triton's qa image): the runner's Python identity and repeat stand-in (see ``decoupled.py``) with
the same configurations, on both servers.
"""

from __future__ import annotations

from tools.triton_qa.decoupled import REPEAT
from tools.triton_qa.suites import Edit, Model, Run, Suite, register

IDENTITY = Model(
    "custom_zero_1_float32",
    "folder",
    "qa/custom_models/custom_zero_1_float32",
    files=(("own:identity/1/model.py", "1/model.py"),),
    edits=(Edit(r'^backend: "identity"', 'backend: "python"'),),
    append='parameters [\n{ key: "execute_delay_ms"; value: { string_value: "1000" }}\n]\n',
    version_folders=("1",),
)
REPEAT_NON_DECOUPLED = Model(
    "repeat_int32_non_decoupled",
    "own",
    "repeat_int32",
    edits=(
        Edit(r"^model_transaction_policy.*", ""),
        Edit(r'^name: "repeat_int32"', 'name: "repeat_int32_non_decoupled"'),
    ),
)
MODELS = (IDENTITY, REPEAT, REPEAT_NON_DECOUPLED)
_VERBOSE = "--log-verbose=2"


def _tests(*names: str) -> tuple[str, ...]:
    return tuple(f"CleanUpTest.test_{name}" for name in names)


L0_GRPC_STATE_CLEANUP = Suite(
    "L0_grpc_state_cleanup",
    (
        Run(
            "cleanup_test",
            "cleanup_test.py",
            MODELS,
            server_args=(_VERBOSE,),
            tests=_tests(
                "simple_infer",
                "simple_infer_cancellation",
                "simple_infer_timeout",
                "streaming_infer",
                "streaming_timeout",
                "streaming_cancellation",
                "decoupled_infer",
                "decoupled_cancellation",
                "decoupled_timeout",
                "non_decoupled_streaming_multi_response",
            ),
            server_per_test=True,
        ),
        Run(
            "cleanup_test restricted protocol",
            "cleanup_test.py",
            MODELS,
            server_args=(_VERBOSE, "--grpc-restricted-protocol=inference:infer-key=infer-value"),
            tests=_tests("simple_infer_error_status", "streaming_error_status", "decoupled_error_status"),
            server_per_test=True,
        ),
        Run(
            "cleanup_test decoupled complete",
            "cleanup_test.py",
            MODELS,
            server_args=(_VERBOSE,),
            tests=_tests("decoupled_infer_complete"),
        ),
    ),
    (
        (
            "models custom_zero_1_float32, repeat_int32",
            "Triton's C++ identity backend and a model from Triton's qa image; the runner's Python stand-ins "
            "with the same configurations are used on both servers",
        ),
        (
            "the *_shutdownserver tests",
            "they signal the server's pid in the middle of a call (test.sh's SERVER_PID)",
        ),
        (
            "test.sh's count of state objects created and released",
            "a check of tritonserver's verbose log, not a Python test",
        ),
    ),
)

register(L0_GRPC_STATE_CLEANUP)
