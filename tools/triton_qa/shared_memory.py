"""``L0_shared_memory``: system shared memory with tritonclient's helpers, over HTTP and gRPC.

``test.sh`` runs each test of ``SharedMemoryTest`` on a server of its own, once with
``CLIENT_TYPE=http`` and once with ``grpc``, against Triton's example ``simple`` (a Python stand-in
with the same INT32 inputs and outputs here, on both servers). It then runs
``TestSharedMemoryUnregister`` against ``execute_delayed_model`` (as ``simple``): unregistering a
region while an inference uses it, which Triton refuses and this server allows (docs/compatibility.md).
``psutil``, which ``test.sh`` installs, is a stand-in of the harness (``harness/psutil.py``).
"""

from __future__ import annotations

from tools.triton_qa.suites import SIMPLE, Run, Suite, env, python_model, register

TESTS = (
    "test_invalid_create_shm",
    "test_valid_create_set_register",
    "test_unregister_before_register",
    "test_unregister_after_register",
    "test_reregister_after_register",
    "test_unregister_after_inference",
    "test_register_after_inference",
    "test_too_big_shm",
    "test_mixed_raw_shm",
    "test_unregisterall",
    "test_infer_offset_out_of_bound",
    "test_infer_byte_size_out_of_bound",
    "test_register_out_of_bound",
    "test_python_client_leak",
)
DELAYED_SIMPLE = python_model("simple", "execute_delayed_model")

L0_SHARED_MEMORY = Suite(
    "L0_shared_memory",
    (
        *(
            Run(
                f"shared_memory_test ({client})",
                "shared_memory_test.py",
                (SIMPLE,),
                server_args=("--log-verbose=1",),
                env=env(CLIENT_TYPE=client),
                tests=tuple(f"SharedMemoryTest.{t}" for t in TESTS),
                server_per_test=True,
            )
            for client in ("http", "grpc")
        ),
        *(
            Run(
                f"unregister during inference ({client})",
                "shared_memory_test.py",
                (DELAYED_SIMPLE,),
                server_args=("--log-verbose=1",),
                env=env(CLIENT_TYPE=client),
                tests=(f"TestSharedMemoryUnregister.test_unregister_shm_during_inference_{client}",),
            )
            for client in ("http", "grpc")
        ),
    ),
    (
        (
            "model simple",
            "a TensorFlow GraphDef in Triton's repository; a Python stand-in with the same inputs and "
            "outputs is used",
        ),
        ("psutil", "test.sh installs it with pip; a stand-in of its Process().memory_info() is used"),
        ("L0_cuda_shared_memory", "CUDA shared memory: no GPU path for a client's CUDA IPC handle here"),
    ),
)

register(L0_SHARED_MEMORY)
