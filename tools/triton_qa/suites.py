"""What each supported qa suite needs: its models, server flags, environment and test files.

Each ``qa/L0_*/test.sh`` of Triton's repository builds a model folder, starts ``tritonserver`` with some
flags and runs Python test files; a :class:`Run` is one such step. Models are described, not copied:
:mod:`tools.triton_qa.models` builds them from the user's checkout.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from tools.triton_qa import python_based


@dataclass(frozen=True)
class Edit:
    """A ``sed -i "s/pattern/replacement/[g]"`` on a model's ``config.pbtxt`` (Python regex syntax)."""

    pattern: str
    replacement: str
    scope: str = "line"  # the first match of each line; "all": every match (``g``); "file": the first one


@dataclass(frozen=True)
class Model:
    """One model of a run's repository.

    ``kind`` says where it comes from:

    * ``python``: ``source`` is a folder of the checkout (``qa/python_models/add_sub``); its
      ``config.pbtxt`` goes to the model folder and every other file into ``1/`` (``files`` overrides:
      ``(from, to)`` pairs relative to ``source`` and to the model folder);
    * ``folder``: ``source`` is a whole model folder of the checkout, copied as it is;
    * ``generated``: ``source`` is ``<repository>/<model>`` of what ``qa/common/gen_qa_*.py`` writes
      (``qa_model_repository/onnx_float32_float32_float32``); with ``files``, only those are taken
      (a ``qa/...`` source is a file of the checkout instead);
    * ``own``: a stand-in written by this tool (``source`` names it) for a model Triton's tests take
      from a backend that cannot run here;
    * ``missing``: cannot be built here; ``source`` says why.
    """

    name: str
    kind: str
    source: str
    files: tuple[tuple[str, str], ...] = ()
    edits: tuple[Edit, ...] = ()
    append: str = ""
    version_folders: tuple[str, ...] = ()  # folders test.sh makes (``mkdir -p <model>/1``), empty


def with_edit(model: Model, edit: Edit) -> Model:
    """``model`` with one more edit of its configuration (a ``sed -i`` of ``test.sh``)."""
    return replace(model, edits=(*model.edits, edit))


@dataclass(frozen=True)
class Run:
    """One server start and the test file run against it (``tests``: only these classes/methods)."""

    label: str
    test_file: str  # relative to the suite's folder (``qa/<suite>/``)
    models: tuple[Model, ...]
    server_args: tuple[str, ...] = ()  # tritonserver's flags, less the model repository and ports
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    tests: tuple[str, ...] = ()
    server_per_test: bool = False  # a fresh server for each test (test.sh does so)
    # the name ``test.sh`` gives the server's log, which some tests open by that name (in their folder)
    server_log_name: str = ""
    # tests left out on both servers, each ``(Class.method, why)``: they need what this machine lacks
    not_here: tuple[tuple[str, str], ...] = ()
    # how test.sh runs the file: "unittest" (python file.py), "pytest", or "script" (a plain script whose
    # exit status is the result: one test case, ``<file>.main``)
    runner: str = "unittest"
    # the model types the tests may ask for ("onnx", "ensemble", ...): where set, test_util's validators
    # of every other type answer False (tools/triton_qa/restrict), for tests that ignore BACKENDS
    only_backends: tuple[str, ...] = ()
    # where test.sh lays the repository out, relative to the suite's folder, for tests that edit it there
    repository_at: str = ""
    timeout_s: float = 900.0
    # test.sh's other steps before each server start (folders beside the repository, files the tests
    # copy in): called with the suite's folder of the work copy and a builder of one model into a folder
    prepare: Callable[[Path, Callable[[Model, Path], None]], None] | None = None


@dataclass(frozen=True)
class Suite:
    """A ``qa/L0_*`` folder: its runs and what of it cannot run here (``(what, why)`` pairs)."""

    name: str
    runs: tuple[Run, ...]
    cannot_run: tuple[tuple[str, str], ...] = ()


def env(**values: str) -> Mapping[str, str]:
    """An immutable environment mapping for a :class:`Run`."""
    return MappingProxyType(dict(values))


def python_model(name: str, source: str | None = None, *, append: str = "", **kw: object) -> Model:
    """A model from ``qa/python_models/<source or name>``."""
    return Model(name, "python", f"qa/python_models/{source or name}", append=append, **kw)  # type: ignore[arg-type]


