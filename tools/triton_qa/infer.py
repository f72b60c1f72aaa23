"""``L0_infer`` on CPU: the add/sub models of ``gen_qa_models.py`` over HTTP, gRPC and gRPC streams.

``test.sh`` builds one repository for the backends in ``BACKENDS`` and runs ``infer_test.py`` against
it, target ``cpu`` (``TRITON_SERVER_CPU_ONLY``). Here two runs:

* ``python``: ``BACKENDS=python``, the Python models ``test.sh`` makes from each ONNX model's
  configuration (its platform dropped, ``backend: "python"``, every ``onnx`` in it renamed) with
  ``qa/python_models/add_sub`` (``sub_add`` for the same-type ``float32``, ``int32``, ``int16`` and
  ``int8`` models, whose outputs ``gen_qa_models.py`` swaps), and the ``nop`` models, as ``test.sh``
  copies them. Both servers can run it.
* ``onnx python``: ``BACKENDS="onnx python"``, the ONNX models too, and with them the ``simple_``,
  ``sequence_`` and ``fan_`` ensembles of each (``gen_qa_models.py --ensemble``), whose steps are the
  ONNX model and ``nop`` identities on Triton's C++ ``identity`` backend: here the runner's Python
  identity with the same configuration, on both servers (about 230 models).

Both runs give this server one model host (``--model-hosts 1``, docs/hosts.md), where every model and
ensemble shares one process, as in tritonserver; with a replica process per model, 79 models do not
start on a 2-core machine within the runner's wait.
"""

from __future__ import annotations

from tools.triton_qa.suites import Edit, Model, Run, Suite, env, register

_REPOSITORY = "qa_model_repository"
_ENSEMBLES = "qa_ensemble_model_repository"
# the (input, output0, output1) types of gen_qa_models.py's ONNX models, each with and without batching
TYPES = (
    "float16_float16_float16",
    "float16_float32_float32",
    "float32_float32_float32",
    "float32_int32_int32",
    "int16_int16_int16",
    "int32_float16_int16",
    "int32_float32_float32",
    "int32_int32_int32",
    "int32_int32_object",
    "int32_int8_int16",
    "int32_int8_int8",
    "int32_object_int32",
    "int32_object_object",
    "int64_int64_int64",
    "int8_int32_int32",
    "int8_int8_int8",
    "object_int32_int32",
    "object_int32_object",
    "object_object_int32",
    "object_object_object",
)
# test.sh's swap_types: these same-type models subtract first (version 1 of gen_qa_models.py swaps them)
SWAPPED = frozenset(f"{t}_{t}_{t}" for t in ("float32", "int32", "int16", "int8"))
# the nop models the ensembles step through (gen_qa_models.py --ensemble writes one per type and rank)
NOP_TYPES = [
    "BOOL",
    "FP16",
    "FP32",
    "FP64",
    "INT16",
    "INT32",
    "INT64",
    "INT8",
    "STRING",
    "UINT16",
    "UINT32",
    "UINT64",
    "UINT8",
]
NOP_SHAPES = ("-1", "-1,-1", "-1,-1,-1")
CPU_GROUP = "instance_group [ { kind: KIND_CPU }]\n"


def _onnx_names() -> list[str]:
    return [f"onnx{batching}_{types}" for types in TYPES for batching in ("", "_nobatch")]


def onnx_model(name: str) -> Model:
    """An ONNX add/sub model as test.sh copies it, given a CPU instance group (target ``cpu``)."""
    return Model(name, "generated", f"{_REPOSITORY}/{name}", append=CPU_GROUP)


