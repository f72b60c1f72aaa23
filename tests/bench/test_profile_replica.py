"""How ``bench.profile_replica`` sorts py-spy samples into the request path's layers."""

from __future__ import annotations

import pytest

from bench.profile_replica import HTTP_SERVER_LAYER, IDLE_LAYER, SOCKET_LAYER, layers, table

LOOP = "Thread.run (threading.py:975)"
HTTP = "_BaseApp._http (deployments/protocol/http.py:314)"
STACKS = "\n".join(
    [
        # an answer's write: the kernel's send, whatever called it
        f"{LOOP};{HTTP};send_coalesced (deployments/serve/response_writes.py:177);"
        "_PrefixedWrites.writelines (deployments/serve/response_writes.py:90) 4",
        # json under the protocol layer counts for it
        f"{LOOP};{HTTP};encode_infer_response (deployments/protocol/codec.py:500);"
        "JSONEncoder.iterencode (json/encoder.py:258) 3",
        # the model's own code, below the backend that called it
        f"{LOOP};{HTTP};PythonBackend._invoke (deployments/backends/python.py:443);"
        "TritonPythonModel.execute (model.py:12) 2",
        f"{LOOP};{HTTP};PythonBackend._invoke (deployments/backends/python.py:443) 1",
        f"{LOOP};HttpToolsProtocol.data_received (uvicorn/protocols/http/httptools_impl.py:150) 2",
        # the replica's own HTTP/1.1 server: its parsing is the server's, its flush the kernel's send
        f"{LOOP};Http1Protocol.data_received (deployments/protocol/http1_server.py:420) 3",
        f"{LOOP};{HTTP};_Exchange.send (deployments/protocol/http1_server.py:250);"
        "_Exchange._flush (deployments/protocol/http1_server.py:330) 2",
        "Worker.main_loop (ray/_private/worker.py:1069) 1",
        "runtime_model (deployments/runtime/model.py:129) 1",  # the runtime's model.py is not the model's
        f"{LOOP} 6",
        "not a sample line",
    ]
)


def test_each_sample_counts_for_the_layer_of_its_deepest_frame() -> None:
    found = layers(STACKS)
    assert found[SOCKET_LAYER] == pytest.approx(6 / 25)
    assert found["protocol (parse, decode, encode, respond)"] == pytest.approx(3 / 25)
    assert found["model's execute (its model.py)"] == pytest.approx(2 / 25)
    assert found["Python backend (pb_utils objects, execute hand-off)"] == pytest.approx(1 / 25)
    assert found[HTTP_SERVER_LAYER] == pytest.approx(5 / 25)
    assert found["Ray and Serve in the replica"] == pytest.approx(1 / 25)
    assert found["runtime (scheduling, checks, statistics)"] == pytest.approx(1 / 25)
    assert found[IDLE_LAYER] == pytest.approx(6 / 25)
    assert sum(found.values()) == pytest.approx(1.0)
    assert layers("") == {}


def test_the_table_counts_self_and_inclusive_shares() -> None:
    rows = table(STACKS)
    assert rows[0] == {"samples": 25}
    loop = next(r for r in rows[1:] if r["function"] == "Thread.run (threading.py)")
    assert loop["inclusive"] == pytest.approx(23 / 25) and loop["self"] == pytest.approx(6 / 25)
