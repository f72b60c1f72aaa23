"""Reports what the InferenceRequest API and initialize's args give (as JSON in INFO) and echoes IN."""

import json

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = args

    def execute(self, requests):
        responses = []
        for request in requests:
            info = {
                "request_id": request.request_id(),
                "correlation_id": request.correlation_id(),
                "flags": request.flags(),
                "timeout": request.timeout(),
                "parameters": json.loads(request.parameters()),
                "requested_output_names": request.requested_output_names(),
                "inputs": [t.name() for t in request.inputs()],
                "is_cancelled": request.is_cancelled(),
                "args": sorted(self.args),
                "arg_values": {k: v for k, v in self.args.items() if k != "model_config"},
                "model_config": json.loads(self.args["model_config"]),
            }
            outputs = [
                pb_utils.Tensor("INFO", np.array([json.dumps(info).encode()], dtype=np.object_)),
                pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs, parameters={"echoed": True}))
        return responses
