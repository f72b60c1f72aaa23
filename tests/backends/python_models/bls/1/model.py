"""BLS from a sync execute: asks the model named in the MODEL_NAME parameter for OUTPUT0."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.target = config["parameters"]["MODEL_NAME"]["string_value"]

    def execute(self, requests):
        responses = []
        for request in requests:
            infer_request = pb_utils.InferenceRequest(
                model_name=self.target,
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[
                    pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                    pb_utils.get_input_tensor_by_name(request, "INPUT1"),
                ],
            )
            infer_response = infer_request.exec()
            if infer_response.has_error():
                raise pb_utils.TritonModelException(infer_response.error().message())
            out0 = pb_utils.get_output_tensor_by_name(infer_response, "OUTPUT0")
            out1 = pb_utils.get_output_tensor_by_name(infer_response, "OUTPUT1")
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", out0.as_numpy()), pb_utils.Tensor("OUTPUT1", out1.as_numpy())]
                )
            )
        return responses