def generated(name: str, source: str, *edits: Edit, append: str = "") -> Model:
    """A model written by ``gen_qa_*.py`` (``source``: ``<repository>/<model>``), renamed to ``name``."""
    rename = Edit(r'^name: ".*"', f'name: "{name}"')
    return Model(name, "generated", source, edits=(rename, *edits), append=append)


def python_stand_in(name: str, types: str, versions: Mapping[int, str]) -> Model:
    """A Python model ``name`` standing in for one of gen_qa_models.py's: the ONNX model ``onnx_<types>``'s
    configuration and label file, each version running the runner's own ``addsub`` or ``subadd``."""
    return Model(
        name,
        "generated",
        f"qa_model_repository/onnx_{types}",
        files=(
            ("config.pbtxt", "config.pbtxt"),
            ("output0_labels.txt", "output0_labels.txt"),
            *((f"own:{code}/1/model.py", f"{v}/model.py") for v, code in sorted(versions.items())),
        ),
        edits=(Edit(r'^name: ".*"', f'name: "{name}"'), Edit(r"^platform:.*", 'backend: "python"')),
    )


def graphdef_stand_in(types: str, versions: tuple[int, ...] = (1,)) -> Model:
    """A Python stand-in for gen_qa_models.py's TensorFlow model ``graphdef_<types>``: an add/sub in each
    of ``versions``."""
    return python_stand_in(f"graphdef_{types}", types, dict.fromkeys(versions, "addsub"))


SIMPLE = Model("simple", "own", "simple")
DECOUPLED = "model_transaction_policy { decoupled: True }\n"
BATCH8 = Edit(r"^max_batch_size:.*", "max_batch_size: 8")
VERSION1 = Edit(r"^version_policy:.*", "version_policy: { specific { versions: [1] }}")
NO_SIMPLE_WHY = (
    "TensorFlow GraphDef in Triton's repository; a Python stand-in with the same inputs and outputs is used"
)

# ------------------------------------------------------------------------------------------- L0_http
_IDENTITY = "qa_identity_model_repository"
_HTTP_TEST_MODELS = (
    generated("onnx_zero_1_float32", f"{_IDENTITY}/onnx_zero_1_float32"),
    generated("onnx_zero_1_object", f"{_IDENTITY}/onnx_zero_1_object"),
    generated("onnx_zero_1_float16", f"{_IDENTITY}/onnx_zero_1_float16"),
    generated("onnx_zero_3_float32", f"{_IDENTITY}/onnx_zero_3_float32"),
    # test.sh: the object model with its first variable dimension fixed to 1
    Model(
        "onnx_zero_1_object_1_element",
        "generated",
        f"{_IDENTITY}/onnx_zero_1_object",
        edits=(Edit(r"onnx_zero_1_object", "onnx_zero_1_object_1_element"), Edit(r"-1", "1", scope="file")),
    ),
    generated(
        "onnx_zero_1_float32_queue",
        f"{_IDENTITY}/onnx_zero_1_float32",
        append=(
            "dynamic_batching {\n  max_queue_delay_microseconds: 1000000\n  preferred_batch_size: [ 8 ]\n"
            "  default_queue_policy { max_queue_size: 1 }\n}\n"
        ),
    ),
)

L0_HTTP = Suite(
    "L0_http",
    (
        Run("python_http_aio_test", "python_http_aio_test.py", (SIMPLE,)),
        Run("http_test", "http_test.py", _HTTP_TEST_MODELS),
        Run(
            "generate_endpoint_test",
            "generate_endpoint_test.py",
            (Model("mock_llm", "folder", "qa/L0_http/generate_models/mock_llm"),),
        ),
        Run(
            "http_restricted_api_test",
            "http_restricted_api_test.py",
            (SIMPLE,),
            server_args=(
                "--http-restricted-api=model-repository:admin-key=admin-value",
                "--http-restricted-api=inference,metadata:infer-key=infer-value",
            ),
            tests=("RestrictedAPITest",),
        ),
    ),
    (
        ("model simple", NO_SIMPLE_WHY),
        ("onnx models of http_test.py on tritonserver", "the tritonserver here has the Python backend only"),
        ("http_input_size_limit_test.py", "not part of Triton v2.51.0's L0_http"),
        ("C++ client examples and cc_client_test", "built C++ clients are not in the checkout"),
        ("http_client_plugin_test.py, http_basic_auth_test.py", "need nginx and the client plugin setup"),
        ("simple_dyna_sequence / image_client runs", "TensorFlow and custom C++ backend models"),
        ("restricted-API start failures", "test.sh checks tritonserver's log text; not a Python test"),
    ),
)

