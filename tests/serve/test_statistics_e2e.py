"""Statistics and metrics of a model with two replicas, read right after its last answer: every
replica's counts are asked as the read happens (over their own HTTP ports), so nothing a sibling
replica answered is missing (docs/architecture.md, "Statistics and metrics")."""

from __future__ import annotations

import asyncio
import re
import urllib.request

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient

pytestmark = pytest.mark.serve

ACC = "seq_accumulator"  # two replicas; a sequence runs on the replica that holds its rank


def _count(document: dict, model: str = ACC) -> int:
    """``inference_count`` of version 1 of ``model`` in a statistics document (HTTP's JSON)."""
    (entry,) = [s for s in document["model_stats"] if s["name"] == model and s["version"] == "1"]
    return int(entry["inference_count"])


def _metric(metrics_url: str, model: str = ACC) -> float:
    text = urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=10).read().decode()
    match = re.search(rf'^nv_inference_count\{{model="{model}",version="1"\}} (\S+)$', text, re.MULTILINE)
    assert match, "no nv_inference_count of the model in /metrics"
    return float(match.group(1))


def _counts(server_url: str, grpc_url: str, metrics_url: str, model: str = ACC) -> dict[str, float]:
    """The model's inference count as each way of reading it says."""
    http = httpclient.InferenceServerClient(server_url)
    grpc = grpcclient.InferenceServerClient(grpc_url)
    try:
        grpc_stats = grpc.get_inference_statistics(model, "1")
        return {
            "http, the model's own route": _count(http.get_inference_statistics(model), model),
            "http, every model": _count(http.get_inference_statistics(), model),
            "grpc": int(grpc_stats.model_stats[0].inference_count),
            "metrics": _metric(metrics_url, model),
        }
    finally:
        http.close()
        grpc.close()


async def _sequences(server_url: str, count: int, length: int) -> set[int]:
    """``count`` sequences of ``length`` requests at once; the pids of the replicas that answered."""
    client = aioclient.InferenceServerClient(server_url, conn_limit=count)

    async def one(cid: int) -> set[int]:
        pids = set()
        for i in range(length):
            tensor = aioclient.InferInput("IN", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[i]], dtype=np.int32))
            result = await client.infer(
                ACC, [tensor], sequence_id=cid, sequence_start=i == 0, sequence_end=i == length - 1
            )
            pids.add(int(result.as_numpy("PID")[0, 0]))
        return pids

    try:
        found = await asyncio.gather(*(one(90_000 + cid) for cid in range(count)))
    finally:
        await client.close()
    return set().union(*found)


def test_every_replicas_answers_count_in_a_read_right_after_them(
    server_url: str, grpc_url: str, metrics_url: str
) -> None:
    before = _counts(server_url, grpc_url, metrics_url)
    pids = asyncio.run(_sequences(server_url, count=16, length=3))
    assert len(pids) == 2, "both replicas answered"
    after = _counts(server_url, grpc_url, metrics_url)
    assert {way: after[way] - before[way] for way in after} == {way: 48 for way in after}


def test_a_client_cannot_ask_one_replica_for_its_own_counts(server_url: str) -> None:
    """The header replicas use between them is removed at the door: a client gets Triton's document."""
    answer = requests.get(
        f"http://{server_url}/v2/models/{ACC}/stats", headers={"x-triton-replica-snapshot": "1"}, timeout=10
    )
    assert answer.status_code == 200
    assert set(answer.json()) == {"model_stats"}


def test_a_step_an_ensemble_runs_in_its_own_replica_counts_in_a_read_right_after(
    server_url: str, grpc_url: str, metrics_url: str
) -> None:
    """text_recognition runs image_preprocess in its own replica (a hosted copy): a read of the step's
    statistics asks the ensemble's replicas too, as Triton's qa (L0_simple_ensemble) reads a step right
    after calling its ensemble; before, the copy's counts came with its replica's next push."""
    step = "image_preprocess"
    before = _counts(server_url, grpc_url, metrics_url, step)
    client = httpclient.InferenceServerClient(server_url)
    try:
        for seed in range(3):
            image = httpclient.InferInput("IMAGE", [1, 32, 100], "UINT8")
            pixels = np.random.default_rng(seed).integers(0, 255, size=(1, 32, 100), dtype=np.uint8)
            image.set_data_from_numpy(pixels)
            client.infer("text_recognition", [image])
    finally:
        client.close()
    after = _counts(server_url, grpc_url, metrics_url, step)
    assert {way: after[way] - before[way] for way in after} == {way: 3 for way in after}
