"""The HTTP floor measurement: a real bare uvicorn server, a real closed-loop client, CPU per request."""

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("httptools")

from bench.http_floor import measure_floor  # noqa: E402


def test_the_floor_counts_requests_and_the_cpu_each_side_spent():
    result = measure_floor(concurrency=2, seconds=0.5, request_bytes=1000, response_bytes=300)
    assert result["requests"] > 10
    assert result["requests_per_s"] == pytest.approx(result["requests"] / result["seconds"])
    assert result["server_cpu_ms_per_request"] > 0 and result["client_cpu_ms_per_request"] > 0
    assert (result["request_bytes"], result["response_bytes"]) == (1000, 300)
