"""Hands its input X on as Y by the ``op`` parameter and reports the buffer addresses involved.

``fresh``: Y = X + 1 in a new numpy buffer; ``torch_scale``: X viewed as torch
and doubled in place; ``numpy_shift``: X viewed as numpy, plus 3 in place;
``identity``: X passed on through DLPack; ``bls``: Y from the model the
``target`` parameter names, asked for Y with X (BLS). IN_ADDRESS and OUT_ADDRESS are the
addresses of the X received and the Y returned.
"""

import json

import numpy as np
import torch

import triton_python_backend_utils as pb_utils


def address(array):
    if isinstance(array, np.ndarray):
        return array.__array_interface__["data"][0]
    return array.data_ptr()


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = config["parameters"]
        self.op = parameters["op"]["string_value"]
        self.target = parameters.get("target", {}).get("string_value", "")

    def execute(self, requests):
        return [self._one(pb_utils.get_input_tensor_by_name(r, "X")) for r in requests]

    def _one(self, x):
        if self.op == "fresh":
            y = pb_utils.Tensor("Y", x.as_numpy() + np.float32(1.0))
        elif self.op == "torch_scale":
            view = torch.from_dlpack(x.to_dlpack())
            view.mul_(2.0)
            y = pb_utils.Tensor.from_dlpack("Y", view)
        elif self.op == "numpy_shift":
            view = x.as_numpy()
            np.add(view, np.float32(3.0), out=view)
            y = pb_utils.Tensor("Y", view)
        elif self.op == "bls":
            response = pb_utils.InferenceRequest(
                model_name=self.target, requested_output_names=["Y"], inputs=[x]
            ).exec()
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            y = pb_utils.get_output_tensor_by_name(response, "Y")
        else:
            y = pb_utils.Tensor.from_dlpack("Y", x.to_dlpack())
        rows = x.shape()[0]
        return pb_utils.InferenceResponse(
            [
                y,
                pb_utils.Tensor("IN_ADDRESS", np.full((rows, 1), address(x.data()), dtype=np.int64)),
                pb_utils.Tensor("OUT_ADDRESS", np.full((rows, 1), address(y.data()), dtype=np.int64)),
            ]
        )
