"""``L0_model_update``: adding and removing instances of a loaded model in ``explicit`` mode.

``test.sh`` lays ``qa/python_models/model_init_del`` out in the suite's ``models`` folder (the test
imports its ``util`` from there and rewrites its ``config.pbtxt``), then starts one server for each rate
limiter mode (``off``, ``execution_count``, and ``execution_count`` with ``--rate-limit-resource=R1:10``)
and runs ``instance_update_test.py``. The model counts its ``initialize`` and ``finalize`` calls in files
under ``MODEL_LOG_DIR``, the suite's folder, which the test and every instance's process read.
"""

from __future__ import annotations

from tools.triton_qa.suites import Model, Run, Suite, env, register

_MODEL = Model(
    "model_init_del",
    "python",
    "qa/python_models/model_init_del",
    files=(("config.pbtxt", "config.pbtxt"), ("model.py", "1/model.py"), ("util.py", "util.py")),
)
_GPU = "places instances of kind KIND_GPU; no GPU here"
_GPU_TESTS = (
    "test_gpu_instance_update",
    "test_gpu_cpu_instance_update",
    "test_instance_name_update",
    "test_instance_signature",
    "test_direct_scheduler_update_with_ongoing_sequences",
    "test_oldest_scheduler_update_with_ongoing_sequences",
)
TESTS = tuple(
    f"TestInstanceUpdate.{name}"
    for name in (
        "test_add_rm_add_instance_no_batching",
        "test_add_rm_add_instance_with_batching",
        "test_rm_add_rm_instance_no_batching",
        "test_rm_add_rm_instance_with_batching",
        "test_rm_instance_to_zero",
        "test_cpu_instance_update",
        "test_invalid_config",
        "test_model_file_update",
        "test_non_instance_config_update",
        "test_load_api_with_config",
        "test_update_while_inferencing",
        "test_infer_while_updating",
        "test_instance_resource_increase",
        "test_instance_resource_increase_above_explicit",
        "test_instance_resource_decrease",
        "test_direct_scheduler_update_no_ongoing_sequences",
        "test_oldest_scheduler_update_no_ongoing_sequences",
    )
)
_RATE_LIMITS = (
    ("off", ("--rate-limit=off",)),
    ("execution_count", ("--rate-limit=execution_count",)),
    (
        "execution_count_with_explicit_resource",
        ("--rate-limit=execution_count", "--rate-limit-resource=R1:10"),
    ),
)


def _run(mode: str, rate_args: tuple[str, ...]) -> Run:
    return Run(
        f"rate_limit_{mode}",
        "instance_update_test.py",
        (_MODEL,),
        server_args=("--model-control-mode=explicit", *rate_args, "--log-verbose=2"),
        env=env(MODEL_LOG_DIR="{qa}/L0_model_update", RATE_LIMIT_MODE=mode, PYTHONDONTWRITEBYTECODE="True"),
        tests=TESTS,
        server_log_name=f"instance_update_test.rate_limit_{mode}.server.log",
        repository_at="models",
        timeout_s=480.0,
    )


L0_MODEL_UPDATE = Suite(
    "L0_model_update",
    tuple(_run(mode, args) for mode, args in _RATE_LIMITS),
    (
        *((f"TestInstanceUpdate.{name}", _GPU) for name in _GPU_TESTS),
        (
            "'Should not print this' in the server's log",
            "test.sh greps the log after each run; not a Python test",
        ),
    ),
)

register(L0_MODEL_UPDATE)
