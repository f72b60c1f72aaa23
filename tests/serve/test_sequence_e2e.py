"""Stateful models on the shared Ray Serve instance, two replicas each, through HAProxy, with the real
tritonclient: every sequence keeps to the replica holding its state (docs/sequence.md)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.serve

ACC = "seq_accumulator"


def _acc_input(value: int) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("IN", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return [tensor]


async def _acc_sequence(
    client: aioclient.InferenceServerClient, cid: int, values: list[int]
) -> list[tuple[int, list[int], int]]:
    """(running sum, [START, END, READY, CORRID], replica pid) of every request of one sequence."""
    out = []
    for i, value in enumerate(values):
        result = await client.infer(
            ACC,
            _acc_input(value),
            sequence_id=cid,
            sequence_start=i == 0,
            sequence_end=i == len(values) - 1,
        )
        out.append(
            (
                int(result.as_numpy("OUT")[0, 0]),
                [int(v) for v in result.as_numpy("CONTROLS")[0]],
                int(result.as_numpy("PID")[0, 0]),
            )
        )
        await asyncio.sleep(0)
    return out


def test_64_interleaved_sequences_keep_their_replica_and_their_sums(server_url: str) -> None:
    values = {cid: [cid * 100 + k for k in range(1, 7)] for cid in range(1, 65)}

    async def main() -> dict[int, list[tuple[int, list[int], int]]]:
        client = aioclient.InferenceServerClient(server_url, conn_limit=64)
        try:
            runs = await asyncio.gather(*(_acc_sequence(client, cid, v) for cid, v in values.items()))
        finally:
            await client.close()
        return dict(zip(values, runs, strict=True))

    results = asyncio.run(main())
    pids = set()
    for cid, run in results.items():
        assert [r[0] for r in run] == list(np.cumsum(values[cid])), cid
        controls = [r[1] for r in run]
        last = len(run) - 1
        assert controls == [[int(i == 0), int(i == last), 1, cid] for i in range(len(run))], cid
        owners = {r[2] for r in run}
        assert len(owners) == 1, f"sequence {cid} switched replicas: {owners}"
        pids |= owners
    assert len(pids) == 2, "both replicas hold sequences"


STEPS = 8


def _step_by_step_from_eight_threads(server_url: str, cids: list[int]) -> dict[int, int]:
    """Every sequence's ``STEPS`` requests over HTTP from 8 client threads, step by step (each step of
    every sequence, then the next step); checks every answer's sum and that each sequence kept to one
    replica, and returns how many sequences each replica (by pid) ran."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    local = threading.local()

    def send(cid: int, step: int) -> tuple[int, int] | str:
        if not hasattr(local, "client"):
            local.client = httpclient.InferenceServerClient(server_url)
        try:
            result = local.client.infer(
                ACC,
                _acc_input(step + 1),
                sequence_id=cid,
                sequence_start=step == 0,
                sequence_end=step == STEPS - 1,
            )
        except InferenceServerException as exc:
            return f"step {step + 1}: {exc}"
        return int(result.as_numpy("OUT")[0, 0]), int(result.as_numpy("PID")[0, 0])

    answers: dict[int, list[tuple[int, int] | str]] = {cid: [] for cid in cids}
    with ThreadPoolExecutor(8) as pool:
        for step in range(STEPS):
            live = [c for c in cids if all(not isinstance(a, str) for a in answers[c])]
            for cid, answer in zip(live, pool.map(send, live, [step] * len(live)), strict=True):
                answers[cid].append(answer)
    failed = {cid: a for cid, run in answers.items() for a in run if isinstance(a, str)}
    assert not failed, failed
    held: dict[int, int] = {}
    for cid, run in answers.items():
        assert [a[0] for a in run] == list(np.cumsum(range(1, STEPS + 1))), cid  # type: ignore[index]
        pids = {a[1] for a in run}  # type: ignore[index]
        assert len(pids) == 1, f"sequence {cid} switched replicas: {pids}"
        pid = pids.pop()
        held[pid] = held.get(pid, 0) + 1
    return held


def test_twelve_sequences_step_by_step_from_eight_threads(server_url: str) -> None:
    """The issue's setup: 12 sequences numbered one after another, two instances of 8 slots. Each
    replica owns six (ID mod 2) and holds them in its own instance's slots; none waits in a backlog,
    where the sequences holding the slots would go idle and fail later steps without their START."""
    from deployments.runtime.router import owner_rank

    cids = list(range(8000, 8012))
    assert sorted(owner_rank(c, 2) for c in cids) == [0] * 6 + [1] * 6
    held = _step_by_step_from_eight_threads(server_url, cids)
    assert len(held) == 2, "both replicas hold sequences"


