"""Triton's ``qa/common/test_util`` with the model validators of backends this machine lacks saying no.

Some qa tests ask for every backend's models whatever ``BACKENDS`` says, gated only by the
``validate_for_<backend>_model`` helpers of ``test_util`` (``infer_variable_test.py`` asks for the
TensorFlow GraphDef model first in every test). For a run with ``only_backends``
(``tools.triton_qa.suites.Run``), the runner puts this folder ahead of ``qa/common`` on the test
process's ``PYTHONPATH`` and names the backends in ``TRITON_QA_ONLY_BACKENDS``: this module loads the
checkout's own ``test_util`` and makes the validators of every other backend answer False, so those
models are skipped as the tests skip any model type a validator refuses. Both servers get the same.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

ONLY_BACKENDS_ENV = "TRITON_QA_ONLY_BACKENDS"
VALIDATORS = {
    "validate_for_tf_model": "tf",
    "validate_for_trt_model": "plan",
    "validate_for_ensemble_model": "ensemble",
    "validate_for_onnx_model": "onnx",
    "validate_for_libtorch_model": "libtorch",
    "validate_for_openvino_model": "openvino",
}


def _checkout_module() -> Any:
    here = os.path.dirname(os.path.abspath(__file__))
    for folder in sys.path:
        path = os.path.join(folder or ".", "test_util.py")
        if os.path.abspath(folder or ".") != here and os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("_checkout_test_util", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    raise ImportError("qa/common/test_util.py is not on the path")


def _refuse(*args: Any, **kwargs: Any) -> bool:
    return False


_module = _checkout_module()
globals().update({k: v for k, v in vars(_module).items() if not k.startswith("__")})
_allowed = {b.strip() for b in os.environ.get(ONLY_BACKENDS_ENV, "").split(",") if b.strip()}
if _allowed:
    for _name, _backend in VALIDATORS.items():
        if _backend not in _allowed and hasattr(_module, _name):
            globals()[_name] = _refuse