# ------------------------------------------------------------------------------------------- L0_grpc
L0_GRPC = Suite(
    "L0_grpc",
    (
        Run("python_grpc_aio_test", "python_grpc_aio_test.py", (SIMPLE,)),
        Run(
            "python_unit_test (restricted protocol)",
            "python_unit_test.py",
            (SIMPLE,),
            server_args=(
                "--grpc-restricted-protocol=model-repository:admin-key=admin-value",
                "--grpc-restricted-protocol=inference,health:infer-key=infer-value",
            ),
            tests=("RestrictedProtocolTest",),
        ),
    ),
    (
        ("model simple", NO_SIMPLE_WHY),
        ("C++ client examples and cc_client_test", "built C++ clients are not in the checkout"),
        ("grpc_client_plugin_test.py, grpc_basic_auth_test.py", "need nginx and the client plugin setup"),
        ("grpc-health-probe checks", "need Go and network access to install the probe"),
        ("restricted-protocol start failures", "test.sh checks tritonserver's log text; not a Python test"),
    ),
)

# ------------------------------------------------------------------------------- L0_backend_python
_RS = "qa/python_models/response_sender"
_RS_ASYNC_FILES = (("model_common.py", "1/model_common.py"), ("model_async.py", "1/model.py"))
_RS_FILES = (("model_common.py", "1/model_common.py"), ("model.py", "1/model.py"))
_BATCHING = "dynamic_batching { max_queue_delay_microseconds: 500000 }\n"


def _response_sender(name: str, *, asynchronous: bool, decoupled: bool, batching: bool) -> Model:
    files: tuple[tuple[str, str], ...] = (
        *(_RS_ASYNC_FILES if asynchronous else _RS_FILES),
        ("config.pbtxt", "config.pbtxt"),
    )
    append = (DECOUPLED if decoupled else "") + (_BATCHING if batching else "")
    return Model(name, "python", _RS, files=files, append=append)


_RESPONSE_SENDER_MODELS = tuple(
    _response_sender(
        "response_sender"
        + ("_decoupled" if d else "")
        + ("_async" if a else "")
        + ("_batching" if b else ""),
        asynchronous=a,
        decoupled=d,
        batching=b,
    )
    for b in (False, True)
    for d in (False, True)
    for a in (False, True)
)

_LIFECYCLE_MODELS = (
    python_model("error_code"),
    python_model("execute_cancel"),
    python_model(
        "execute_error",
        edits=(Edit(r"^name:.*", 'name: "execute_error"'), BATCH8),
        append="dynamic_batching { preferred_batch_size: [8], max_queue_delay_microseconds: 12000000 }\n",
    ),
    python_model(
        "execute_grpc_error",
        edits=(Edit(r"^name:.*", 'name: "execute_grpc_error"'), BATCH8),
        append="dynamic_batching { preferred_batch_size: [8], max_queue_delay_microseconds: 1200000 }\n",
    ),
    python_model("execute_return_error"),
    python_model(
        "wrong_model",
        edits=(Edit(r"^name:.*", 'name: "wrong_model"'), Edit("TYPE_FP32", "TYPE_UINT32", scope="all")),
    ),
)

_DECOUPLED_DIR = "qa/L0_backend_python/decoupled/models"
_DECOUPLED_MODELS = (
    *(
        Model(n, "folder", f"{_DECOUPLED_DIR}/{n}")
        for n in (
            "decoupled_bls",
            "decoupled_bls_stream",
            "decoupled_execute_error",
            "decoupled_raise_exception",
            "decoupled_return_response_error",
            "decoupled_send_after_close_error",
        )
    ),
    python_model("identity_fp32"),
    python_model("execute_cancel", append=DECOUPLED),
    Model("square_int32", "missing", "an example of the python_backend repository, which test.sh clones"),
    python_model("dlpack_add_sub"),
)

