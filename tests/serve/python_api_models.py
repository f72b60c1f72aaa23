"""Python-backend API models of the shared Serve instance's repository (tests/serve/test_python_api_e2e.py).

The model files are those of the Ray-free tests (tests/backends/python_models), written the way
Triton's Python backend documentation shows; here they run on Ray Serve, each in its own replica,
so BLS, streams and model control cross replicas through Serve.
"""

from __future__ import annotations

import shutil
from pathlib import Path

PYTHON_MODELS = Path(__file__).resolve().parents[1] / "backends" / "python_models"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "model_repository"

_FLAT_IO = """input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
"""

CONFIGS = {
    # add_sub without a batch dimension: the BLS callers below send one [4] vector
    "add_sub_flat": f'name: "add_sub_flat"\nbackend: "python"\nmax_batch_size: 0\n{_FLAT_IO}',
    # BLS into an ensemble: one step, add_sub_flat
    "add_sub_ensemble": f"""name: "add_sub_ensemble"
platform: "ensemble"
max_batch_size: 0
{_FLAT_IO}ensemble_scheduling {{
  step [ {{
    model_name: "add_sub_flat"
    model_version: -1
    input_map {{ key: "INPUT0" value: "INPUT0" }}
    input_map {{ key: "INPUT1" value: "INPUT1" }}
    output_map {{ key: "OUTPUT0" value: "OUTPUT0" }}
    output_map {{ key: "OUTPUT1" value: "OUTPUT1" }}
  }} ]
}}
""",
    "repeat": """name: "repeat"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }
]
""",
    # the target of BLS model control (unloaded and loaded again by the test)
    "control_target": f'name: "control_target"\nbackend: "python"\nmax_batch_size: 0\n{_FLAT_IO}',
}
FROM_PYTHON_MODELS = (
    "bls_by_name",
    "bls_decoupled_sync",
    "bls_decoupled_async",
    "custom_metrics",
    "error_codes",
    "model_control",
)


def add_python_api_models(repo: Path) -> None:
    """Copy the API models (and the configs they need here) into the repository ``repo``."""
    for name in FROM_PYTHON_MODELS:
        shutil.copytree(PYTHON_MODELS / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name, config in CONFIGS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
    for name in ("add_sub_flat", "control_target"):
        shutil.copy(EXAMPLES / "add_sub" / "1" / "model.py", repo / name / "1" / "model.py")
    shutil.copy(PYTHON_MODELS / "repeat" / "1" / "model.py", repo / "repeat" / "1" / "model.py")
    add_model_copy(repo, "custom_metrics", PEER_METRICS_MODEL)


# the custom-metrics model compared with tritonserver (its own name: its counters start at zero)
PEER_METRICS_MODEL = "custom_metrics_peer"


def add_model_copy(repo: Path, source: str, name: str) -> None:
    """``source`` of tests/backends/python_models as the model ``name`` of ``repo``."""
    shutil.copytree(PYTHON_MODELS / source, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    config = (repo / name / "config.pbtxt").read_text().replace(f'name: "{source}"', f'name: "{name}"')
    (repo / name / "config.pbtxt").write_text(config)
