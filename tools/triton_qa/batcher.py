"""``L0_batcher`` with ``BACKENDS="onnx python"``: a fresh server per test, as its ``test.sh`` runs it.

The ONNX models come from ``gen_qa_models.py``; the Python one is the ONNX model's configuration on the
Python backend with ``qa/python_models/add_sub``. Tests that want a delayed scheduler get
``TRITONSERVER_DELAY_SCHEDULER`` in the environment of both servers and of the test process.
"""

from __future__ import annotations

from tools.triton_qa.suites import BATCH8, VERSION1, Edit, Model, Run, Suite, env, register

BACKENDS = "onnx python"
_DYNAMIC = "dynamic_batching { preferred_batch_size: [ 2, 6 ], max_queue_delay_microseconds: 10000000 }\n"
_VARIABLE_DIMS = Edit("16", "-1", scope="all")

NO_DELAY_TESTS = (
    "test_static_batch_preferred",
    "test_static_batch_lt_any_preferred",
    "test_static_batch_not_preferred",
    "test_static_batch_gt_max_preferred",
    "test_multi_batch_not_preferred",
    "test_multi_batch_gt_max_preferred",
    "test_multi_batch_sum_gt_max_preferred",
    "test_multi_same_output0",
    "test_multi_same_output1",
    "test_multi_different_outputs",
    "test_multi_different_output_order",
)
# test -> TRITONSERVER_DELAY_SCHEDULER, as test.sh sets it
DELAY_TESTS = {
    "test_multi_batch_delayed_sum_gt_max_preferred": "2",
    "test_multi_batch_use_biggest_preferred": "6",
    "test_multi_batch_use_best_preferred": "3",
    "test_multi_batch_delayed_use_max_batch": "3",
}
DIFFERENT_SHAPE_TESTS = (
    "test_multi_batch_not_preferred_different_shape",
    "test_multi_batch_preferred_different_shape",
    "test_multi_batch_different_shape_allow_ragged",
    "test_multi_batch_different_shape",
)


def _models(repository: str, variable: bool) -> tuple[Model, ...]:
    extra = (_VARIABLE_DIMS,) if variable else ()
    onnx = Model(
        "onnx_float32_float32_float32",
        "generated",
        f"{repository}/onnx_float32_float32_float32",
        edits=(BATCH8, VERSION1, *extra),
        append=_DYNAMIC,
    )
    python = Model(
        "python_float32_float32_float32",
        "generated",
        f"{repository}/onnx_float32_float32_float32",
        files=(
            ("config.pbtxt", "config.pbtxt"),
            ("output0_labels.txt", "output0_labels.txt"),
            ("qa/python_models/add_sub/model.py", "1/model.py"),
        ),
        edits=(
            Edit(r"platform:.*", 'backend: "python"', scope="all"),
            Edit("onnx", "python", scope="all"),
            BATCH8,
            VERSION1,
            *extra,
        ),
        append=_DYNAMIC,
    )
    return (onnx, python)


_RAGGED = Model(
    "onnx_zero_1_float32",
    "generated",
    "qa_identity_model_repository/onnx_nobatch_zero_1_float32",
    edits=(
        Edit("nobatch_", ""),
        BATCH8,
        Edit('name: "INPUT0"', 'name: "INPUT0"\nallow_ragged_batch: true'),
    ),
    append=(
        'batch_output [{target_name: "OUTPUT0" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "INPUT0" }]\n'
        + _DYNAMIC
    ),
)
FIXED_MODELS = _models("qa_model_repository", variable=False)
VARIABLE_MODELS = (*_models("qa_variable_model_repository", variable=True), _RAGGED)


def _runs(batcher_type: str, models: tuple[Model, ...]) -> list[Run]:
    base = {"BACKENDS": BACKENDS, "BATCHER_TYPE": batcher_type}
    runs = [
        Run(
            f"{batcher_type} no delay",
            "batcher_test.py",
            models,
            env=env(**base),
            tests=tuple(f"BatcherTest.{t}" for t in NO_DELAY_TESTS),
            server_per_test=True,
        )
    ]
    for delay in sorted(set(DELAY_TESTS.values())):
        tests = tuple(f"BatcherTest.{t}" for t, d in DELAY_TESTS.items() if d == delay)
        runs.append(
            Run(
                f"{batcher_type} delay {delay}",
                "batcher_test.py",
                models,
                env=env(**base, TRITONSERVER_DELAY_SCHEDULER=delay),
                tests=tests,
                server_per_test=True,
            )
        )
    return runs


L0_BATCHER = Suite(
    "L0_batcher",
    (
        *_runs("FIXED", FIXED_MODELS),
        *_runs("VARIABLE", VARIABLE_MODELS),
        Run(
            "VARIABLE different shape",
            "batcher_test.py",
            VARIABLE_MODELS,
            env=env(BACKENDS=BACKENDS, BATCHER_TYPE="VARIABLE"),
            tests=tuple(f"BatcherTest.{t}" for t in DIFFERENT_SHAPE_TESTS),
            server_per_test=True,
        ),
        Run(
            "VARIABLE different shape delay 4",
            "batcher_test.py",
            VARIABLE_MODELS,
            env=env(BACKENDS=BACKENDS, BATCHER_TYPE="VARIABLE", TRITONSERVER_DELAY_SCHEDULER="4"),
            tests=("BatcherTest.test_multi_batch_delayed_preferred_different_shape",),
            server_per_test=True,
        ),
    ),
    (
        (
            "onnx models on tritonserver",
            "the tritonserver 2.51 here has the Python backend only (PyTriton wheel)",
        ),
        ("graphdef savedmodel libtorch plan backends", "TensorFlow / LibTorch / TensorRT do not run here"),
        ("custom_zero_1_float32 (ragged)", "a custom C++ backend model"),
        (
            "preferred-batch-only and max-queue-delay-only tests",
            "need other repositories; not in the table yet",
        ),
        ("valgrind / shared-memory variants", "TEST_VALGRIND and TEST_*_SHARED_MEMORY are left unset"),
    ),
)

register(L0_BATCHER)
