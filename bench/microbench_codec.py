"""Hot-path cost of the HTTP protocol front end, per request, without a network or a model.

Measures, in microseconds per request: decoding an infer request body plus
encoding its response (``deployments.protocol.codec``), for JSON and for
binary tensors at a few sizes, and a whole request through the bare ASGI
application (``ModelHTTPApp``) over a data plane that echoes its inputs.

    python -m bench.microbench_codec [--seconds 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from deployments.inference import InferRequest, InferResponse
from deployments.protocol import codec
from deployments.protocol.http import ModelHTTPApp
from deployments.runtime.checks import ModelSchema
from repository_loader.model import ModelDescription, TensorSpec


def description(dims: tuple[int, ...]) -> ModelDescription:
    """A batching model with one FP32 input and one FP32 output of ``dims``."""
    return ModelDescription(
        name="bench",
        path=Path("."),
        platform="",
        backend="python",
        max_batch_size=8,
        inputs=(TensorSpec("INPUT0", "FP32", dims),),
        outputs=(TensorSpec("OUTPUT0", "FP32", dims),),
        versions=(1,),
    )


def request_body(array: np.ndarray, binary: bool) -> tuple[bytes, int | None]:
    """A request body as tritonclient sends it (binary inputs and outputs, or plain JSON)."""
    entry: dict[str, Any] = {"name": "INPUT0", "datatype": "FP32", "shape": list(array.shape)}
    if not binary:
        entry["data"] = array.ravel().tolist()
        return json.dumps({"inputs": [entry]}).encode(), None
    entry["parameters"] = {"binary_data_size": array.nbytes}
    header = json.dumps({"inputs": [entry], "parameters": {"binary_data_output": True}}).encode()
    return header + array.tobytes(), len(header)


def per_call_us(fn: Callable[[], Any], seconds: float) -> float:
    """Median over 5 rounds of the mean time of one call, in microseconds."""
    fn()
    n = 1
    while True:  # size a round to about seconds / 5
        start = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - start > seconds / 5 / 4:
            break
        n *= 2
    rounds = []
    for _ in range(5):
        start = time.perf_counter_ns()
        for _ in range(n * 4):
            fn()
        rounds.append((time.perf_counter_ns() - start) / (n * 4) / 1000)
    return statistics.median(rounds)


def codec_case(dims: tuple[int, ...], binary: bool) -> Callable[[], Any]:
    schema = ModelSchema.from_description(description(dims))
    array = np.random.default_rng(0).random((1, *dims), dtype=np.float32)
    body, length = request_body(array, binary)

    def run() -> Any:
        request, binary_output = codec.decode_infer_request(body, length, "bench")
        schema.check_request(request)  # what the runtime does first with every request
        response = InferResponse(
            outputs={"OUTPUT0": request.inputs["INPUT0"]}, model_name="bench", model_version="1"
        )
        return codec.encode_infer_response(response, request.requested_outputs, binary_output, schema)

    return run


class EchoDataPlane:
    """Answers every inference with its inputs renamed to outputs."""

    def __init__(self, model: ModelDescription) -> None:
        self.model = model

    async def model_description(self, name: str, version: str = "") -> ModelDescription:
        return self.model

    async def infer(self, request: InferRequest) -> InferResponse:
        return InferResponse(outputs={"OUTPUT0": request.inputs["INPUT0"]})


def asgi_case(dims: tuple[int, ...], binary: bool) -> tuple[Callable[[], Any], Callable[[], None]]:
    """A whole request through ModelHTTPApp (receive, route, decode, infer, encode, send)."""
    app = ModelHTTPApp(EchoDataPlane(description(dims)), "bench")  # type: ignore[arg-type]
    array = np.random.default_rng(0).random((1, *dims), dtype=np.float32)
    body, length = request_body(array, binary)
    headers = [(b"content-type", b"application/octet-stream")]
    if length is not None:
        headers.append((b"inference-header-content-length", str(length).encode()))
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/infer",
        "root_path": "/v2/models/bench",
        "headers": headers,
    }
    message = {"type": "http.request", "body": body, "more_body": False}
    loop = asyncio.new_event_loop()

    async def receive() -> dict:
        return message

    async def send(msg: dict) -> None:
        if msg["type"] == "http.response.start" and msg["status"] != 200:
            raise RuntimeError(f"status {msg['status']}")

    async def many(n: int) -> None:
        for _ in range(n):
            await app(scope, receive, send)

    return (lambda: loop.run_until_complete(many(100))), loop.close


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=0.5, help="time per case")
    args = parser.parse_args()
    print(f"{'case':<44}{'us/request':>12}")
    for dims in ((16,), (1000,), (3, 224, 224)):
        for binary in (False, True):
            if not binary and np.prod(dims) > 10_000:
                continue  # JSON at this size measures the json module, not the codec
            name = f"decode+encode {'binary' if binary else 'JSON  '} FP32 {list(dims)}"
            print(f"{name:<44}{per_call_us(codec_case(dims, binary), args.seconds):>12.1f}")
    for binary in (False, True):
        run, close = asgi_case((16,), binary)
        name = f"ASGI app, whole request, {'binary' if binary else 'JSON  '} FP32 [16]"
        print(f"{name:<44}{per_call_us(run, args.seconds) / 100:>12.1f}")
        close()


if __name__ == "__main__":
    main()
