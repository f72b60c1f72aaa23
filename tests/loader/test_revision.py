"""The Serve version of a model's deployments: what a count-only change keeps and what changes it."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from repository_loader.model import (
    InstanceGroup,
    InstanceKind,
    ModelDescription,
    RateLimiter,
    RateLimitResource,
    SequenceBatching,
    TensorSpec,
)
from repository_loader.revision import code_version, files_digest


def _model(path: Path, count: int = 2, **changes: object) -> ModelDescription:
    spec = TensorSpec("INPUT0", "FP32", (-1,))
    model = ModelDescription(
        name="m",
        path=path,
        platform="",
        backend="python",
        max_batch_size=0,
        inputs=(spec,),
        outputs=(dataclasses.replace(spec, name="OUTPUT0"),),
        versions=(1,),
        instance_groups=(InstanceGroup("m_0", InstanceKind.CPU, count),),
    )
    return dataclasses.replace(model, **changes)  # type: ignore[arg-type]


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text("x = 1\n")
    (folder / "config.pbtxt").write_text("instance_group [ { count: 2 } ]\n")
    return folder


def _version(model: ModelDescription, **built_with: object) -> str:
    return code_version(model, files_digest(model.path), built_with or {"kind": "KIND_CPU"})


def test_a_count_only_change_keeps_the_version(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    before = _version(_model(folder, count=2))
    # the config file is rewritten with the new count: its time is not the model's files'
    (folder / "config.pbtxt").write_text("instance_group [ { count: 3 } ]\n")
    os.utime(folder / "config.pbtxt", ns=(1, 1))
    assert _version(_model(folder, count=3)) == before
    assert _version(_model(folder, count=1)) == before
    # the same files reached through another folder (a load with a config override links them)
    linked = tmp_path / "overlay" / "m"
    linked.mkdir(parents=True)
    (linked / "1").symlink_to(folder / "1")
    assert _version(_model(linked, count=3)) == before
    # bytecode the backend leaves beside the model is not the model
    (folder / "1" / "__pycache__").mkdir()
    (folder / "1" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    assert _version(_model(folder, count=3)) == before


def test_what_the_replicas_are_built_from_changes_the_version(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    before = _version(_model(folder))
    assert _version(_model(folder, max_batch_size=8)) != before  # another config
    assert _version(_model(folder), kind="KIND_MODEL") != before  # another constructor argument
    groups = (InstanceGroup("m_0", InstanceKind.CPU, 2), InstanceGroup("m_1", InstanceKind.CPU, 1))
    assert _version(_model(folder, instance_groups=groups)) != before  # another group
    # a group's rate-limiter resources (Triton starts such an instance again)
    limited = RateLimiter((RateLimitResource("R1", 8),))
    groups = (InstanceGroup("m_0", InstanceKind.CPU, 2, rate_limiter=limited),)
    assert _version(_model(folder, instance_groups=groups)) != before
    # a model file changed (its size and time)
    (folder / "1" / "model.py").write_text("x = 22\n")
    assert _version(_model(folder)) != before


def test_a_stateful_model_keeps_its_version_over_a_count_change_unless_it_has_several_groups(
    tmp_path: Path,
) -> None:
    """A sequence model with one group scales in place (its replicas follow the new world size); with
    several groups a count change moves the later groups' ranks, so it redeploys."""
    folder = _folder(tmp_path)
    stateful = SequenceBatching(strategy="direct")
    assert _version(_model(folder, 2, sequence_batching=stateful)) == _version(
        _model(folder, 3, sequence_batching=stateful)
    )
    cpu = InstanceGroup("m_0", InstanceKind.CPU, 1)

    def two_groups(count: int) -> ModelDescription:
        groups = (cpu, InstanceGroup("m_1", InstanceKind.CPU, count))
        return _model(folder, sequence_batching=stateful, instance_groups=groups)

    assert _version(two_groups(2)) != _version(two_groups(3))
    iterative = SequenceBatching(iterative=True)  # every request its own sequence: no ranks
    assert _version(_model(folder, 2, sequence_batching=iterative)) == _version(
        _model(folder, 3, sequence_batching=iterative)
    )


def test_a_folder_that_is_not_there_has_no_files(tmp_path: Path) -> None:
    assert files_digest(tmp_path / "missing") == ""
