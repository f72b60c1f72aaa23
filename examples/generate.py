"""Generates the binary models of the example repository, deterministically.

The ONNX text-recognition model ``crnn`` and the TorchScript model
``simple_torchscript`` are built from fixed seeds, so running this script again
produces the same files that are committed under ``examples/model_repository``::

    python examples/generate.py                 # rewrite the committed files
    python examples/generate.py --out /tmp/repo # write into another repository root

Only the binary files are written; the ``config.pbtxt`` files and the Python
models are kept by hand.
"""

from __future__ import annotations

import argparse
import io
import warnings
from pathlib import Path

import onnx
import torch
from torch import nn

REPOSITORY = Path(__file__).resolve().parent / "model_repository"
SEED = 20240601
CRNN_HEIGHT, CRNN_WIDTH = 32, 100
CRNN_STEPS, CRNN_CLASSES = 26, 37  # 26 time steps; 36 characters plus the CTC blank
CRNN_INPUT, CRNN_OUTPUT = "input.1", "308"
TORCHSCRIPT_IN, TORCHSCRIPT_OUT = 16, 4
ONNX_OPSET = 17


class Crnn(nn.Module):
    """A small CRNN: a convolutional feature extractor, a bidirectional LSTM, per-step class scores.

    Input ``[batch, 1, 32, 100]`` (a grey text line), output ``[batch, 26, 37]``
    log-probabilities over 36 characters and the blank, one row per time step.
    """

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2, 2),  # 32 x 16 x 50
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2, 2),  # 64 x 8 x 25
            nn.Conv2d(64, 96, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d((2, 2), (2, 1), (0, 1)),  # 96 x 4 x 26
            nn.Conv2d(96, 96, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d((4, 1), (4, 1)),  # 96 x 1 x 26
        )
        self.rnn = nn.LSTM(96, 64, batch_first=True, bidirectional=True)
        self.classifier = nn.Linear(128, CRNN_CLASSES)
        self.log_softmax = nn.LogSoftmax(dim=-1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        features = self.features(image).squeeze(2).permute(0, 2, 1)  # batch x 26 x 96
        sequence, _ = self.rnn(features)
        return self.log_softmax(self.classifier(sequence))


class SmallMlp(nn.Module):
    """A two-layer perceptron: ``[batch, 16]`` FP32 in, ``[batch, 4]`` FP32 out."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(TORCHSCRIPT_IN, 32)
        self.out = nn.Linear(32, TORCHSCRIPT_OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(x)))


def build_crnn() -> Crnn:
    """The CRNN with its weights drawn from the fixed seed."""
    torch.manual_seed(SEED)
    return Crnn().eval()


def build_mlp() -> SmallMlp:
    """The perceptron with its weights drawn from the fixed seed."""
    torch.manual_seed(SEED + 1)
    return SmallMlp().eval()


def crnn_onnx_bytes() -> bytes:
    """The CRNN exported to ONNX with a dynamic batch axis, named as the well-known example."""
    sample = torch.zeros(1, 1, CRNN_HEIGHT, CRNN_WIDTH)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            build_crnn(),
            (sample,),
            buffer,
            input_names=[CRNN_INPUT],
            output_names=["logits"],
            dynamic_axes={CRNN_INPUT: {0: "batch"}, "logits": {0: "batch"}},
            opset_version=ONNX_OPSET,
            dynamo=False,
        )
    model = onnx.load_from_string(buffer.getvalue())
    _rename_value(model.graph, "logits", CRNN_OUTPUT)
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _rename_value(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Renames a tensor of ``graph`` everywhere it is produced, consumed or listed as an output.

    torch refuses numeric tensor names such as ``308``, which the well-known CRNN export carries.
    """
    for node in graph.node:
        node.input[:] = [new if name == old else name for name in node.input]
        node.output[:] = [new if name == old else name for name in node.output]
    for value in graph.output:
        if value.name == old:
            value.name = new


def mlp_torchscript_bytes() -> bytes:
    """The perceptron traced to TorchScript."""
    buffer = io.BytesIO()
    with torch.no_grad():
        traced = torch.jit.trace(build_mlp(), torch.zeros(1, TORCHSCRIPT_IN))
    torch.jit.save(traced, buffer)
    return _without_debug_records(buffer.getvalue())


def _without_debug_records(archive: bytes) -> bytes:
    """Rewrites a TorchScript archive without its optional source-debug records.

    Those records hold the absolute paths and text of the Python sources that were traced,
    so the file would change with the checkout's location; TorchScript loads fine without them.
    """
    reader = torch._C.PyTorchFileReader(io.BytesIO(archive))
    out = io.BytesIO()
    writer = torch._C.PyTorchFileWriter(out)
    for name in reader.get_all_records():
        if name.endswith(".debug_pkl") or name.startswith(".data/"):
            continue  # the writer adds its own .data/serialization_id
        record = reader.get_record(name)
        writer.write_record(name, record, len(record))
    writer.write_end_of_file()
    return out.getvalue()


def generate(root: Path) -> list[Path]:
    """Writes every generated model file under the repository ``root``; returns their paths."""
    files = {
        root / "crnn" / "1" / "model.onnx": crnn_onnx_bytes(),
        root / "simple_torchscript" / "1" / "model.pt": mlp_torchscript_bytes(),
    }
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return list(files)


def main(argv: list[str] | None = None) -> None:
    """Command line: ``--out`` picks the repository root (default: the bundled repository)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPOSITORY, help="repository root to write into")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
