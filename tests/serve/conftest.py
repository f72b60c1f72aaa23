"""One Ray Serve instance for the whole test session, serving the example repository plus test models."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from deployments.serve.request_path import haproxy_files_env, instance_ports_env
from tests.serve import processes
from tests.serve.standalone import free_ports
from tests.serve.streaming_models import add_streaming_models

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "model_repository"
BLS_MODELS = ROOT / "tests" / "backends" / "python_models"
# the backend directory of the shared server: the Python-based backend ``add_sub`` (tests/backends)
PYTHON_BACKENDS = ROOT / "tests" / "backends" / "python_backends"
SESSION_EXIT_TIMEOUT_S = 7.0  # the shared server's exit_timeout_secs (above Serve's 6 s floor)

IDENTITY_PY = textwrap.dedent(
    """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.version = int(args["model_version"])

        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                out = pb_utils.Tensor("OUTPUT0", (x * self.version).astype(np.float32))
                responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            return responses
    """
)

FAILING_PY = textwrap.dedent(
    """
    class TritonPythonModel:
        def initialize(self, args):
            raise RuntimeError("weights file is corrupt")

        def execute(self, requests):
            return []
    """
)

# answers after a pause: a request stays in flight long enough to be seen there
# (tests/serve/test_shared_memory_e2e.py, as Triton's qa execute_delayed_model)
SLOW_PY = textwrap.dedent(
    """
    import time

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            time.sleep(4)
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", x + 1)]))
            return responses
    """
)
SLOW_CONFIG = textwrap.dedent(
    """
    name: "slow"
    backend: "python"
    max_batch_size: 0
    input [ { name: "X" data_type: TYPE_INT32 dims: [ 4 ] } ]
    output [ { name: "Y" data_type: TYPE_INT32 dims: [ 4 ] } ]
    instance_group [ { count: 1 kind: KIND_CPU } ]
    """
)


ADD_SUB_SEPARATE = textwrap.dedent(
    """
    name: "add_sub_separate"
    platform: "ensemble"
    max_batch_size: 8
    input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] } ]
    parameters { key: "placement" value: { string_value: "separate" } }
    ensemble_scheduling { step [ {
      model_name: "add_sub"
      model_version: -1
      input_map [ { key: "INPUT0" value: "A" }, { key: "INPUT1" value: "B" } ]
      output_map [ { key: "OUTPUT0" value: "SUM" } ]
    } ] }
    """
)
# an ensemble whose one step is a BLS model on its own replicas, which calls add_sub on add_sub's:
# a trace that crosses three replicas (tests/serve/test_tracing_e2e.py)
BLS_ENSEMBLE = ADD_SUB_SEPARATE.replace('"add_sub_separate"', '"bls_ensemble"').replace(
    'model_name: "add_sub"', 'model_name: "bls_traced"'
)


def _config(name: str, max_batch: int, extra: str = "") -> str:
    dims = "[ 4 ]"
    return (
        textwrap.dedent(
            f"""
        name: "{name}"
        backend: "python"
        max_batch_size: {max_batch}
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: {dims} }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: {dims} }} ]
        instance_group [ {{ count: 1 kind: KIND_CPU }} ]
        """
        )
        + extra
    )


def build_test_repository(root: Path) -> Path:
    repo = root / "repo"
    shutil.copytree(EXAMPLES, repo, ignore=shutil.ignore_patterns("README.md", "__pycache__"))
    # two versions, both served
    mv = repo / "multi_version"
    for v in (1, 2):
        (mv / str(v)).mkdir(parents=True)
        (mv / str(v) / "model.py").write_text(IDENTITY_PY)
    (mv / "config.pbtxt").write_text(_config("multi_version", 8, "version_policy: { all { } }\n"))
    # dynamic batching with a queue delay, for the concurrency test
    bm = repo / "batched"
    (bm / "1").mkdir(parents=True)
    (bm / "1" / "model.py").write_text(IDENTITY_PY)
    (bm / "config.pbtxt").write_text(
        _config("batched", 64, "dynamic_batching { max_queue_delay_microseconds: 20000 }\n")
    )
    # a config that breaks a rule: listed UNAVAILABLE, never stops the others
    broken = repo / "broken_config"
    (broken / "1").mkdir(parents=True)
    (broken / "1" / "model.py").write_text(IDENTITY_PY)
    (broken / "config.pbtxt").write_text(_config("broken_config", -3))
    # a model whose initialize() raises
    failing = repo / "failing_init"
    (failing / "1").mkdir(parents=True)
    (failing / "1" / "model.py").write_text(FAILING_PY)
    (failing / "config.pbtxt").write_text(_config("failing_init", 0))
    # BLS from a sync and an async execute, calling add_sub's deployment through Serve
    for name, outputs, extra in (
        (
            "bls",
            ("OUTPUT0", "OUTPUT1"),
            'parameters { key: "MODEL_NAME" value: { string_value: "add_sub" } }\n',
        ),
        ("bls_async", ("OUTPUT0",), ""),
        (
            "bls_missing",
            ("OUTPUT0", "OUTPUT1"),
            'parameters { key: "MODEL_NAME" value: { string_value: "no_such_model" } }\n',
        ),
        (
            "bls_traced",
            ("OUTPUT0", "OUTPUT1"),
            "",
        ),  # passes its trace to add_sub (tests/serve/test_tracing_e2e.py)
    ):
        (repo / name / "1").mkdir(parents=True)
        source = "bls" if name == "bls_missing" else name
        shutil.copy(BLS_MODELS / source / "1" / "model.py", repo / name / "1" / "model.py")
        (repo / name / "config.pbtxt").write_text(_bls_config(name, outputs) + extra)
    _stateful_models(repo)
    (repo / "slow" / "1").mkdir(parents=True)
    (repo / "slow" / "1" / "model.py").write_text(SLOW_PY)
    (repo / "slow" / "config.pbtxt").write_text(SLOW_CONFIG)
    # an ensemble whose one step runs on add_sub's own replicas (placement "separate": nothing is hosted)
    (repo / "add_sub_separate" / "1").mkdir(parents=True)
    (repo / "add_sub_separate" / "config.pbtxt").write_text(ADD_SUB_SEPARATE)
    (repo / "bls_ensemble" / "1").mkdir(parents=True)
    (repo / "bls_ensemble" / "config.pbtxt").write_text(BLS_ENSEMBLE)
    # Triton's response cache (the session's server runs with a local cache)
    cached = repo / "cached"
    shutil.copytree(BLS_MODELS / "counting" / "1", cached / "1")
    (cached / "config.pbtxt").write_text(
        textwrap.dedent(
            """
            name: "cached"
            backend: "python"
            max_batch_size: 4
            input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
            output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "CALLS" data_type: TYPE_INT32 dims: [ -1 ] } ]
            instance_group [ { count: 1 kind: KIND_CPU } ]
            response_cache { enable: true }
            """
        )
    )
    from tests.serve.python_api_models import add_python_api_models

    add_python_api_models(repo)
    add_streaming_models(repo)
    _python_api_e2e_models(repo)
    # two models on the Python-based backend add_sub: no model.py of their own, only their model.json
    for name, operation in (("based_add", "add"), ("based_sub", "sub")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.json").write_text(json.dumps({"operation": operation}))
        (repo / name / "config.pbtxt").write_text('backend: "add_sub"\nmax_batch_size: 8\n')
    for name in SESSION_POOLED:
        with (repo / name / "config.pbtxt").open("a") as config:
            config.write(POOLED_PARAMETER)
    return repo


# The session's server runs one model host (docs/hosts.md) for the models below, which ask for it with
# ``ray.placement``; every other model keeps its own deployment, as the tests of replicas, placement,
# recovery and per-replica logs and metrics need. The pooled ones are models whose tests look only at
# what a client sees, so those tests also hold for a pooled model; and a replica process fewer each
# makes the shared server start sooner and leaves the 2-core machine more CPU for every test.
SESSION_POOLED = (
    "auto_complete_scale",
    "identity_fp32",
    "simple_torchscript",
    "string_upper",
    "request_api",
    "dlpack_identity",
    "dlpack_report",
    "auto_complete",
    "bls_args",
    "error_codes",
    "bls_by_name",
    "bls_decoupled_async",
    "bls_decoupled_sync",
    "control_target",
    "model_control",
)
# one host replica, for the models that ask (SESSION_POOLED) alone
SESSION_HOSTS = {"model_hosts": 1, "model_host_placement": "dedicated", "model_host_cpus": 0.1}
POOLED_PARAMETER = '\nparameters { key: "ray.placement" value: { string_value: "pooled" } }\n'


# tests/serve/test_python_api_e2e.py: the Ray-free API models of tests/backends/python_models (with
# the configs they need here, when they have none) and the ones written for the e2e tests
PYTHON_API_E2E_MODELS = (
    "request_api",
    "reschedule",
    "dlpack_identity",
    "dlpack_report",
    "auto_complete",
    "logger_api",
    "bls_args",
)
PYTHON_API_E2E_CONFIGS = {
    "dlpack_identity": (
        'name: "dlpack_identity"\nbackend: "python"\nmax_batch_size: 4\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
    ),
    # no inputs, outputs or batching: the model's auto_complete_config adds them
    "auto_complete": 'name: "auto_complete"\nbackend: "python"\n',
}


def _python_api_e2e_models(repo: Path) -> None:
    for name in PYTHON_API_E2E_MODELS:
        shutil.copytree(BLS_MODELS / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name, config in PYTHON_API_E2E_CONFIGS.items():
        (repo / name / "config.pbtxt").write_text(config)


# A running sum per sequence that also reports what it was given (START, END, READY, CORRID) and
# which process (replica) ran it.
ACCUMULATOR_PY = textwrap.dedent(
    """
    import os

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.sums = {}

        def execute(self, requests):
            responses = []
            for request in requests:
                get = lambda name: pb_utils.get_input_tensor_by_name(request, name).as_numpy()
                value = get("IN")
                start, end, ready = (int(get(n).reshape(-1)[0]) for n in ("START", "END", "READY"))
                corrid = int(get("CORRID").reshape(-1)[0])
                if not ready:
                    total = np.zeros_like(value)
                else:
                    if start:
                        self.sums[corrid] = np.zeros_like(value)
                    if corrid not in self.sums:
                        raise pb_utils.TritonModelException(f"sequence {corrid} has no state here")
                    self.sums[corrid] = self.sums[corrid] + value
                    total = self.sums[corrid]
                    if end:
                        del self.sums[corrid]
                controls = np.array([[start, end, ready, corrid]], dtype=np.int64)
                pid = np.array([[os.getpid()]], dtype=np.int64)
                responses.append(
                    pb_utils.InferenceResponse(
                        output_tensors=[
                            pb_utils.Tensor("OUT", total.astype(np.int32)),
                            pb_utils.Tensor("CONTROLS", controls),
                            pb_utils.Tensor("PID", pid),
                        ]
                    )
                )
            return responses
    """
)

ACCUMULATOR_CONFIG = """
name: "seq_accumulator"
backend: "python"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "CONTROLS" data_type: TYPE_INT64 dims: [ 4 ] },
  { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }
]
sequence_batching {
  max_sequence_idle_microseconds: 15000000
  direct { }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
instance_group [ { kind: KIND_CPU count: 2 } ]
"""


def _stateful_models(repo: Path) -> None:
    """Two stateful models with 2 replicas each (tests/serve/test_sequence_e2e.py): the Python running
    sum (state in the model, keyed by CORRID) and an ONNX running sum whose state the server keeps."""
    acc = repo / "seq_accumulator"
    (acc / "1").mkdir(parents=True)
    (acc / "1" / "model.py").write_text(ACCUMULATOR_PY)
    (acc / "config.pbtxt").write_text(ACCUMULATOR_CONFIG)
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["IN", "STATE_IN"], ["SUM"]), helper.make_node("Identity", ["SUM"], ["OUT"])]
        + [helper.make_node("Identity", ["SUM"], ["STATE_OUT"])],
        "running_sum",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, 1]) for n in ("IN", "STATE_IN")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, 1]) for n in ("OUT", "STATE_OUT")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    state = repo / "seq_state"
    (state / "1").mkdir(parents=True)
    onnx.save(model, str(state / "1" / "model.onnx"))
    (state / "config.pbtxt").write_text(
        textwrap.dedent(
            """
            name: "seq_state"
            backend: "onnxruntime"
            max_batch_size: 8
            input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
            output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
            sequence_batching {
              max_sequence_idle_microseconds: 5000000
              direct { }
              state [ {
                input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 1 ]
                initial_state { name: "zero" data_type: TYPE_FP32 dims: [ 1 ] zero_data: true }
              } ]
            }
            instance_group [ { count: 2 kind: KIND_CPU } ]
            """
        )
    )


def _bls_config(name: str, outputs: tuple[str, ...]) -> str:
    tensor = '{{ name: "{}" data_type: TYPE_FP32 dims: [ 4 ] }}'
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n'
        f"input [ {tensor.format('INPUT0')}, {tensor.format('INPUT1')} ]\n"
        f"output [ {', '.join(tensor.format(o) for o in outputs)} ]\n"
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
    )


SESSION_PORT_BLOCK = 9  # ports of its own for the session's Serve instance (request_path.instance_ports_env)


@pytest.fixture(scope="session")
def session_ports() -> dict[str, int]:
    """The shared server's HTTP, gRPC and metrics ports, chosen as it starts: the modules that use it
    run last (tests/conftest.py), and a port picked at collection could be taken by then."""
    http, grpc, metrics, otlp = free_ports(4)  # four different ones: each is free only until bound
    return {"http": http, "grpc": grpc, "metrics": metrics, "otlp": otlp}


@pytest.fixture(scope="session")
def metrics_url(server_url: str, session_ports: dict[str, int]) -> str:
    """``host:port`` of the shared server's metrics endpoint (``/metrics``)."""
    return f"127.0.0.1:{session_ports['metrics']}"