def test_twelve_sequences_of_one_owner_borrow_the_other_replicas_free_slots(server_url: str) -> None:
    """Twelve sequences whose IDs all belong to one replica (even IDs over two): it fills its 8 slots
    and lends the other four to the second replica, where they run all their steps; none waits in a
    backlog while a slot is free (Triton's one set of slots over both instances)."""
    from deployments.runtime.router import owner_rank

    cids = list(range(9000, 9024, 2))
    assert {owner_rank(c, 2) for c in cids} == {0}
    held = _step_by_step_from_eight_threads(server_url, cids)
    # each replica ran at most its own 8 slots' sequences at once: the owner's overflow went to the other
    assert len(held) == 2 and max(held.values()) <= 8, held


def test_interleaved_grpc_sequences_reach_their_owner(server_url: str, grpc_url: str) -> None:
    """gRPC requests of 24 sequences at once (16 slots over the two replicas): each sequence keeps to
    one replica; alone later, an ID's HTTP request runs at the replica owning the ID, one per rank."""
    import tritonclient.grpc.aio as grpcaio

    values = {cid: [cid + k for k in range(1, 6)] for cid in range(5001, 5025)}

    async def sequence(client: grpcaio.InferenceServerClient, cid: int) -> list[tuple[int, int]]:
        out = []
        for i, value in enumerate(values[cid]):
            tensor = grpcaio.InferInput("IN", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
            last = i == len(values[cid]) - 1
            result = await client.infer(
                ACC, [tensor], sequence_id=cid, sequence_start=i == 0, sequence_end=last
            )
            out.append((int(result.as_numpy("OUT")[0, 0]), int(result.as_numpy("PID")[0, 0])))
        return out

    async def main() -> list[list[tuple[int, int]]]:
        client = grpcaio.InferenceServerClient(grpc_url)
        try:
            return await asyncio.gather(*(sequence(client, cid) for cid in values))
        finally:
            await client.close()

    deadline = time.monotonic() + 30  # replicas report their ranks to the router every second
    while True:
        try:
            runs = dict(zip(values, asyncio.run(main()), strict=True))
            break
        except InferenceServerException as exc:
            assert time.monotonic() < deadline and "is unavailable" in str(exc), exc
            time.sleep(1.0)
    from deployments.runtime.router import owner_rank

    http = httpclient.InferenceServerClient(server_url)
    pids = set()
    by_rank: dict[int, set[int]] = {0: set(), 1: set()}
    for cid, run in runs.items():
        assert [r[0] for r in run] == list(np.cumsum(values[cid])), cid
        owners = {r[1] for r in run}
        assert len(owners) == 1, f"sequence {cid} switched replicas: {owners}"
        pids |= owners
        # the same ID over HTTP, one at a time (a free slot at its owner): it runs at its owner, the
        # replica gRPC reached too unless that owner was full then and lent it (docs/sequence.md)
        again = http.infer(ACC, _acc_input(1), sequence_id=cid, sequence_start=True, sequence_end=True)
        by_rank[owner_rank(cid, 2)].add(int(again.as_numpy("PID")[0, 0]))
    assert len(pids) == 2, "both replicas hold sequences"
    assert all(len(p) == 1 for p in by_rank.values()) and by_rank[0] != by_rank[1], by_rank


def test_string_sequence_ids_and_server_kept_state_onnx(server_url: str) -> None:
    """ONNX model with implicit state: the server keeps STATE between requests; string IDs."""

    async def one(client: aioclient.InferenceServerClient, cid: str, values: list[float]) -> list[float]:
        sums = []
        for i, value in enumerate(values):
            tensor = aioclient.InferInput("IN", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.array([[value]], dtype=np.float32))
            result = await client.infer(
                "seq_state",
                [tensor],
                sequence_id=cid,
                sequence_start=i == 0,
                sequence_end=i == len(values) - 1,
            )
            assert result.as_numpy("STATE_OUT") is None, "the state output stays in the server"
            sums.append(float(result.as_numpy("OUT")[0, 0]))
        return sums

    values = {f"stream-{n}": [float(n + k) for k in range(5)] for n in range(64)}

    async def main() -> list[list[float]]:
        client = aioclient.InferenceServerClient(server_url, conn_limit=64)
        try:
            return await asyncio.gather(*(one(client, cid, v) for cid, v in values.items()))
        finally:
            await client.close()

    for (cid, v), sums in zip(values.items(), asyncio.run(main()), strict=True):
        assert sums == list(np.cumsum(v)), cid


@pytest.fixture(scope="module")
def client(server_url: str) -> httpclient.InferenceServerClient:
    c = httpclient.InferenceServerClient(server_url)
    yield c
    c.close()


def _sum(client: httpclient.InferenceServerClient, cid: int, value: int, **flags: bool) -> int:
    return int(client.infer(ACC, _acc_input(value), sequence_id=cid, **flags).as_numpy("OUT")[0, 0])


def _missing_start(cid: int, model: str = ACC) -> str:
    return (
        f"inference request for sequence {cid} to model '{model}' must specify the START flag on the "
        "first request of the sequence"
    )


@pytest.mark.parametrize("cid", [7001, 7002, 7003, 7004])  # owners on both replicas
def test_missing_start_is_rejected_as_triton_does(client: httpclient.InferenceServerClient, cid: int) -> None:
    with pytest.raises(InferenceServerException) as err:
        _sum(client, cid, 1)
    assert _missing_start(cid) in str(err.value)


def test_zero_sequence_id_is_rejected(client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="must specify a non-zero or non-empty correlation ID"):
        client.infer(ACC, _acc_input(1), sequence_start=True)


def test_start_on_a_running_sequence_restarts_it(client: httpclient.InferenceServerClient) -> None:
    cid = 7100
    assert _sum(client, cid, 5, sequence_start=True) == 5
    assert _sum(client, cid, 5) == 10
    assert _sum(client, cid, 3, sequence_start=True) == 3
    assert _sum(client, cid, 4, sequence_end=True) == 7


def _state_sum(client: httpclient.InferenceServerClient, cid: int, value: float, **flags: bool) -> float:
    tensor = httpclient.InferInput("IN", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.float32))
    return float(client.infer("seq_state", [tensor], sequence_id=cid, **flags).as_numpy("OUT")[0, 0])


