"""Decoupled with request rescheduling: IN=n sends n responses, counting down, one per execution."""

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.remaining = {}
        self.executions = 0

    def execute(self, requests):
        self.executions += 1
        for request in requests:
            key = id(request)
            if key not in self.remaining:
                self.remaining[key] = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            self.remaining[key] -= 1
            out = pb_utils.Tensor("OUT", np.array([self.remaining[key]], dtype=np.int32))
            response = pb_utils.InferenceResponse(output_tensors=[out])
            if self.remaining[key] <= 0:
                del self.remaining[key]
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(response)
        return None
