"""Build a run's model repository from the user's checkout of Triton's server repository.

Python models and model folders are copied from the checkout and their ``config.pbtxt`` edited the way
the suite's ``test.sh`` does with ``sed``; ONNX models are generated once per work folder with the
checkout's own ``qa/common/gen_qa_*.py`` scripts (they need only ``onnx`` and numpy).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tools.triton_qa.suites import Edit, Model

# opset 13 / IR 8: what the ONNX Runtime of Triton 2.51's time loads (newer onnx writes newer by default)
ONNX_OPSET, ONNX_IR_VERSION = 13, 8
_ONNX = ("--onnx", f"--onnx_opset={ONNX_OPSET}")
# the gen_qa_* script and flags that write each generated repository
GENERATORS: dict[str, tuple[str, ...]] = {
    "qa_identity_model_repository": ("gen_qa_identity_models.py", *_ONNX),
    "qa_model_repository": ("gen_qa_models.py", *_ONNX),
    "qa_variable_model_repository": ("gen_qa_models.py", *_ONNX, "--variable"),
    "qa_sequence_model_repository": ("gen_qa_sequence_models.py", *_ONNX),
    "qa_variable_sequence_model_repository": ("gen_qa_sequence_models.py", *_ONNX, "--variable"),
    "qa_sequence_implicit_model_repository": ("gen_qa_implicit_models.py", *_ONNX),
    "qa_dyna_sequence_model_repository": ("gen_qa_dyna_sequence_models.py", *_ONNX),
    "qa_dyna_sequence_implicit_model_repository": ("gen_qa_dyna_sequence_implicit_models.py", *_ONNX),
    # Triton's qa_ensemble_model_repository/qa_identity_model_repository: the *_zero ensembles and their
    # nop models (configurations only; the nop models are on Triton's identity backend)
    "qa_ensemble_identity_model_repository": ("gen_qa_identity_models.py", "--ensemble"),
    # Triton's qa_ensemble_model_repository/qa_model_repository: the simple_*/fan_* ensembles (configurations)
    "qa_ensemble_model_repository": ("gen_qa_models.py", "--ensemble"),
    # the TorchScript models of qa_model_repository (needs torch)
    "qa_libtorch_model_repository": ("gen_qa_models.py", "--libtorch"),
}

# a stand-in for Triton's example "simple" (a TensorFlow GraphDef): INT32 [-1, 16] sum and difference
_SIMPLE_CONFIG = """name: "simple"
backend: "python"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
instance_group [ { kind: KIND_CPU } ]
"""

_SIMPLE_MODEL = '''"""OUTPUT0 = INPUT0 + INPUT1 and OUTPUT1 = INPUT0 - INPUT1, element-wise (INT32)."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [
                pb_utils.Tensor("OUTPUT0", (a + b).astype(a.dtype)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(a.dtype)),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
