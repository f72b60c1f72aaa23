"""Calls the example models over gRPC with the unmodified Triton client.

python examples/client_grpc.py --url localhost:8001
"""

from __future__ import annotations

import argparse

import numpy as np
import tritonclient.grpc as grpcclient


def call_add_sub(client: grpcclient.InferenceServerClient) -> None:
    """Sends one batch of two rows to add_sub and checks the sum and the difference."""
    in0 = np.arange(8, dtype=np.float32).reshape(2, 4)
    in1 = np.ones((2, 4), dtype=np.float32)
    inputs = [
        grpcclient.InferInput("INPUT0", list(in0.shape), "FP32"),
        grpcclient.InferInput("INPUT1", list(in1.shape), "FP32"),
    ]
    inputs[0].set_data_from_numpy(in0)
    inputs[1].set_data_from_numpy(in1)
    result = client.infer("add_sub", inputs)
    assert np.array_equal(result.as_numpy("OUTPUT0"), in0 + in1)
    assert np.array_equal(result.as_numpy("OUTPUT1"), in0 - in1)
    print("add_sub OUTPUT0:", result.as_numpy("OUTPUT0").tolist())
    print("add_sub OUTPUT1:", result.as_numpy("OUTPUT1").tolist())


def call_text_recognition(client: grpcclient.InferenceServerClient) -> None:
    """Sends a synthetic 48 x 160 grey image through the text_recognition ensemble."""
    image = (np.indices((48, 160)).sum(axis=0) % 256).astype(np.uint8)[np.newaxis]
    image_input = grpcclient.InferInput("IMAGE", list(image.shape), "UINT8")
    image_input.set_data_from_numpy(image)
    result = client.infer(
        "text_recognition", [image_input], outputs=[grpcclient.InferRequestedOutput("TEXT")]
    )
    print("text_recognition TEXT:", result.as_numpy("TEXT").tolist())


def main() -> None:
    """Parses the server address and calls both models."""
    parser = argparse.ArgumentParser(description="Call add_sub and text_recognition over gRPC.")
    parser.add_argument("--url", default="localhost:8001", help="host:port of the gRPC endpoint")
    args = parser.parse_args()
    client = grpcclient.InferenceServerClient(url=args.url)
    print("server live:", client.is_server_live())
    call_add_sub(client)
    call_text_recognition(client)


if __name__ == "__main__":
    main()
