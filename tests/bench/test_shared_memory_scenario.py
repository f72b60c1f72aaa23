"""The shared-memory scenario's notes: each protocol's throughput with shared memory over without."""

from __future__ import annotations

from bench.scenarios import shared_memory as scenario
from tests.bench.runs import run_of


def test_ratios_compare_with_and_without_shared_memory_and_this_server_with_tritonserver() -> None:
    this, peer = scenario.THIS, scenario.PEER
    model = scenario.MODEL
    runs = [
        run_of(f"{this}: {model}: http", {1: 1000.0, 4: 2000.0}),
        run_of(f"{this}: {model}: http shm", {1: 1100.0, 4: 1000.0}),
        run_of(f"{this}: {model}: grpc", {1: 800.0}),
        run_of(f"{this}: {model}: grpc shm", {1: 400.0, 4: 300.0}),  # no plain run at 4: no ratio
        run_of(f"{peer}: {model}: http shm", {1: 2200.0}),
    ]
    assert scenario.ratios(runs) == {
        f"shm_over_plain:{this}:{model}:http:1": 1.1,
        f"shm_over_plain:{this}:{model}:http:4": 0.5,
        f"shm_over_plain:{this}:{model}:grpc:1": 0.5,
        f"this_over_peer:{model}:http shm:1": 0.5,
    }


def test_the_large_model_has_one_mebibyte_tensors() -> None:
    from repository_loader.proto import model_config_pb2

    config = model_config_pb2.ModelConfig()
    config.input.add(name="INPUT0", dims=[16])
    config.output.add(name="OUTPUT0", dims=[16])
    scenario._large(config)
    assert [list(t.dims) for t in (*config.input, *config.output)] == [[262144], [262144]]