@pytest.mark.slow
def test_idle_sequence_loses_its_slot(client: httpclient.InferenceServerClient) -> None:
    """seq_state's sequences go idle after 5 s (seq_accumulator's after 15 s: its many concurrent
    sequences must not go idle between steps on a loaded machine)."""
    cid = 7200
    assert _state_sum(client, cid, 2.0, sequence_start=True) == 2.0
    time.sleep(7.0)  # max_sequence_idle_microseconds: 5000000, and time for the batcher to notice
    with pytest.raises(InferenceServerException) as err:
        _state_sum(client, cid, 2.0)
    assert _missing_start(cid, "seq_state") in str(err.value)
    assert _state_sum(client, cid, 2.0, sequence_start=True, sequence_end=True) == 2.0


def _replica_actor(pid: int) -> str:
    from deployments.serve import hooks

    for app in hooks.serve_details()["applications"].values():
        for deployment in app["deployments"].values():
            for replica in deployment["replicas"]:
                if replica.get("pid") == pid:
                    return str(replica["actor_name"])
    raise AssertionError(f"no replica with pid {pid}")


@pytest.mark.slow
def test_replica_lost_mid_sequence_fails_its_later_requests(client: httpclient.InferenceServerClient) -> None:
    """Run last: kills one replica of seq_accumulator; Serve starts a replacement."""
    import ray

    cid = 7300
    first = client.infer(ACC, _acc_input(1), sequence_id=cid, sequence_start=True)
    pid = int(first.as_numpy("PID")[0, 0])
    ray.kill(ray.get_actor(_replica_actor(pid), namespace="serve"), no_restart=True)
    time.sleep(1.0)
    for _ in range(3):  # whichever replica HAProxy picks: never a sum without the sequence's state
        with pytest.raises(InferenceServerException) as err:
            _sum(client, cid, 1)
        assert f"sequence {cid}" in str(err.value)
    deadline = time.monotonic() + 120
    while True:  # the replacement takes the lost rank; new sequences run again on both ranks
        try:
            assert all(_sum(client, c, 3, sequence_start=True, sequence_end=True) == 3 for c in (7401, 7404))
            break
        except InferenceServerException:
            assert time.monotonic() < deadline, "the lost replica was not replaced"
            time.sleep(1.0)
