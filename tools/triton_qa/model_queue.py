"""``L0_model_queue``: the dynamic batcher's queue policies and priority levels.

``test.sh`` writes a new ``dynamic_batching`` block for each test and starts a server on it: the
queue's size limit, a timeout that moves a request behind (``DELAY``) or rejects it (``REJECT``, with
the failure counted in ``nv_inference_request_failure``), a request's own timeout overriding the
default, two priority levels, the largest uint64 number of levels, and levels with policies of their
own. Each test sends its requests straight to ``custom_zero_1_float32`` and through
``ensemble_zero_1_float32``, over HTTP and gRPC, and bounds each answer's latency.
``custom_zero_1_float32`` is on Triton's C++ identity backend: here a Python identity with the same
configuration (it sleeps for ``execute_delay_ms`` as that backend does), on both servers.
"""

from __future__ import annotations

from tools.triton_qa.suites import Edit, Model, Run, Suite, register

_CUSTOM = "qa/custom_models/custom_zero_1_float32"
_ENSEMBLE = "qa/L0_model_queue/ensemble_zero_1_float32"
_MAX_UINT64 = 2**64 - 1
_MAX_UINT32_PLUS_1 = 2**32
_HOLD = "max_queue_delay_microseconds: 10000000"


def _custom(batching: str, parameters: str, preferred: str) -> Model:
    """test.sh's ``custom_zero_1_float32``: variable dims, batches up to 32, one CPU instance, and the
    test's ``dynamic_batching`` block (and ``parameters``) appended."""
    return Model(
        "custom_zero_1_float32",
        "folder",
        _CUSTOM,
        files=(("own:identity/1/model.py", "1/model.py"),),
        edits=(
            Edit(r"dims:.*\[.*\]", "dims: [ -1 ]", scope="all"),
            Edit(r"max_batch_size:.*", "max_batch_size: 32"),
            Edit(r'^backend: "identity"', 'backend: "python"'),
        ),
        append=(
            "instance_group [ { kind: KIND_CPU count: 1 }]\n"
            f"dynamic_batching {{\n  preferred_batch_size: {preferred}\n{batching}}}\n{parameters}"
        ),
        version_folders=("1",),
    )


def _run(test: str, batching: str, parameters: str = "", preferred: str = "[ 4, 8 ]") -> Run:
    custom = _custom(batching, parameters, preferred)
    return Run(
        test,
        "model_queue_test.py",
        (Model("ensemble_zero_1_float32", "folder", _ENSEMBLE, version_folders=("1",)), custom),
        tests=(f"ModelQueueTest.{test}",),
        server_per_test=True,
    )


L0_MODEL_QUEUE = Suite(
    "L0_model_queue",
    (
        _run(
            "test_max_queue_size",
            "  default_queue_policy { max_queue_size: 8 }\n",
            'parameters [ { key: "execute_delay_ms"; value: { string_value: "5000" } } ]\n',
        ),
        _run(
            "test_policy_delay",
            f"  {_HOLD}\n  default_queue_policy {{ timeout_action: DELAY default_timeout_microseconds: 100000 }}\n",
        ),
        _run(
            "test_policy_reject",
            f"  {_HOLD}\n  default_queue_policy {{ default_timeout_microseconds: 100000 }}\n",
        ),
        _run(
            "test_timeout_override",
            f"  {_HOLD}\n  default_queue_policy {{ allow_timeout_override: true "
            "default_timeout_microseconds: 1000000 }\n",
        ),
        _run("test_priority_levels", f"  {_HOLD}\n  priority_levels: 2\n  default_priority_level: 2\n"),
        _run(
            "test_max_priority_levels",
            f"  {_HOLD}\n  priority_levels: {_MAX_UINT64}\n  default_priority_level: {_MAX_UINT32_PLUS_1}\n",
        ),
        _run(
            "test_priority_with_policy",
            f"  {_HOLD}\n  priority_levels: 2\n  default_priority_level: 2\n"
            "  default_queue_policy { timeout_action: DELAY allow_timeout_override: true "
            "default_timeout_microseconds: 11000000 }\n"
            "  priority_queue_policy { key: 2 value: { timeout_action: REJECT allow_timeout_override: true "
            "default_timeout_microseconds: 11000000 } }\n",
            preferred="[ 4, 8, 32 ]",
        ),
    ),
    (
        (
            "model custom_zero_1_float32",
            "on Triton's C++ identity backend; a Python identity with the same configuration is used on both "
            "servers",
        ),
    ),
)

register(L0_MODEL_QUEUE)
