"""``L0_sequence_batcher`` with ``BACKENDS=python``: a fresh server per test, as its ``test.sh`` runs it.

The Python models are ``test.sh``'s ``generate_python_models``: the ONNX sequence model's
configuration from ``gen_qa_sequence_models.py`` on the Python backend, with
``qa/python_models/sequence_int32``. Two of ``test.sh``'s model trials run: ``1`` (``max_batch_size``
4, one instance: every test, the delayed ones with the scheduler delays ``test.sh`` sets) and ``2``
(``max_batch_size`` 2, two instances: the tests without delay). The generated configurations ask for
``KIND_GPU``; here they get ``KIND_CPU`` (this machine has no GPU), on both servers.
"""

from __future__ import annotations

from tools.triton_qa.suites import Edit, Model, Run, Suite, env, register

NO_DELAY_TESTS = (
    "test_simple_sequence",
    "test_length1_sequence",
    "test_batch_size",
    "test_no_sequence_start",
    "test_no_sequence_start2",
    "test_no_sequence_end",
    "test_no_correlation_id",
)
DELAY_TESTS = (
    "test_backlog_fill",
    "test_backlog_fill_no_end",
    "test_backlog_same_correlation_id",
    "test_backlog_same_correlation_id_no_end",
    "test_backlog_sequence_timeout",
    "test_half_batch",
    "test_skip_batch",
    "test_full_batch",
    "test_ragged_batch",
    "test_backlog",
)


def delays(test: str) -> tuple[str, str]:
    """``(TRITONSERVER_BACKLOG_DELAY_SCHEDULER, TRITONSERVER_DELAY_SCHEDULER)`` as ``test.sh`` sets them."""
    if test == "test_backlog_fill_no_end":
        backlog = "3"
    elif test in ("test_backlog_fill", "test_backlog_same_correlation_id"):
        backlog = "2"
    else:
        backlog = "0"
    delay = {
        "test_backlog_fill_no_end": "10",
        "test_backlog_fill": "10",
        "test_backlog_same_correlation_id_no_end": "16",
        "test_half_batch": "8",
        "test_backlog_sequence_timeout": "4",
    }.get(test, "12")
    return backlog, delay


def _models(max_batch: int, count: int) -> tuple[Model, ...]:
    return tuple(
        Model(
            f"python_sequence_{dtype}",
            "generated",
            f"qa_sequence_model_repository/onnx_sequence_{dtype}",
            files=(
                ("config.pbtxt", "config.pbtxt"),
                ("qa/python_models/sequence_int32/model.py", "1/model.py"),
            ),
            edits=(
                Edit(r"platform:.*", 'backend: "python"', scope="all"),
                Edit("onnx", "python", scope="all"),
                Edit(r"^max_batch_size:.*", f"max_batch_size: {max_batch}"),
                Edit("kind: KIND_GPU", f"kind: KIND_CPU\ncount: {count}"),
            ),
        )
        for dtype in ("int32", "bool")
    )


def _base(instances: int) -> dict[str, str]:
    return {
        "BACKENDS": "python",
        "ENSEMBLES": "0",
        "NO_BATCHING": "0",
        "MODEL_INSTANCES": str(instances),
        "BATCHER_TYPE": "FIXED",
        "IMPLICIT_STATE": "0",
        "INITIAL_STATE_FILE": "0",
    }


def _runs() -> list[Run]:
    one, two = _models(4, 1), _models(2, 2)
    runs = [
        Run(
            "1 instance, no delay",
            "sequence_batcher_test.py",
            one,
            env=env(**_base(1)),
            tests=tuple(f"SequenceBatcherTest.{t}" for t in NO_DELAY_TESTS),
            server_per_test=True,
        ),
        Run(
            "2 instances, no delay",
            "sequence_batcher_test.py",
            two,
            env=env(**_base(2)),
            tests=tuple(f"SequenceBatcherTest.{t}" for t in NO_DELAY_TESTS),
            server_per_test=True,
        ),
    ]
    for pair in sorted({delays(t) for t in DELAY_TESTS}):
        backlog, delay = pair
        runs.append(
            Run(
                f"1 instance, delay {delay} backlog {backlog}",
                "sequence_batcher_test.py",
                one,
                env=env(
                    **_base(1),
                    TRITONSERVER_BACKLOG_DELAY_SCHEDULER=backlog,
                    TRITONSERVER_DELAY_SCHEDULER=delay,
                ),
                tests=tuple(f"SequenceBatcherTest.{t}" for t in DELAY_TESTS if delays(t) == pair),
                server_per_test=True,
            )
        )
    return runs


L0_SEQUENCE_BATCHER = Suite(
    "L0_sequence_batcher",
    tuple(_runs()),
    (
        ("onnx, plan, libtorch and custom trials", "the tritonserver 2.51 here has the Python backend only"),
        ("ensemble trials", "ENSEMBLES=0: the qa ensembles are generated for the ONNX models"),
        ("model trials 0, 4 and v, and the queue-delay tests", "not in this runner's table yet"),
        ("implicit state and initial state variants", "IMPLICIT_STATE and INITIAL_STATE_FILE are left at 0"),
        ("KIND_GPU instances", "no GPU here: the generated configurations get KIND_CPU on both servers"),
    ),
)

register(L0_SEQUENCE_BATCHER)
