"""Every example configuration is a valid Triton configuration, and the ensemble's graph is consistent."""

from __future__ import annotations

import pytest
from tritonclient.grpc import model_config_pb2

from tests.examples.conftest import MODEL_NAMES, REPOSITORY, triton_config

DEFAULT_MODEL_FILE = {
    "onnxruntime_onnx": "model.onnx",
    "pytorch_libtorch": "model.pt",
    "python": "model.py",
}
EXPECTED_MODELS = {
    "add_sub",
    "auto_complete_scale",
    "crnn",
    "crnn_postprocess",
    "identity_fp32",
    "image_preprocess",
    "simple_torchscript",
    "string_upper",
    "text_recognition",
}


def _tensors(config: model_config_pb2.ModelConfig, kind: str) -> dict[str, model_config_pb2.ModelInput]:
    return {tensor.name: tensor for tensor in getattr(config, kind)}


def test_repository_holds_the_documented_models() -> None:
    assert set(MODEL_NAMES) == EXPECTED_MODELS
    readme = (REPOSITORY / "README.md").read_text()
    for name in MODEL_NAMES:
        assert f"`{name}`" in readme, f"README.md does not describe {name}"


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_config_parses_with_tritons_schema_and_has_its_model_file(name: str) -> None:
    config = triton_config(name)
    assert config.name == name
    kind = config.backend or config.platform
    version = REPOSITORY / name / "1"
    assert version.is_dir(), f"{name} has no version folder 1"
    if kind == "ensemble":
        assert config.ensemble_scheduling.step, f"{name} has no steps"
    else:
        assert (version / DEFAULT_MODEL_FILE[kind]).is_file(), f"{name} lacks {DEFAULT_MODEL_FILE[kind]}"
    if config.HasField("dynamic_batching"):
        assert config.max_batch_size > 0, f"{name}: dynamic_batching needs max_batch_size > 0"


@pytest.mark.parametrize("name", sorted(set(MODEL_NAMES) - {"auto_complete_scale"}))
def test_non_auto_completed_configs_declare_their_tensors(name: str) -> None:
    config = triton_config(name)
    assert config.input and config.output, name


def test_auto_complete_model_leaves_its_tensors_to_the_model() -> None:
    config = triton_config("auto_complete_scale")
    assert (config.backend, list(config.input), list(config.output), config.max_batch_size) == (
        "python",
        [],
        [],
        0,
    )


def test_ensemble_steps_map_existing_tensors_with_agreeing_types() -> None:
    ensemble = triton_config("text_recognition")
    produced = {name: (t.data_type, list(t.dims)) for name, t in _tensors(ensemble, "input").items()}
    for step in ensemble.ensemble_scheduling.step:
        model = triton_config(step.model_name)
        assert ensemble.max_batch_size <= model.max_batch_size, step.model_name
        inputs, outputs = _tensors(model, "input"), _tensors(model, "output")
        for model_tensor, ensemble_tensor in step.input_map.items():
            assert ensemble_tensor in produced, f"{step.model_name}: {ensemble_tensor} is not produced before"
            assert (inputs[model_tensor].data_type, list(inputs[model_tensor].dims)) == produced[
                ensemble_tensor
            ]
        assert set(step.input_map) == set(inputs), f"{step.model_name}: unmapped inputs"
        for model_tensor, ensemble_tensor in step.output_map.items():
            produced[ensemble_tensor] = (outputs[model_tensor].data_type, list(outputs[model_tensor].dims))
    for name, output in _tensors(ensemble, "output").items():
        assert produced[name] == (output.data_type, list(output.dims)), name