def python_model(onnx_name: str) -> Model:
    """test.sh's Python model made from ONNX model ``onnx_name``'s configuration and label file."""
    name = onnx_name.replace("onnx", "python")
    types = onnx_name.removeprefix("onnx_").removeprefix("nobatch_")
    code = "sub_add" if types in SWAPPED else "add_sub"
    return Model(
        name,
        "generated",
        f"{_REPOSITORY}/{onnx_name}",
        files=(
            ("config.pbtxt", "config.pbtxt"),
            ("output0_labels.txt", "output0_labels.txt"),
            (f"qa/python_models/{code}/model.py", "1/model.py"),
        ),
        edits=(
            Edit(r"platform:.*", ""),
            Edit(r"version_policy.*", 'backend: "python"'),
            Edit("onnx", "python", scope="all"),
        ),
        append=CPU_GROUP,
    )


def nop_model(name: str) -> Model:
    """A ``nop`` step (Triton's C++ identity backend) as the runner's Python identity, same configuration."""
    return Model(
        name,
        "generated",
        f"{_ENSEMBLES}/{name}",
        files=(("config.pbtxt", "config.pbtxt"), ("own:identity/1/model.py", "1/model.py")),
        edits=(Edit(r'backend: "identity"', 'backend: "python"'),),
    )


ONNX_MODELS = tuple(onnx_model(n) for n in _onnx_names())
PYTHON_MODELS = tuple(python_model(n) for n in _onnx_names())
ENSEMBLE_MODELS = tuple(
    Model(f"{prefix}_{n}", "generated", f"{_ENSEMBLES}/{prefix}_{n}")
    for prefix in ("simple", "sequence", "fan")
    for n in _onnx_names()
)
NOP_MODELS = tuple(nop_model(f"nop_TYPE_{t}_{s}") for t in NOP_TYPES for s in NOP_SHAPES)
# test.sh's flags that matter here (the Python stub's timeout and shared memory are tritonserver's own)
SERVER_ARGS = (
    "--exit-timeout-secs=600",
    "--backend-config=python,stub-timeout-seconds=120",
    "--backend-config=python,shm-default-byte-size=1048576",
)
# 79 models or more: on this server one model host process for them (a replica process per model would
# not fit this machine; the server says so at start and names the flag)
HOSTED_ARGS = (*SERVER_ARGS, "this:--model-hosts=1")
_TEST_SH_ENV = {"TRITON_SERVER_CPU_ONLY": "1", "ENSEMBLES": "1"}  # the cpu target, ensembles on

L0_INFER = Suite(
    "L0_infer",
    (
        Run(
            "python",
            "infer_test.py",
            (*PYTHON_MODELS, *NOP_MODELS),
            server_args=HOSTED_ARGS,
            env=env(BACKENDS="python", **_TEST_SH_ENV),
            timeout_s=1800.0,
        ),
        Run(
            "onnx python",
            "infer_test.py",
            (*ONNX_MODELS, *PYTHON_MODELS, *ENSEMBLE_MODELS, *NOP_MODELS),
            server_args=HOSTED_ARGS,
            env=env(BACKENDS="onnx python", **_TEST_SH_ENV),
            timeout_s=2400.0,
        ),
    ),
    (
        (
            "graphdef savedmodel libtorch plan openvino python_dlpack models",
            "TensorFlow, LibTorch, TensorRT and OpenVINO do not run here; python_dlpack needs test.sh's "
            "torch 1.13 install",
        ),
        (
            "onnx models and their ensembles on tritonserver",
            "the tritonserver 2.51 here has the Python backend only: the onnx run's tests stop there at "
            "their first ONNX model",
        ),
        (
            "nop models",
            "Triton's identity backend (C++) is on neither server; the runner's Python identity stands in "
            "on both",
        ),
        (
            "the gpu target, shared-memory and valgrind variants",
            "no GPU here; TEST_SYSTEM_SHARED_MEMORY / TEST_CUDA_SHARED_MEMORY and valgrind are other CI "
            "jobs of test.sh",
        ),
        (
            "custom_zero_1_float32 and the graphdef mix ensembles",
            "used only with graphdef and savedmodel in BACKENDS",
        ),
    ),
)

register(L0_INFER)
