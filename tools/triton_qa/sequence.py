"""``L0_sequence_batcher`` with ``BACKENDS=python``: a fresh server per test, as its ``test.sh`` runs it.

The Python models are ``test.sh``'s ``generate_python_models``: the ONNX sequence model's
configuration from ``gen_qa_sequence_models.py`` on the Python backend, with
``qa/python_models/sequence_int32``. Every model trial of ``test.sh`` runs, each with every test (the
delayed ones with the scheduler delays ``test.sh`` sets): ``0`` (the ``nobatch`` models, four
instances), ``1`` (``max_batch_size`` 4, one instance), ``2`` (``max_batch_size`` 2, two instances),
``4`` (``max_batch_size`` 1, four instances) and ``v`` (the variable-size sequence models,
``max_batch_size`` 4, one instance). The generated configurations ask for ``KIND_GPU``; here they get
``KIND_CPU`` (this machine has no GPU), on both servers.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class Trial:
    """One of ``test.sh``'s ``MODEL_TRIALS``: the folder it builds and how its tests are told of it."""

    name: str  # "0", "1", "2", "4" or "v"
    label: str  # the start of its runs' labels
    repository: str  # the generated repository its models come from
    infix: str  # "" or "nobatch_": ``onnx_<infix>sequence_<dtype>``
    max_batch: int | None  # what ``max_batch_size`` is set to; None: left as generated
    count: int  # instances

    @property
    def env(self) -> dict[str, str]:
        """``NO_BATCHING``, ``MODEL_INSTANCES`` and ``BATCHER_TYPE`` as ``test.sh`` exports them."""
        return {
            "BACKENDS": "python",
            "ENSEMBLES": "0",
            "NO_BATCHING": "1" if self.name == "0" else "0",
            "MODEL_INSTANCES": str(self.count),
            "BATCHER_TYPE": "VARIABLE" if self.name == "v" else "FIXED",
            "IMPLICIT_STATE": "0",
            "INITIAL_STATE_FILE": "0",
        }

    def models(self) -> tuple[Model, ...]:
        """``generate_python_models`` on each dtype, then ``test.sh``'s ``sed`` edits for this trial."""
        resize = (
            ()
            if self.max_batch is None
            else (Edit(r"^max_batch_size:.*", f"max_batch_size: {self.max_batch}"),)
        )
        return tuple(
            Model(
                f"python_{self.infix}sequence_{dtype}",
                "generated",
                f"{self.repository}/onnx_{self.infix}sequence_{dtype}",
                files=(
                    ("config.pbtxt", "config.pbtxt"),
                    ("qa/python_models/sequence_int32/model.py", "1/model.py"),
                ),
                edits=(
                    Edit(r"platform:.*", 'backend: "python"', scope="all"),
                    Edit("onnx", "python", scope="all"),
                    *resize,
                    Edit("kind: KIND_GPU", f"kind: KIND_CPU\ncount: {self.count}"),
                ),
            )
            for dtype in ("int32", "bool")
        )


_FIXED = "qa_sequence_model_repository"
TRIALS = (
    Trial("0", "nobatch, 4 instances", _FIXED, "nobatch_", None, 4),
    Trial("1", "1 instance", _FIXED, "", 4, 1),
    Trial("2", "2 instances", _FIXED, "", 2, 2),
    Trial("4", "max_batch_size 1, 4 instances", _FIXED, "", 1, 4),
    Trial("v", "variable, 1 instance", "qa_variable_sequence_model_repository", "", 4, 1),
)


def _runs() -> list[Run]:
    """Each trial's tests without delay on one server each, then its delayed tests, by delay pair."""
    runs = []
    for trial in TRIALS:
        models = trial.models()
        runs.append(
            Run(
                f"{trial.label}, no delay",
                "sequence_batcher_test.py",
                models,
                env=env(**trial.env),
                tests=tuple(f"SequenceBatcherTest.{t}" for t in NO_DELAY_TESTS),
                server_per_test=True,
            )
        )
        for pair in sorted({delays(t) for t in DELAY_TESTS}):
            backlog, delay = pair
            runs.append(
                Run(
                    f"{trial.label}, delay {delay} backlog {backlog}",
                    "sequence_batcher_test.py",
                    models,
                    env=env(
                        **trial.env,
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
        ("the queue-delay tests", "not in this runner's table yet"),
        ("implicit state and initial state variants", "IMPLICIT_STATE and INITIAL_STATE_FILE are left at 0"),
        ("KIND_GPU instances", "no GPU here: the generated configurations get KIND_CPU on both servers"),
    ),
)

register(L0_SEQUENCE_BATCHER)
