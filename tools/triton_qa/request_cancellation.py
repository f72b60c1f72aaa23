"""``L0_request_cancellation``: a client's cancellation reaches the schedulers that hold its requests.

``scheduler_test.py`` fills a model's one instance (an identity that takes 6 s per batch), queues more
requests on the dynamic batcher, on a direct and an oldest sequence batcher (queued and backlogged
sequences), on an ensemble and on a gRPC stream, cancels them from the client and reads
``nv_inference_request_failure{reason="CANCELED"}``. ``implicit_state_test.py`` cancels a stream of
a TorchScript sequence model with implicit state and checks that a later sequence in the same slot
does not see its state. ``grpc_cancellation_test.py`` cancels gRPC calls (unary, streams, ``grpc.aio``)
to a model that takes 10 s, a server per test as ``test.sh`` does.

The ``identity`` models of ``test.sh`` are Triton's C++ identity backend: here the runner's Python
identity with the same configuration (it sleeps ``execute_delay_ms`` per batch, as that backend does),
on both servers.
"""

from __future__ import annotations

from tools.triton_qa.suites import Model, Run, Suite, register


def _identity(name: str, config: str) -> Model:
    """The runner's Python identity with the configuration ``test.sh`` writes for ``name``."""
    return Model(name, "own", "identity", append=f'name: "{name}"\nbackend: "python"\n{config}')


_FP32_IO = (
    'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]\n'
    'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]\n'
    "instance_group [{ count: 1 kind: KIND_CPU }]\n"
)
_DELAY_6S = 'parameters [{ key: "execute_delay_ms" value: { string_value: "6000" } }]\n'

SCHEDULER_MODELS = (
    _identity(
        "dynamic_batch",
        "max_batch_size: 2\n"
        + _FP32_IO
        + "dynamic_batching { max_queue_delay_microseconds: 600000 }\n"
        + _DELAY_6S,
    ),
    _identity(
        "sequence_direct",
        "max_batch_size: 1\n"
        + _FP32_IO
        + "sequence_batching { direct { } max_sequence_idle_microseconds: 6000000 }\n"
        + _DELAY_6S,
    ),
    _identity(
        "sequence_oldest",
        "max_batch_size: 1\n"
        + _FP32_IO
        + "sequence_batching { oldest { max_candidate_sequences: 1 } max_sequence_idle_microseconds: 6000000 }\n"
        + _DELAY_6S,
    ),
    Model(
        "ensemble_model",
        "own",
        "empty",
        append=(
            'name: "ensemble_model"\nplatform: "ensemble"\nmax_batch_size: 1\n'
            'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]\n'
            'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]\n'
            "ensemble_scheduling { step [\n"
            '{ model_name: "dynamic_batch" model_version: -1 input_map { key: "INPUT0" value: "INPUT0" } '
            'output_map { key: "OUTPUT0" value: "out" } },\n'
            '{ model_name: "dynamic_batch" model_version: -1 input_map { key: "INPUT0" value: "out" } '
            'output_map { key: "OUTPUT0" value: "OUTPUT0" } }\n'
            "] }\n"
        ),
        version_folders=("1",),
    ),
)

GRPC_MODELS = (
    _identity(
        "custom_identity_int32",
        "max_batch_size: 1024\n"
        'input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] }]\n'
        'output [{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] }]\n'
        "instance_group [{ kind: KIND_CPU }]\n"
        'parameters [{ key: "execute_delay_ms" value: { string_value: "10000" } }]\n',
    ),
)

STATE_MODELS = (
    Model(
        "sequence_state",
        "python",
        "qa/L0_request_cancellation/implicit_state_model",
        files=(("config.pbtxt", "config.pbtxt"), ("model.pt", "1/model.pt")),
    ),
)

_LOG = "--log-verbose=1"

L0_REQUEST_CANCELLATION = Suite(
    "L0_request_cancellation",
    (
        Run(
            "grpc_cancellation_test",
            "grpc_cancellation_test.py",
            GRPC_MODELS,
            server_args=(_LOG,),
            tests=(
                "GrpcCancellationTest.test_grpc_async_infer",
                "GrpcCancellationTest.test_grpc_stream_infer",
                "GrpcCancellationTest.test_aio_grpc_async_infer",
                "GrpcCancellationTest.test_aio_grpc_stream_infer",
            ),
            server_per_test=True,
        ),
        Run("scheduler_test", "scheduler_test.py", SCHEDULER_MODELS, server_args=("--log-verbose=2",)),
        Run(
            "implicit_state_test",
            "implicit_state_test.py",
            STATE_MODELS,
            server_args=(_LOG,),
            server_log_name="implicit_state_test.server.log",
        ),
    ),
    (
        (
            "models dynamic_batch, sequence_direct, sequence_oldest, custom_identity_int32",
            "on Triton's C++ identity backend; the runner's Python identity with the same configuration is "
            "used on both servers",
        ),
        ("request_cancellation_test", "a C++ unit test of Triton's core library"),
        (
            "GrpcCancellationTest.test_grpc_async_infer_cancellation_at_step_start",
            "counts tritonserver's gRPC handler log lines under its TRITONSERVER_DELAY_GRPC_PROCESS test hook",
        ),
        (
            "test.sh's grep for 'Cancellation notification received'",
            "a check of tritonserver's log text, not a Python test",
        ),
    ),
)

register(L0_REQUEST_CANCELLATION)
