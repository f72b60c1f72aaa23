"""The Python backend examples runner: the repository it lays out and the clients' ports."""

from __future__ import annotations

from pathlib import Path

from tools import python_backend_examples as pbe


def test_clients_are_pointed_at_the_servers_ports_and_nothing_else_changes() -> None:
    source = (
        'url = "localhost:8000"\ngrpc = "127.0.0.1:8001"\n'
        'metrics = "http://localhost:8002/metrics"\nother = "localhost:80001"\n'
    )
    ports = {"http": 18000, "grpc": 18001, "metrics": 18002}
    assert pbe.with_ports(source, ports) == (
        'url = "localhost:18000"\ngrpc = "127.0.0.1:18001"\n'
        'metrics = "http://localhost:18002/metrics"\nother = "localhost:80001"\n'
    )


def test_the_repository_is_laid_out_as_the_examples_readmes_say(tmp_path: Path) -> None:
    examples = tmp_path / "examples"
    for model, config in pbe.MODELS.values():
        for name in (model, config):
            if name is not None:
                (examples / name).parent.mkdir(parents=True, exist_ok=True)
                (examples / name).write_text(name)
    repo = pbe.build_repository(examples, tmp_path / "models")
    assert sorted(p.name for p in repo.iterdir()) == sorted(pbe.MODELS)
    assert (repo / "bls_sync" / "1" / "model.py").read_text() == "bls/sync_model.py"
    assert (repo / "bls_sync" / "config.pbtxt").read_text() == "bls/sync_config.pbtxt"
    # the auto-complete examples have no config: the model's auto_complete_config writes it
    assert not (repo / "batch_auto_complete" / "config.pbtxt").exists()
    assert (repo / "batch_auto_complete" / "1" / "model.py").read_text() == "auto_complete/batch_model.py"
