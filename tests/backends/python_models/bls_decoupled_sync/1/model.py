"""BLS into the decoupled model ``repeat`` with ``exec(decoupled=True)``: sums what it streams."""

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            inference_request = pb_utils.InferenceRequest(
                model_name="repeat",
                requested_output_names=["OUT"],
                inputs=[pb_utils.Tensor("IN", pb_utils.get_input_tensor_by_name(request, "IN").as_numpy())],
            )
            values = []
            for inference_response in inference_request.exec(decoupled=True):
                if inference_response.has_error():
                    raise pb_utils.TritonModelException(inference_response.error().message())
                # the last response may be empty: it only ends the stream
                if len(inference_response.output_tensors()) > 0:
                    values.append(
                        int(pb_utils.get_output_tensor_by_name(inference_response, "OUT").as_numpy()[0])
                    )
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("VALUES", np.array(values, dtype=np.int32)),
                        pb_utils.Tensor("COUNT", np.array([len(values)], dtype=np.int32)),
                    ]
                )
            )
        return responses
