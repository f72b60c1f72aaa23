"""Pipeline hand-off experiment: host round trips versus DLPack, side by side.

The pipeline is the usual two-step ensemble: a model (ONNX Runtime, with
IOBinding on the device; a PyTorch model when ONNX Runtime has no CUDA
provider) followed by PyTorch post-processing (softmax, top-k). Two ways of
handing the tensors on between the steps are timed in alternating rounds of
one run:

- ``host_round_trip``: every step boundary goes through host memory, as when
  steps exchange serialized tensors (device -> host -> device);
- ``dlpack``: the model reads its input from and writes its output to device
  buffers that PyTorch owns (IOBinding / DLPack), so nothing leaves the device
  until the final top-k.

On a machine without CUDA the same comparison runs with CPU tensors: copies of
the bytes at each boundary versus views. The result is one JSON document::

    python -m bench.gpu_pipeline --out bench/results/pipeline_handoff.json

Needs only numpy, onnx, onnxruntime and torch (no Ray).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

MODES = ("host_round_trip", "dlpack")


@dataclass(frozen=True)
class Settings:
    """Sizes and counts of one benchmark run."""

    device: str = "auto"  # "auto", "cpu" or "cuda"
    engine: str = "auto"  # "auto", "onnxruntime" or "torch"
    batch: int = 16
    features: int = 1024
    hidden: int = 2048
    classes: int = 1000
    top_k: int = 5
    iterations: int = 200
    warmup: int = 20
    rounds: int = 3


def _weights(s: Settings) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((s.features, s.hidden)) / np.sqrt(s.features)).astype(np.float32)
    w2 = (rng.standard_normal((s.hidden, s.classes)) / np.sqrt(s.hidden)).astype(np.float32)
    return w1, w2


def onnx_model(w1: np.ndarray, w2: np.ndarray) -> bytes:
    """A two-layer classifier X[B,F] -> LOGITS[B,C] as ONNX bytes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["X", "W1"], ["H"]),
            helper.make_node("Relu", ["H"], ["R"]),
            helper.make_node("MatMul", ["R", "W2"], ["LOGITS"]),
        ],
        "classifier",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["B", w1.shape[0]])],
        [helper.make_tensor_value_info("LOGITS", TensorProto.FLOAT, ["B", w2.shape[1]])],
        [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def postprocess(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The PyTorch step: class probabilities and the top ``k`` of each row."""
    probs = torch.softmax(logits, dim=1)
    scores, indices = torch.topk(probs, k, dim=1)
    return scores, indices


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def _to_host(t: torch.Tensor) -> np.ndarray:
    """A step boundary through host memory: the bytes are copied out."""
    return t.cpu().numpy() if t.is_cuda else t.numpy().copy()


def _from_host(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """A step boundary through host memory: the bytes are copied back in."""
    return torch.from_numpy(a).to(device) if device.type == "cuda" else torch.tensor(a)


Step = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class OrtPipeline:
    """ONNX Runtime model -> PyTorch post-processing."""

    def __init__(self, s: Settings, device: torch.device, model: bytes) -> None:
        import onnxruntime as ort

        provider = "CUDAExecutionProvider" if device.type == "cuda" else "CPUExecutionProvider"
        options = [{"device_id": device.index or 0}] if device.type == "cuda" else [{}]
        self.session = ort.InferenceSession(model, providers=[provider], provider_options=options)
        self.s, self.device = s, device
        self.logits = torch.empty((s.batch, s.classes), dtype=torch.float32, device=device)
        self.binding = self.session.io_binding()

    def host_round_trip(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        (logits,) = self.session.run(["LOGITS"], {"X": _to_host(x)})
        scores, indices = postprocess(_from_host(logits, self.device), self.s.top_k)
        return scores.cpu(), indices.cpu()

    def dlpack(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        kind, index = self.device.type, self.device.index or 0
        _sync(self.device)  # the producer's writes to x are done before the model reads it
        self.binding.bind_input("X", kind, index, np.float32, tuple(x.shape), x.data_ptr())
        self.binding.bind_output(
            "LOGITS", kind, index, np.float32, tuple(self.logits.shape), self.logits.data_ptr()
        )
        self.session.run_with_iobinding(self.binding)
        self.binding.synchronize_outputs()
        scores, indices = postprocess(self.logits, self.s.top_k)
        return scores.cpu(), indices.cpu()


class TorchPipeline:
    """The same classifier as a PyTorch model, where ONNX Runtime cannot use the device."""

    def __init__(self, s: Settings, device: torch.device, w1: np.ndarray, w2: np.ndarray) -> None:
        self.s, self.device = s, device
        self.w1 = torch.from_numpy(w1).to(device)
        self.w2 = torch.from_numpy(w2).to(device)

    def _model(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ self.w1) @ self.w2

    def host_round_trip(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = _to_host(self._model(_from_host(_to_host(x), self.device)))
        scores, indices = postprocess(_from_host(logits, self.device), self.s.top_k)
        return scores.cpu(), indices.cpu()

    def dlpack(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = torch.from_dlpack(self._model(x))
        scores, indices = postprocess(logits, self.s.top_k)
        return scores.cpu(), indices.cpu()


def _choose_device(s: Settings) -> torch.device:
    if s.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(s.device)


def _choose_engine(s: Settings, device: torch.device) -> str:
    if s.engine != "auto":
        return s.engine
    try:
        import onnxruntime as ort
    except ImportError:
        return "torch"
    if device.type == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
        return "torch"
    return "onnxruntime"


def _time(step: Step, x: torch.Tensor, count: int) -> list[float]:
    latencies = []
    for _ in range(count):
        start = time.perf_counter()
        step(x)
        latencies.append(time.perf_counter() - start)
    return latencies


def _summary(latencies: list[float], batch: int) -> dict[str, float]:
    ordered = sorted(latencies)
    total = sum(latencies)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1e3

    return {
        "iterations": len(latencies),
        "throughput_infer_per_s": len(latencies) * batch / total,
        "requests_per_s": len(latencies) / total,
        "latency_mean_ms": statistics.fmean(latencies) * 1e3,
        "latency_p50_ms": pct(0.50),
        "latency_p90_ms": pct(0.90),
        "latency_p99_ms": pct(0.99),
    }


def run_benchmark(s: Settings) -> dict[str, Any]:
    """Time both hand-offs in alternating rounds; the JSON-ready result."""
    device = _choose_device(s)
    engine = _choose_engine(s, device)
    w1, w2 = _weights(s)
    pipeline = (
        OrtPipeline(s, device, onnx_model(w1, w2))
        if engine == "onnxruntime"
        else TorchPipeline(s, device, w1, w2)
    )
    x = torch.from_numpy(
        np.random.default_rng(1).standard_normal((s.batch, s.features)).astype(np.float32)
    ).to(device)
    steps: dict[str, Step] = {"host_round_trip": pipeline.host_round_trip, "dlpack": pipeline.dlpack}
    reference = [steps[m](x) for m in MODES]
    match = bool(torch.equal(reference[0][1], reference[1][1])) and bool(
        torch.allclose(reference[0][0], reference[1][0], rtol=1e-4, atol=1e-6)
    )
    latencies: dict[str, list[float]] = {m: [] for m in MODES}
    for mode in MODES:
        _time(steps[mode], x, s.warmup)
    per_round = max(1, s.iterations // s.rounds)
    for _ in range(s.rounds):
        for mode in MODES:
            latencies[mode].extend(_time(steps[mode], x, per_round))
    results = {m: _summary(latencies[m], s.batch) for m in MODES}
    host, dl = results["host_round_trip"], results["dlpack"]
    return {
        "experiment": "model -> PyTorch post-processing: host round trips vs DLPack hand-off",
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
        "engine": engine,
        "versions": _versions(),
        "settings": s.__dict__,
        "results_match": match,
        "modes": results,
        "throughput_ratio_dlpack_over_host": dl["throughput_infer_per_s"] / host["throughput_infer_per_s"],
        "latency_ratio_host_over_dlpack_p50": host["latency_p50_ms"] / dl["latency_p50_ms"],
    }


def _versions() -> dict[str, str]:
    versions = {"torch": torch.__version__, "numpy": np.__version__}
    try:
        import onnxruntime as ort

        versions["onnxruntime"] = ort.__version__
    except ImportError:
        pass
    return versions


def _parse(argv: list[str] | None) -> tuple[Settings, str | None]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Settings()
    for name, value in defaults.__dict__.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = vars(parser.parse_args(argv))
    out = args.pop("out")
    return Settings(**args), out


def main(argv: list[str] | None = None) -> None:
    settings, out = _parse(argv)
    text = json.dumps(run_benchmark(settings), indent=2)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