@pytest.fixture(scope="session")
def grpc_url(server_url: str, session_ports: dict[str, int]) -> str:
    """``host:port`` of the shared server's gRPC service."""
    return f"127.0.0.1:{session_ports['grpc']}"


@pytest.fixture(scope="session")
def cancel_markers(test_repository: Path) -> Path:
    """Where ``until_cancelled`` writes ``<X>.cancelled`` when it sees its request cancelled."""
    return test_repository.parent / "cancel_markers"


KEEP_LOGS_ENV = "TRITON_SERVE_TEST_LOGS"


def keep_logs(ray_tmp: Path, destination: str) -> Path | None:
    """Copy the shared server's Serve logs (the controller's, the proxy's and every replica's) to
    ``destination`` (``TRITON_SERVE_TEST_LOGS``), under a folder named for this test session's pid, so
    a failure seen once in a long run can be read after the session removed its Ray folder; and, in
    ``workers/``, what each Ray worker wrote to its standard output and error (where the server's own
    log lines go: why a model failed to load, for one)."""
    logs = ray_tmp / "session_latest" / "logs"
    source = logs / "serve"
    if not destination or not source.is_dir():
        return None
    target = Path(destination) / f"session-{os.getpid()}"
    shutil.copytree(source, target, dirs_exist_ok=True)
    workers = [
        f for pattern in ("worker-*.out", "worker-*.err") for f in logs.glob(pattern) if f.stat().st_size
    ]
    if workers:
        (target / "workers").mkdir(exist_ok=True)
        for found in workers:
            shutil.copy2(found, target / "workers" / found.name)
    return target