_UINT8_BATCHING = "dynamic_batching { preferred_batch_size: [8], max_queue_delay_microseconds: 12000000 }\n"


def _identity_as(name: str, datatype: str, *edits: Edit, append: str = "") -> Model:
    """``qa/python_models/identity_fp32`` renamed ``name``, its FP32 tensors made ``datatype``."""
    return python_model(
        name,
        "identity_fp32",
        edits=(
            Edit(r"^name:.*", f'name: "{name}"'),
            Edit("TYPE_FP32", f"TYPE_{datatype}", scope="all"),
            *edits,
        ),
        append=append,
    )


# python_test.py's repository, as test.sh lays it out
_PYTHON_TEST_MODELS = (
    python_model("identity_fp32"),
    python_model("identity_bf16"),
    _identity_as(
        "identity_uint8", "UINT8", Edit(r"^max_batch_size:.*", "max_batch_size: 8"), append=_UINT8_BATCHING
    ),
    _identity_as("identity_uint8_nobatch", "UINT8", Edit(r"^max_batch_size:.*", "")),
    _identity_as("identity_uint32", "UINT32"),
    _identity_as("identity_bool", "BOOL"),
    python_model(
        "default_model_name",
        "identity_fp32",
        files=(("config.pbtxt", "config.pbtxt"), ("model.py", "1/mymodel.py")),
        edits=(Edit(r"^name:.*", 'name: "default_model_name"'),),
        append='default_model_filename: "mymodel.py"\n',
    ),
    python_model("pytorch_fp32_fp32", edits=(Edit(r"^name:.*", 'name: "pytorch_fp32_fp32"'),)),
    python_model("delayed_model"),
    python_model("init_args"),
    python_model("optional"),
    python_model("non_contiguous"),
    python_model("string"),
    python_model("string_fixed"),
    python_model("dlpack_identity"),
)
_SHM_LEAK_TEST = "test_infer_shm_leak.py"  # runs MODEL_NAME, a model whose execute checks the backend API
_RESCHEDULING_MODELS = tuple(
    python_model(n)
    for n in (
        "bls_request_rescheduling",
        "request_rescheduling_addsub",
        "iterative_sequence",
        "wrong_return_type",
    )
)
_EXPLICIT_ALL = ("--model-control-mode=explicit", "--load-model=*", "--log-verbose=1")


_GPU_OUTPUTS = "asks its models for output tensors on a GPU"

