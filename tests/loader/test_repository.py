"""Reading repositories: versions and policies, ignored folders, custom config names, files, bad input."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from repository_loader.errors import ConfigError, NotFound
from repository_loader.model import InstanceKind
from repository_loader.repository import ModelLoadError, load_model, load_repository
from repository_loader.storage import open_storage
from repository_loader.versions import parse_version

from .conftest import TORCH_IO


def _versions(repo: Path, write_model, policy: str, present: list[int]) -> tuple[int, ...]:
    write_model("m", TORCH_IO + policy, {f"{v}/model.pt": b"" for v in present})
    return load_model(repo, "m").versions


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("", (7,)),
        ("version_policy { latest { num_versions: 2 } }", (3, 7)),
        ("version_policy { latest { num_versions: 9 } }", (1, 3, 7)),
        ("version_policy { all { } }", (1, 3, 7)),
        ("version_policy { specific { versions: [ 1, 7 ] } }", (1, 7)),
    ],
)
def test_version_policy(repo: Path, write_model, policy: str, expected: tuple[int, ...]) -> None:
    assert _versions(repo, write_model, policy, [1, 3, 7]) == expected


def test_non_numeric_and_zero_prefixed_folders_are_ignored_with_a_warning(
    repo: Path, write_model, caplog
) -> None:
    write_model(
        "m",
        TORCH_IO,
        {"1/model.pt": b"", "01/model.pt": b"", "0/model.pt": b"", "v2/model.pt": b"", "configs/": b""},
    )
    with caplog.at_level(logging.WARNING, logger="repository_loader"):
        state = load_repository(repo)
    assert state.models["m"].versions == (1,)
    joined = "\n".join(state.warnings)
    assert "'01'" in joined and "'0'" in joined and "'v2'" in joined
    assert "'configs'" not in joined
    assert any("v2" in r.message for r in caplog.records)


def test_parse_version() -> None:
    assert parse_version("12") == 12
    assert parse_version("012") is None and parse_version("0") is None and parse_version("1a") is None
    assert parse_version("١") is None  # non-ASCII digits are not versions


def test_custom_config_name_is_preferred_and_falls_back(repo: Path, write_model) -> None:
    write_model(
        "a",
        TORCH_IO,
        {
            "1/model.pt": b"",
            "configs/h100.pbtxt": TORCH_IO.replace("max_batch_size: 8", "max_batch_size: 32"),
        },
    )
    write_model("b", TORCH_IO, {"1/model.pt": b""})
    state = load_repository(repo, config_name="h100")
    assert state.models["a"].max_batch_size == 32
    assert state.models["b"].max_batch_size == 8
    assert load_repository(repo).models["a"].max_batch_size == 8


def test_default_model_filename_and_onnx_folder(repo: Path, write_model) -> None:
    write_model("named", TORCH_IO + 'default_model_filename: "net.pt"', {"1/net.pt": b""})
    onnx_io = TORCH_IO.replace('backend: "pytorch"', 'platform: "onnxruntime_onnx"')
    write_model("folder", onnx_io, {"1/model.onnx/model.onnx": b"", "1/model.onnx/weights.bin": b""})
    state = load_repository(repo, auto_complete=False)
    assert state.failed == {}
    named = state.models["named"]
    assert named.model_file(1).name == "net.pt" and named.model_file(1).is_file()
    assert state.models["folder"].model_file(1).is_dir()
    assert state.models["folder"].backend == "onnxruntime"  # filled from the platform


def test_cc_model_filenames_name_a_file_per_gpu_and_may_stand_for_the_default(
    repo: Path, write_model
) -> None:
    """Triton's ``cc_model_filenames``: a GPU of compute capability 8.6 loads its own file, any other
    the default; a model with only per-GPU files is valid (a GPU instance picks one)."""
    cc = 'cc_model_filenames [ { key: "8.6" value: "a10g.pt" }, { key: "7.5" value: "t4.pt" } ]'
    write_model("mixed", TORCH_IO + cc, {"1/model.pt": b"", "1/a10g.pt": b"", "1/t4.pt": b""})
    write_model("per_gpu", TORCH_IO + cc, {"1/a10g.pt": b"", "1/t4.pt": b""})
    state = load_repository(repo, auto_complete=False)
    assert state.failed == {}
    mixed = state.models["mixed"]
    assert dict(mixed.cc_model_filenames) == {"8.6": "a10g.pt", "7.5": "t4.pt"}
    assert mixed.model_file(1, (8, 6)).name == "a10g.pt" and mixed.model_file(1, (7, 5)).name == "t4.pt"
    assert mixed.model_file(1, (9, 0)).name == "model.pt" and mixed.model_file(1).name == "model.pt"
    assert state.models["per_gpu"].model_file(1, (7, 5)).is_file()


def test_a_gpu_instance_asks_the_driver_for_its_compute_capability(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deployments.backends import base
    from deployments.backends.registry import create_backend
    from repository_loader.model import InstanceKind
    from tests.backends.helpers import context, describe, spec

    monkeypatch.setattr(base, "compute_capability", lambda ordinal: (7, 5))
    model = describe(
        "m",
        tmp_path,
        "pytorch",
        [spec("X", "FP32", [1])],
        [spec("Y", "FP32", [1])],
        cc_model_filenames={"7.5": "t4.pt"},
    )
    assert create_backend(context(model, kind=InstanceKind.GPU)).model_path().name == "t4.pt"
    assert create_backend(context(model, kind=InstanceKind.CPU)).model_path().name == "model.pt"


def test_a_specific_policy_serves_the_listed_versions_that_have_a_folder(repo: Path, write_model) -> None:
    """Triton loads the listed versions it finds and leaves the others out; none found fails the model."""
    policy = "version_policy { specific { versions: [ 1, 3 ] } }\n"
    write_model("some", TORCH_IO + policy, {"1/model.pt": b"", "2/model.pt": b""})
    write_model("none", TORCH_IO + policy, {"2/model.pt": b""})
    state = load_repository(repo)
    assert state.models["some"].versions == (1,)
    assert any("version(s) [3] not found: serving [1]" in w for w in state.warnings)
    assert "at least one version must be available under the version policy of model 'none'" in str(
        state.failed["none"]
    )


def test_one_broken_model_does_not_stop_the_others(repo: Path, write_model) -> None:
    write_model("good", TORCH_IO, {"1/model.pt": b""})
    write_model(
        "bad",
        TORCH_IO.replace("max_batch_size: 8", "max_batch_size: -3")
        + "instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]",
        {"1/model.pt": b""},
    )
    state = load_repository(repo)
    assert list(state.models) == ["good"]
    assert len(state.failed["bad"]) == 2  # every problem of the model, not only the first
    rows = {(r.name, r.state) for r in state.index}
    assert rows == {("good", "READY"), ("bad", "UNAVAILABLE")}
    bad = next(r for r in state.index if r.name == "bad")
    assert "max_batch_size" in bad.reason and bad.to_dict()["state"] == "UNAVAILABLE"


def test_description_fields(repo: Path, write_model) -> None:
    write_model(
        "m",
        """
        backend: "pytorch"
        max_batch_size: 8
        input [ { name: "x" data_type: TYPE_STRING dims: [ 1 ] reshape { shape: [ ] } optional: true } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" } ]
        instance_group [ { kind: KIND_CPU }, { kind: KIND_GPU count: 2 gpus: [ 1 ] name: "fast" } ]
        dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 50
                           priority_levels: 2 default_priority_level: 1
                           priority_queue_policy { key: 2 value { max_queue_size: 3 } } }
        parameters { key: "k" value { string_value: "v" } }
        model_warmup [ { name: "w" batch_size: 2 inputs { key: "x" value { data_type: TYPE_STRING dims: [ 1 ] zero_data: true } } } ]
        response_cache { enable: true }
        """,
        {"1/model.pt": b"", "labels.txt": "a\nb\n"},
    )
    model = load_model(repo, "m")
    assert model.inputs[0].datatype == "BYTES" and model.inputs[0].reshape == () and model.inputs[0].optional
    assert model.outputs[0].label_filename == "labels.txt"
    assert [g.name for g in model.instance_groups] == ["m_0", "fast"]
    assert model.instance_groups[0].kind == InstanceKind.CPU and model.instance_groups[0].count == 1
    assert model.instance_groups[1].gpus == (1,) and model.instance_groups[1].count == 2
    assert model.dynamic_batching is not None
    assert model.dynamic_batching.priority_queue_policy[2].max_queue_size == 3
    assert model.parameters == {"k": "v"}
    assert model.warmup[0].inputs["x"].source == "zero_data"
    assert model.response_cache and model.config_json["name"] == "m"
    assert model.config_json["input"][0]["data_type"] == "TYPE_STRING"


def test_sequence_description(repo: Path, write_model) -> None:
    write_model(
        "s",
        TORCH_IO
        + """
        sequence_batching {
          control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
                          { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] } ]
        }
        """,
        {"1/model.pt": b""},
    )
    seq = load_model(repo, "s").sequence_batching
    assert seq is not None and seq.strategy == "direct" and seq.max_sequence_idle_microseconds == 1_000_000
    assert [(c.kind, c.datatype, c.values) for c in seq.controls] == [
        ("CONTROL_SEQUENCE_START", "INT32", (0, 1)),
        ("CONTROL_SEQUENCE_CORRID", "UINT64", ()),
    ]


def test_ensemble_description(repo: Path, write_model) -> None:
    write_model("m", TORCH_IO, {"1/model.pt": b""})
    write_model(
        "e",
        """
        platform: "ensemble"
        max_batch_size: 8
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
        ensemble_scheduling { step [ { model_name: "m" model_version: -1
          input_map { key: "x" value: "IN" } output_map { key: "y" value: "OUT" } } ] }
        """,
        {"1/": b""},
    )
    ensemble = load_model(repo, "e")  # loads the step's model too
    assert ensemble.is_ensemble and ensemble.kind == "ensemble"
    assert ensemble.ensemble_steps[0].input_map == {"x": "IN"}


def test_an_ensemble_output_without_labels_takes_those_of_the_step_that_makes_it(
    repo: Path, write_model
) -> None:
    """As Triton's classification labels an ensemble's output with the labels of the model that made
    the tensor (qa's simple_/sequence_ ensembles name no label file): through a nested ensemble too;
    an output the ensemble labels itself keeps its own, and a step without labels gives none."""
    from deployments.runtime.checks import ModelSchema

    labelled = TORCH_IO.replace(
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]',
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" },'
        ' { name: "z" data_type: TYPE_FP32 dims: [ 4 ] } ]',
    )
    write_model("m", labelled, {"1/model.pt": b"", "labels.txt": "cat\ndog\n"})

    def chain(name: str, step: str, own_labels: bool = False) -> None:
        label = ' label_filename: "own.txt"' if own_labels else ""
        write_model(
            name,
            f"""
            platform: "ensemble"
            max_batch_size: 8
            input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }} ]
            output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ]{label} }},
                     {{ name: "OTHER" data_type: TYPE_FP32 dims: [ 4 ] }} ]
            ensemble_scheduling {{ step [ {{ model_name: "{step}" model_version: -1
              input_map {{ key: "{"x" if step == "m" else "IN"}" value: "IN" }}
              output_map {{ key: "{"y" if step == "m" else "OUT"}" value: "OUT" }}
              output_map {{ key: "{"z" if step == "m" else "OTHER"}" value: "OTHER" }} }} ] }}
            """,
            {"1/": b"", **({"own.txt": "own0\n"} if own_labels else {})},
        )

    chain("simple", "m")
    chain("outer", "simple")
    chain("own", "m", own_labels=True)
    state = load_repository(repo)
    for name in ("simple", "outer"):
        schema = ModelSchema.from_description(state.models[name])
        assert schema.labels("OUT") == ["cat", "dog"], name
        assert schema.labels("OTHER") is None  # its step's output has no labels
    assert ModelSchema.from_description(state.models["own"]).labels("OUT") == ["own0"]
    assert state.models["simple"].outputs[0].label_filename is None  # the configuration is unchanged


def test_load_model_errors(repo: Path, write_model) -> None:
    write_model("bad", TORCH_IO.replace("max_batch_size: 8", "max_batch_size: -1"), {"1/model.pt": b""})
    with pytest.raises(ModelLoadError) as info:
        load_model(repo, "bad")
    assert info.value.errors and "max_batch_size" in info.value.message
    with pytest.raises(NotFound):
        load_model(repo, "nope")


def test_missing_repository_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="does not exist"):
        load_repository(tmp_path / "missing")
    (tmp_path / "file").write_text("")
    with pytest.raises(NotFound, match="is not a folder"):
        load_repository(tmp_path / "file")


def test_unreadable_config_is_reported_for_that_model(repo: Path, write_model, monkeypatch) -> None:
    write_model("m", TORCH_IO, {"1/model.pt": b""})
    write_model("latin", None, {"config.pbtxt": b'name: "\xff"', "1/model.pt": b""})
    real_read = Path.read_bytes

    def read_bytes(self: Path) -> bytes:
        if self.parent.name == "m" and self.name == "config.pbtxt":
            raise PermissionError(13, "Permission denied")
        return real_read(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    state = load_repository(repo)
    assert "cannot read" in state.failed["m"][0] and "Permission denied" in state.failed["m"][0]
    assert "not UTF-8" in state.failed["latin"][0]


def test_remote_repository_without_its_filesystem_package(monkeypatch) -> None:
    import fsspec

    def missing(protocol: str, **_: object) -> None:
        raise ImportError(f"Install s3fs to access {protocol}")

    monkeypatch.setattr(fsspec, "filesystem", missing)
    with pytest.raises(ConfigError, match="needs the s3fs package"):
        open_storage("s3://bucket/models")


def test_remote_repository_through_fsspec(tmp_path: Path, monkeypatch, write_model, repo: Path) -> None:
    """An fsspec file system stands in for S3: the repository is read through it and models copied locally."""
    import fsspec
    from fsspec.implementations.dirfs import DirFileSystem

    write_model("m", TORCH_IO, {"1/model.pt": b""})
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    repo.rename(bucket / "models")
    monkeypatch.setattr(fsspec, "filesystem", lambda protocol, **_: DirFileSystem(path=str(bucket)))
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path / "cache"))
    state = load_repository("s3://models")
    model = state.models["m"]
    assert model.model_file(1).is_file()
    assert str(tmp_path / "cache") in str(model.path)