@pytest.fixture(scope="session")
def test_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_test_repository(tmp_path_factory.mktemp("serve"))


@pytest.fixture(scope="session")
def server_url(test_repository: Path, session_ports: dict[str, int]) -> Iterator[str]:
    """``host:port`` of the shared server (HAProxy in front of every model replica).

    Ray's temporary folder and HAProxy's files are this session's own; the teardown ends, by pid, the
    processes this test session started that outlived ``serve.shutdown`` / ``ray.shutdown``.
    """
    from deployments.serve import launch
    from deployments.settings import ServerSettings

    tmp = Path(tempfile.mkdtemp(prefix="trs-", dir="/tmp"))
    port = session_ports["http"]
    # ports of its own (HAProxy's listeners, Serve's fallback proxies, replica ranges), apart from a running
    # server's defaults and from the standalone and bench servers' blocks
    os.environ.update(instance_ports_env(SESSION_PORT_BLOCK))
    os.environ.update(haproxy_files_env(tmp / "haproxy"))
    settings = ServerSettings.from_args(
        {
            "model_repository": str(test_repository),
            "http_port": port,
            "metrics_port": session_ports["metrics"],
            "grpc_port": session_ports["grpc"],
            "model_control_mode": "explicit",
            "load_model": ["*"],
            "backend_directory": str(PYTHON_BACKENDS),
            "exit_on_error": False,  # broken_config and failing_init are meant to fail
            "cache_config": ["local,size=1048576"],
            **SESSION_HOSTS,
            "placement_timeout_s": 5,  # test_model_control_e2e: a load no node can place fails soon
            # the rate limiter (tests/serve/test_rate_limit_e2e.py): only models that list resources wait
            "rate_limit": "execution_count",
            "rate_limit_resource": ["R_ONE:1"],
            # Triton's --exit-timeout-secs (default 30): a replica stopping with a request the test left
            # hanging ends after this long
            "exit_timeout_secs": SESSION_EXIT_TIMEOUT_S,
            # tracing (OFF until a test turns it on): spans to tests/serve/test_tracing_e2e.py's receiver
            "trace_config": [
                "mode=opentelemetry",
                f"opentelemetry,url=127.0.0.1:{session_ports['otlp']}/v1/traces",
                "opentelemetry,bsp_schedule_delay=200",
                "opentelemetry,resource=service.name=triton-serve-tests",
            ],
        }
    )
    before = processes.descendants()
    started: set[int] = set()
    try:
        launch.start(
            settings,
            ray_init={
                "num_cpus": 2,
                "include_dashboard": False,
                "_temp_dir": str(tmp / "ray"),
                "log_to_driver": False,
            },
        )
        started = processes.descendants() - before
        yield f"127.0.0.1:{port}"
    finally:
        started |= processes.descendants() - before
        try:
            launch.stop()
        finally:
            started |= processes.descendants() - before
            processes.end(started)
            keep_logs(tmp / "ray", os.environ.get(KEEP_LOGS_ENV, ""))
            shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def no_local_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    """HAProxy configurations written by hand name replica ports that a server running on this machine
    may use: their rewrites never look for that server's local sockets (tests/serve/test_local_sockets.py
    does)."""
    from deployments.serve import local_sockets

    monkeypatch.setattr(local_sockets, "local_address", lambda host, port, environ=None: None)
