"""A PyTorch module inside model.py (Triton's pytorch example style), tensors through DLPack."""

import json

import torch
from torch.utils.dlpack import from_dlpack, to_dlpack

import triton_python_backend_utils as pb_utils


class AddSubNet(torch.nn.Module):
    def forward(self, input0, input1):
        return (input0 + input1), (input0 - input1)


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        self.device = "cuda" if args["model_instance_kind"] == "GPU" else "cpu"
        self.model = AddSubNet().to(self.device)

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = from_dlpack(pb_utils.get_input_tensor_by_name(request, "INPUT0").to_dlpack())
            in_1 = from_dlpack(pb_utils.get_input_tensor_by_name(request, "INPUT1").to_dlpack())
            with torch.no_grad():
                out_0, out_1 = self.model(in_0.to(self.device), in_1.to(self.device))
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor.from_dlpack("OUTPUT0", to_dlpack(out_0)),
                        pb_utils.Tensor("OUTPUT1", out_1.cpu().numpy()),
                    ]
                )
            )
        return responses
