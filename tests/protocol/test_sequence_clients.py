"""Sequence parameters from the real tritonclient (HTTP, gRPC, gRPC streaming) reach the sequence
batcher of a real model runtime (the Python accumulator, its backend built with the control inputs),
without Ray: one replica's HTTP app and gRPC server on one event loop, as in a model replica."""

from __future__ import annotations

import asyncio
import queue
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import uvicorn
from tritonclient.utils import InferenceServerException

from deployments.protocol.grpc import GrpcOptions, build_grpc_server
from deployments.protocol.http import ModelHTTPApp
from deployments.replica import replica_dataplane
from deployments.runtime.model import ModelRuntime
from tests.batching.sequence_models import from_text

MODELS = Path(__file__).resolve().parents[1] / "batching" / "models"


def _model(tmp: Path, name: str, corrid: str) -> Any:
    folder = tmp / name
    shutil.copytree(MODELS / "sequence_accumulator", folder)
    text = (folder / "config.pbtxt").read_text().replace('"sequence_accumulator"', f'"{name}"')
    text = text.replace("TYPE_UINT64", corrid)
    if corrid == "TYPE_STRING":  # key the sums by the ID's bytes
        source = folder / "1" / "model.py"
        source.write_text(source.read_text().replace("int(corrid.reshape(-1)[0])", "corrid.reshape(-1)[0]"))
    return from_text(text, folder)


class Replica:
    """One stateful model's runtime behind its HTTP app (uvicorn) and the gRPC server, on one loop."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.errors: list[BaseException] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.http = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.grpc = ""

    async def _main(self) -> None:
        runtime = ModelRuntime(self.model)
        await runtime.load()
        dataplane = replica_dataplane(runtime)
        server = uvicorn.Server(
            uvicorn.Config(ModelHTTPApp(dataplane, self.model.name), log_level="warning", lifespan="off")
        )
        grpc_server, port = build_grpc_server(dataplane, GrpcOptions(host="127.0.0.1", port=0))
        await grpc_server.start()
        self.grpc = f"127.0.0.1:{port}"
        self.server = server
        task = asyncio.create_task(server.serve(sockets=[self.sock]))
        while not server.started:
            await asyncio.sleep(0.01)
        self.started.set()
        await task
        await grpc_server.stop(0)
        await runtime.close()

    def _run(self) -> None:
        try:
            self.loop.run_until_complete(self._main())
        except BaseException as exc:  # reported by __enter__
            self.errors.append(exc)
            self.started.set()

    def __enter__(self) -> Replica:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.started.wait(60) and not self.errors, self.errors
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()
        assert not self.thread.is_alive()


@pytest.fixture(scope="module")
def numeric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replica]:
    with Replica(_model(tmp_path_factory.mktemp("seq"), "acc", "TYPE_UINT64")) as replica:
        yield replica


@pytest.fixture(scope="module")
def textual(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replica]:
    with Replica(_model(tmp_path_factory.mktemp("seq"), "acc_str", "TYPE_STRING")) as replica:
        yield replica


def _inputs(module: Any, value: int) -> list[Any]:
    tensor = module.InferInput("IN", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return [tensor]


def _run_sequence(client: Any, module: Any, model: str, cid: int | str, values: list[int]) -> list[int]:
    out = []
    for i, v in enumerate(values):
        result = client.infer(
            model,
            _inputs(module, v),
            sequence_id=cid,
            sequence_start=i == 0,
            sequence_end=i == len(values) - 1,
        )
        out.append(int(result.as_numpy("OUT")[0, 0]))
    return out


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_interleaved_numeric_sequences(numeric: Replica, protocol: str) -> None:
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(numeric.http if protocol == "http" else numeric.grpc)
    # two sequences, request by request in turn: each keeps its own sum
    a, b = [], []
    for i in range(4):
        flags = {"sequence_start": i == 0, "sequence_end": i == 3}
        a.append(client.infer("acc", _inputs(module, 1), sequence_id=11, **flags).as_numpy("OUT")[0, 0])
        b.append(client.infer("acc", _inputs(module, 10), sequence_id=12, **flags).as_numpy("OUT")[0, 0])
    assert [int(x) for x in a] == [1, 2, 3, 4] and [int(x) for x in b] == [10, 20, 30, 40]
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        client.infer("acc", _inputs(module, 1), sequence_id=13)
    client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_string_sequence_ids(textual: Replica, numeric: Replica, protocol: str) -> None:
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(textual.http if protocol == "http" else textual.grpc)
    assert _run_sequence(client, module, "acc_str", "alpha", [1, 2, 3]) == [1, 3, 6]
    assert _run_sequence(client, module, "acc_str", "beta", [5, 5]) == [5, 10]
    client.close()
    # a string ID for an integer CORRID is refused
    client = module.InferenceServerClient(numeric.http if protocol == "http" else numeric.grpc)
    with pytest.raises(InferenceServerException):
        client.infer("acc", _inputs(module, 1), sequence_id="alpha", sequence_start=True)
    client.close()


def test_grpc_stream_carries_sequence_flags(numeric: Replica) -> None:
    results: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(numeric.grpc)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    values = {21: [1, 2, 3, 4], 22: [7, 7, 7, 7]}
    for i in range(4):
        for cid, vals in values.items():
            client.async_stream_infer(
                "acc",
                _inputs(grpcclient, vals[i]),
                request_id=f"{cid}-{i}",
                sequence_id=cid,
                sequence_start=i == 0,
                sequence_end=i == 3,
            )
    got: dict[str, int] = {}
    for _ in range(8):
        result, error = results.get(timeout=30)
        assert error is None, error
        got[result.get_response().id] = int(result.as_numpy("OUT")[0, 0])
    client.stop_stream()
    client.close()
    assert [got[f"21-{i}"] for i in range(4)] == [1, 3, 6, 10]
    assert [got[f"22-{i}"] for i in range(4)] == [7, 14, 21, 28]