L0_BACKEND_PYTHON = Suite(
    "L0_backend_python",
    (
        Run(
            "response_sender",
            "response_sender/response_sender_test.py",
            _RESPONSE_SENDER_MODELS,
            server_args=("--log-verbose=1",),
            runner="pytest",
        ),
        Run(
            "response_sender_complete_final",
            "response_sender/response_sender_complete_final_test.py",
            (python_model("response_sender_complete_final"),),
            server_args=("--log-verbose=1",),
            runner="pytest",
        ),
        Run(
            "decoupled",
            "decoupled/decoupled_test.py",
            _DECOUPLED_MODELS,
            ("--log-verbose=1",),
            runner="pytest",
            server_log_name="decoupled_server.log",
            not_here=(
                (
                    "DecoupledTest.test_decoupled_bls",
                    "the model's response thread runs its BLS checks on a CUDA device; without one no "
                    "response comes and the test waits out its timeout on either server",
                ),
            ),
        ),
        Run(
            "lifecycle",
            "lifecycle/lifecycle_test.py",
            _LIFECYCLE_MODELS,
            ("--log-verbose=1",),
            runner="pytest",
            server_log_name="lifecycle_server.log",
        ),
        Run(
            "async_execute",
            "async_execute/concurrency_test.py",
            (python_model("async_execute_decouple"), python_model("async_execute_decouple_bls")),
            server_args=("--log-verbose=1",),
            runner="pytest",
        ),
        Run(
            "python_test",
            "python_test.py",
            _PYTHON_TEST_MODELS,
            server_args=("--log-verbose=1", "--backend-config=python,shm-default-byte-size=5242880"),
            runner="pytest",
            not_here=(
                ("PythonTest.test_gpu_tensor_error", "needs a CUDA device"),
                ("PythonTest.test_dlpack_tensor_error", "needs a CUDA device"),
            ),
        ),
        *(
            Run(
                name,
                _SHM_LEAK_TEST,
                models,
                server_args=args,
                env=MappingProxyType({"MODEL_NAME": model}),
                runner="pytest",
            )
            for name, model, models, args in (
                ("custom_metrics", "custom_metrics", (python_model("custom_metrics"),), ("--log-verbose=1",)),
                (
                    "argument_validation",
                    "argument_validation",
                    (
                        Model(
                            "argument_validation",
                            "folder",
                            "qa/L0_backend_python/argument_validation/models/argument_validation",
                        ),
                    ),
                    ("--log-verbose=1",),
                ),
                ("request_rescheduling", "bls_request_rescheduling", _RESCHEDULING_MODELS, _EXPLICIT_ALL),
            )
        ),
        Run(
            "request_rescheduling grpc",
            "request_rescheduling/grpc_endpoint_test.py",
            _RESCHEDULING_MODELS,
            server_args=_EXPLICIT_ALL,
            runner="pytest",
        ),
        Run(
            "model_control",
            "model_control/model_control_test.py",
            (
                python_model("identity_fp32"),
                Model(
                    "simple_identity_fp32",
                    "python",
                    "qa/python_models/simple_identity_fp32",
                    files=(("config.pbtxt", "config.pbtxt"),),
                ),
            ),
            server_args=("--model-control-mode=explicit", "--log-verbose=1"),
            runner="pytest",
        ),
        Run(
            "ensemble",
            "ensemble/ensemble_test.py",
            (
                Model(
                    "ensemble",
                    "python",
                    "qa/python_models/ensemble",
                    files=(("config.pbtxt", "config.pbtxt"),),
                ),
                python_model("add_sub_1", "add_sub"),
                python_model("add_sub_2", "add_sub"),
            ),
            server_args=("--log-verbose=1",),
            runner="pytest",
            not_here=(("EnsembleTest.test_ensemble_gpu", "a LibTorch model on a GPU"),),
        ),
        Run(
            "python_based_backends",
            f"{python_based.FOLDER}/python_based_backends_test.py",
            (python_model("add_sub"),),
            server_args=(
                f"--backend-directory={{qa}}/L0_backend_python/{python_based.BACKENDS}",
                "--model-control-mode=explicit",
                "--log-verbose=1",
            ),
            runner="pytest",
            repository_at=python_based.REPOSITORY,
            prepare=python_based.prepare,
        ),
        Run(
            "io requested outputs",
            "io/io_test.py",
            (python_model("add_sub"), python_model("dlpack_io_identity_decoupled")),
            server_args=("--log-verbose=1",),
            tests=("IOTest.test_requested_output_default", "IOTest.test_requested_output_decoupled"),
            runner="pytest",
        ),
    ),
    (
        (
            "model square_int32 (decoupled)",
            "an example of the python_backend repository, which test.sh clones",
        ),
        (
            "lifecycle init_error / fini_error / auto_complete_error",
            "test.sh checks the server's log and exit",
        ),
        (
            "the shared-memory leak probe of decoupled_test.py, lifecycle_test.py",
            "triton_shm_monitor is a C++ extension of Triton's CI; a stand-in (tools/triton_qa/harness) "
            "lets the tests run and reports no leak on either server",
        ),
        (
            "lifecycle shared-memory page count",
            "test.sh compares /dev/shm before and after; not a Python test",
        ),
        ("decoupled log-count checks", "test.sh greps tritonserver's log; not a Python test"),
        (
            "python_test init_args",
            "checks the repository path against $TRITON_DIR/qa/L0_backend_python/models, a layout of Triton's CI",
        ),
        (
            "the bls, env, logging, restart, variants and examples subsets",
            "not in this runner's table yet",
        ),
    ),
)

SUITES: dict[str, Suite] = {s.name: s for s in (L0_HTTP, L0_GRPC, L0_BACKEND_PYTHON)}


def register(suite: Suite) -> None:
    """Add ``suite`` to the table (the batcher suites live in their own module)."""
    SUITES[suite.name] = suite


def select(names: list[str]) -> list[Suite]:
    """The suites called ``names`` (``all``: every one), in the order given; unknown names raise."""
    if names == ["all"]:
        return list(SUITES.values())
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        raise KeyError(f"unknown suite(s) {', '.join(unknown)}; known: {', '.join(SUITES)}")
    return [SUITES[n] for n in names]
