"""Triton's response cache end to end: the session's server runs with ``cache_config: local,size=1 MiB``
and the ``cached`` model enables ``response_cache``; tritonclient over HTTP and gRPC."""

from __future__ import annotations

import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

pytestmark = pytest.mark.serve


def _infer(client, module, x: np.ndarray):
    tensor = module.InferInput("X", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer("cached", [tensor])


def _metric(metrics_url: str, line_prefix: str) -> float:
    text = urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=10).read().decode()
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_prefix)]
    return values[0] if values else -1.0


def test_a_repeated_request_is_answered_from_the_cache_over_both_protocols(
    server_url: str, grpc_url: str, metrics_url: str
) -> None:
    http = httpclient.InferenceServerClient(server_url)
    grpc = grpcclient.InferenceServerClient(grpc_url)
    try:
        before = http.get_inference_statistics("cached")["model_stats"][0]["inference_stats"]
        x = np.random.default_rng().standard_normal((1, 3)).astype(np.float32)
        first = _infer(http, httpclient, x)
        again = _infer(grpc, grpcclient, x)
        np.testing.assert_allclose(again.as_numpy("Y"), 2 * x)
        calls = [first.as_numpy("CALLS")[0, 0], again.as_numpy("CALLS")[0, 0]]
        assert calls[1] == calls[0], calls  # the model did not run
        fresh = _infer(http, httpclient, x + 1)
        assert fresh.as_numpy("CALLS")[0, 0] > calls[0], (calls, fresh.as_numpy("CALLS"))

        after = http.get_inference_statistics("cached")["model_stats"][0]["inference_stats"]
        counts = {k: (before[k]["count"], after[k]["count"]) for k in ("cache_hit", "cache_miss", "success")}
        assert int(after["cache_hit"]["count"]) - int(before["cache_hit"]["count"]) == 1, counts
        assert int(after["cache_miss"]["count"]) - int(before["cache_miss"]["count"]) == 2, counts
        assert int(after["success"]["count"]) - int(before["success"]["count"]) == 3, counts

        hits = 'nv_cache_num_hits_per_model{model="cached",version="1"}'
        deadline = time.monotonic() + 30
        while _metric(metrics_url, hits) < 1 and time.monotonic() < deadline:
            time.sleep(0.5)  # replicas push their statistics every second
        assert _metric(metrics_url, hits) >= 1, urllib.request.urlopen(
            f"http://{metrics_url}/metrics"
        ).read()[-3000:]
        assert _metric(metrics_url, 'nv_cache_num_misses_per_model{model="cached",version="1"}') >= 2
        assert _metric(metrics_url, 'nv_cache_num_hits_per_model{model="add_sub",') == -1.0
    finally:
        http.close()
        grpc.close()