'''

# the add/sub of two BYTES tensors of numbers, as INT32: the code of a Python stand-in for the TensorFlow
# models ``*_object_int32_int32`` (their configuration comes from the ONNX model of the same types)
_OBJECT_ADDSUB_MODEL = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy().astype(np.int32)
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy().astype(np.int32)
            outputs = [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
"""

# a TorchScript identity over FP32 [8] with dynamic batching (L0_input_validation's pt_identity)
_PT_IDENTITY_CONFIG = """name: "pt_identity"
backend: "pytorch"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 8 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 8 ] } ]
dynamic_batching { max_queue_delay_microseconds: 1000000 }
"""

# OUTPUT0 = INPUT0 + INPUT1 and OUTPUT1 = INPUT0 - INPUT1 in each output's configured type: the code of
# Python stand-ins for the TensorFlow models ``graphdef_<in>_<out0>_<out1>`` of gen_qa_models.py (their
# configuration comes from the ONNX model of the same types). Without a configuration (a test deletes it)
# it completes one as the ONNX backend would for the float32 model: FP32 [16] tensors, batches up to 4.
_ADDSUB_MODEL = """import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        if not config.as_dict().get("input"):
            config.set_max_batch_size(4)
            for name in ("INPUT0", "INPUT1"):
                config.add_input({"name": name, "data_type": "TYPE_FP32", "dims": [16]})
            for name in ("OUTPUT0", "OUTPUT1"):
                config.add_output({"name": name, "data_type": "TYPE_FP32", "dims": [16]})
        return config

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.types = {
            o["name"]: pb_utils.triton_string_to_numpy(o["data_type"]) for o in config["output"]
        }

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [
                pb_utils.Tensor("OUTPUT0", (a + b).astype(self.types["OUTPUT0"])),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(self.types["OUTPUT1"])),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
"""

# an identity over every input (OUTPUTn = INPUTn): the code of Python stand-ins for models on Triton's
# C++ identity backend, which also takes as long as its ``execute_delay_ms`` parameter says to execute
# and its ``creation_delay_sec`` parameter says to load
_IDENTITY_MODEL = """import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import json

        config = json.loads(args["model_config"])
        self.names = [(i["name"], i["name"].replace("INPUT", "OUTPUT")) for i in config["input"]]
        parameters = config.get("parameters", {})
        delay = parameters.get("execute_delay_ms", {}).get("string_value") or "0"
        self.delay_s = int(delay) / 1000
        time.sleep(int(parameters.get("creation_delay_sec", {}).get("string_value") or "0"))

    def execute(self, requests):
        if self.delay_s:
            time.sleep(self.delay_s)
        responses = []
        for request in requests:
            outputs = []
            for source, target in self.names:
                tensor = pb_utils.get_input_tensor_by_name(request, source)
                if tensor is not None:
                    outputs.append(pb_utils.Tensor(target, tensor.as_numpy()))
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
"""

# the outputs swapped (OUTPUT0 = INPUT0 - INPUT1, OUTPUT1 = INPUT0 + INPUT1): gen_qa_models.py's versions
# 2 and 3 of a model
_SUBADD_MODEL = _ADDSUB_MODEL.replace('"OUTPUT0", (a + b)', '"OUTPUT0", (a - b)').replace(
    '"OUTPUT1", (a - b)', '"OUTPUT1", (a + b)'
)

OWN_MODELS: dict[str, dict[str, str]] = {
    "identity": {"1/model.py": _IDENTITY_MODEL},
    "empty": {},  # a folder whose configuration the run writes (an ensemble)
    "subadd": {"1/model.py": _SUBADD_MODEL},
    "simple": {"config.pbtxt": _SIMPLE_CONFIG, "1/model.py": _SIMPLE_MODEL},
    "object_addsub": {"1/model.py": _OBJECT_ADDSUB_MODEL},
    "addsub": {"1/model.py": _ADDSUB_MODEL},
    "pt_identity": {"config.pbtxt": _PT_IDENTITY_CONFIG},
}
# own models with a TorchScript file: the module torch.jit.script makes for each
TORCHSCRIPT_MODULES = {"pt_identity": "torch.nn.Identity"}


class ModelBuildError(RuntimeError):
    """A model could not be built from the checkout; the message says which and why."""


@dataclass
class BuiltRepository:
    """A laid-out repository and what of it could not be built (``(model, why)`` pairs)."""

    path: Path
    skipped: list[tuple[str, str]] = field(default_factory=list)


def apply_edit(text: str, edit: Edit) -> str:
    """``text`` after one ``sed``-like substitution (``edit.scope``: line / all / file)."""
    pattern = re.compile(edit.pattern)
    if edit.scope == "file":
        return pattern.sub(edit.replacement, text, count=1)
    count = 0 if edit.scope == "all" else 1
    return "".join(
        pattern.sub(edit.replacement, line, count=count) for line in text.splitlines(keepends=True)
    )


def edit_config(path: Path, model: Model) -> None:
    """Apply ``model``'s edits and appended text to the ``config.pbtxt`` at ``path``."""
    if not model.edits and not model.append:
        return
    text = path.read_text() if path.exists() else ""
    for edit in model.edits:
        text = apply_edit(text, edit)
    if model.append:
        text = text + ("" if text.endswith("\n") or not text else "\n") + model.append
    path.write_text(text)


def generate(checkout: Path, cache: Path, repository: str) -> Path:
    """``cache/<repository>`` written by the checkout's generator script (once; it is kept)."""
    dest = cache / repository
    if (dest / ".complete").exists():
        return dest
    if repository not in GENERATORS:
        raise ModelBuildError(f"no generator known for {repository}")
    script, *flags = GENERATORS[repository]
    common = checkout / "qa" / "common"
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    cmd = [sys.executable, script, *flags, f"--models_dir={dest}"]
    result = subprocess.run(cmd, cwd=common, capture_output=True, text=True)
    if result.returncode != 0:
        raise ModelBuildError(f"{script} {' '.join(flags)} failed: {result.stderr.strip()[-400:]}")
    for path in dest.rglob("*.onnx"):
        cap_ir_version(path)
    (dest / ".complete").write_text("")
    return dest


def cap_ir_version(path: Path, most: int = ONNX_IR_VERSION) -> None:
    """Lower an ONNX file's IR version to ``most``: a newer ``onnx`` package writes a version that the
    ONNX Runtime of tritonserver 2.51 (and older runtimes) refuse to load."""
    import onnx

    model = onnx.load(str(path))
    if model.ir_version > most:
        model.ir_version = most
        onnx.save(model, str(path))


def build_model(model: Model, checkout: Path, cache: Path, dest: Path) -> None:
    """Write ``model`` into ``dest/<model.name>``; raises :class:`ModelBuildError` when it cannot."""
    target = dest / model.name
    if target.exists():
        shutil.rmtree(target)
    if model.kind == "missing":
        raise ModelBuildError(model.source)
    if model.kind == "own":
        for rel, text in OWN_MODELS[model.source].items():
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            (target / rel).write_text(text)
        if model.source in TORCHSCRIPT_MODULES:
            _save_torchscript(TORCHSCRIPT_MODULES[model.source], target / "1" / "model.pt")
    elif model.kind == "folder":
        src = checkout / model.source
        if not src.is_dir():
            raise ModelBuildError(f"{model.source} is not in the checkout")
        shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__"))
        for rel_from, rel_to in model.files:  # only "own:<model>/<file>": the runner's code added
            own, _, rel = rel_from.removeprefix("own:").partition("/")
            (target / rel_to).parent.mkdir(parents=True, exist_ok=True)
            (target / rel_to).write_text(OWN_MODELS[own][rel])
    elif model.kind == "generated":
        repository, _, name = model.source.partition("/")
        src = generate(checkout, cache, repository) / name
        if not src.is_dir():
            raise ModelBuildError(f"{repository} has no model {name}")
        if not model.files:
            shutil.copytree(src, target)
        for rel_from, rel_to in model.files:  # "qa/...": a file of the checkout; "own:<model>/<file>": ours
            (target / rel_to).parent.mkdir(parents=True, exist_ok=True)
            if rel_from.startswith("own:"):
                own, _, rel = rel_from[4:].partition("/")
                (target / rel_to).write_text(OWN_MODELS[own][rel])
                continue
            origin = checkout / rel_from if rel_from.startswith("qa/") else src / rel_from
            shutil.copy2(origin, target / rel_to)
    elif model.kind == "python":
        _copy_python_model(checkout / model.source, target, model)
    else:
        raise ModelBuildError(f"unknown model kind {model.kind!r}")
    for folder in model.version_folders:
        (target / folder).mkdir(parents=True, exist_ok=True)
    edit_config(target / "config.pbtxt", model)


def _save_torchscript(module: str, path: Path) -> None:
    """``torch.jit.script(<module>())`` saved at ``path``, in a Python of its own (torch stays out of the
    runner's process)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    package, _, name = module.rpartition(".")
    code = f"import torch, {package}; torch.jit.save(torch.jit.script({package}.{name}()), {str(path)!r})"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if result.returncode != 0:
        raise ModelBuildError(f"TorchScript {module} could not be saved: {result.stderr.strip()[-400:]}")


def _copy_python_model(src: Path, target: Path, model: Model) -> None:
    """A ``qa/python_models`` folder: ``config.pbtxt`` on top, the other files in ``1/`` (or ``files``)."""
    if not src.is_dir():
        raise ModelBuildError(f"{model.source} is not in the checkout")
    pairs = list(model.files) or [
        (p.name, p.name if p.name == "config.pbtxt" else f"1/{p.name}")
        for p in sorted(src.iterdir())
        if p.is_file()
    ]
    for rel_from, rel_to in pairs:
        out = target / rel_to
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel_from, out)
    (target / "1").mkdir(parents=True, exist_ok=True)


def build_repository(models: tuple[Model, ...], checkout: Path, cache: Path, dest: Path) -> BuiltRepository:
    """A fresh repository at ``dest`` with every model that can be built; the others are listed."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    built = BuiltRepository(dest)
    for model in models:
        try:
            build_model(model, checkout, cache, dest)
        except (ModelBuildError, OSError) as exc:
            built.skipped.append((model.name, str(exc)))
            shutil.rmtree(dest / model.name, ignore_errors=True)
    return built
