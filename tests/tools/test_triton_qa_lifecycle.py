"""The conformance runner's L0_lifecycle steps: test.sh's layout beside the repository, the flags."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tools.triton_qa.lifecycle import L0_LIFECYCLE, Layout, identity, stand_in
from tools.triton_qa.models import OWN_MODELS, apply_edit
from tools.triton_qa.runner import THIS_ONLY, translate_args
from tools.triton_qa.suites import SUITES, Model


def test_lifecycle_suite_is_registered_with_one_test_per_run_but_file_override() -> None:
    assert SUITES["L0_lifecycle"] is L0_LIFECYCLE
    labels = [r.label for r in L0_LIFECYCLE.runs]
    assert len(labels) == len(set(labels))
    for run in L0_LIFECYCLE.runs:
        assert run.prepare is not None and run.repository_at == "models"
        assert len(run.tests) == (2 if run.label == "file_override" else 1)


def test_flags_for_this_server_only_and_strict_flags_translate() -> None:
    options = {"--strict-readiness": 1, "--disable-auto-complete-config": 0, "--allow-model-file-upload": 0}
    kept, dropped = translate_args(
        [
            "--strict-readiness=false",
            "--strict-readiness=true",
            "--strict-model-config=true",
            f"{THIS_ONLY}--allow-model-file-upload",
            "--model-load-thread-count=32",
        ],
        options,
    )
    # the later --strict-readiness wins, as on tritonserver's command line
    assert kept == [
        "--strict-readiness",
        "false",
        "--strict-readiness",
        "true",
        "--disable-auto-complete-config",
        "--allow-model-file-upload",
    ]
    assert dropped == ["--model-load-thread-count=32"]
    assert translate_args(["--strict-model-config=false"], options) == ([], [])


def test_layout_clears_leftovers_and_runs_sed_steps(tmp_path: Path) -> None:
    (tmp_path / "models_0" / "m").mkdir(parents=True)
    (tmp_path / "config.pbtxt.wrong.plan").write_text("x")
    (tmp_path / "keep.py").write_text("")
    built: list[tuple[str, Path]] = []
    layout = Layout(tmp_path, lambda model, folder: built.append((model.name, folder)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.py"]

    (tmp_path / "c.pbtxt").write_text('version_policy: { all { }}\nlabel_filename: "output0_labels.txt"\n')
    layout.delete_lines("c.pbtxt", "c.nopolicy", r"^version_policy")
    layout.sed("c.pbtxt", "c.wrong", "output0_labels", "wrong_output0_labels")
    assert (tmp_path / "c.nopolicy").read_text() == 'label_filename: "output0_labels.txt"\n'
    assert 'label_filename: "wrong_output0_labels.txt"' in (tmp_path / "c.wrong").read_text()

    (tmp_path / "models" / "m" / "1").mkdir(parents=True)
    (tmp_path / "models" / "m" / "1" / "model.py").write_text("")
    layout.remove("models/m/*/*")
    assert (tmp_path / "models" / "m" / "1").is_dir() and not any((tmp_path / "models" / "m" / "1").iterdir())
    layout.models("models_0", Model("a", "own", "simple"))
    assert built == [("a", tmp_path / "models_0")]


def _run_model(code: str, a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    """Execute an own model's code on two inputs with a minimal stand-in of ``pb_utils``."""
    import sys
    import types

    class Tensor:
        def __init__(self, name: str, value: np.ndarray) -> None:
            self.name, self.value = name, value

        def as_numpy(self) -> np.ndarray:
            return self.value

    pb = types.SimpleNamespace(
        Tensor=Tensor,
        InferenceResponse=lambda output_tensors: output_tensors,
        triton_string_to_numpy=lambda t: np.float32,
        get_input_tensor_by_name=lambda r, n: Tensor(n, r[n]),
    )
    sys.modules["triton_python_backend_utils"] = pb  # type: ignore[assignment]
    try:
        scope: dict[str, object] = {}
        exec(code, scope)
        model = scope["TritonPythonModel"]()  # type: ignore[operator]
        model.initialize(
            {
                "model_config": '{"output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32"}, '
                '{"name": "OUTPUT1", "data_type": "TYPE_FP32"}]}'
            }
        )
        [outputs] = model.execute([{"INPUT0": a, "INPUT1": b}])
    finally:
        del sys.modules["triton_python_backend_utils"]
    return {t.name: t.value for t in outputs}


def test_stand_ins_swap_their_outputs_after_version_1_as_gen_qa_models_does() -> None:
    a, b = np.array([5.0, 7.0], np.float32), np.array([1.0, 2.0], np.float32)
    v1 = _run_model(OWN_MODELS["addsub"]["1/model.py"], a, b)
    v3 = _run_model(OWN_MODELS["subadd"]["1/model.py"], a, b)
    assert v1["OUTPUT0"].tolist() == [6, 9] and v1["OUTPUT1"].tolist() == [4, 5]
    assert v3["OUTPUT0"].tolist() == [4, 5] and v3["OUTPUT1"].tolist() == [6, 9]
    model = stand_in("plan")
    assert dict(model.files)["own:subadd/1/model.py"] in ("2/model.py", "3/model.py")
    assert apply_edit('platform: "onnxruntime_onnx"\n', model.edits[1]) == 'backend: "python"\n'


def test_identity_stand_in_needs_no_file_in_later_versions() -> None:
    model = identity("identity_model", versions=("1", "2"))
    config = 'name: "identity_zero_1_int32"\nbackend: "identity"\n'
    for edit in model.edits:
        config = apply_edit(config, edit)
    assert config == 'name: "identity_model"\nbackend: "python"\ndefault_model_filename: "../1/model.py"\n'
    assert model.version_folders == ("1", "2")
    assert "creation_delay_sec" in OWN_MODELS["identity"]["1/model.py"]
