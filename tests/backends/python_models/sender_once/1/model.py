"""Not decoupled, yet answers through the response sender: one response, then the final flag."""

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            sender.send(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value + np.int32(1))]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
            try:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except pb_utils.TritonModelException:
                self.closed_sender_refused = True
        return None
