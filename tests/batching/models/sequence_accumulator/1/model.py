"""A stateful Python model: a running sum per sequence, kept by the model itself.

The sequence batcher tells the model, through its control inputs, when a
sequence starts (START), whether a batch row holds a real request (READY),
and which sequence a row belongs to (CORRID). The same file runs on Triton.
"""

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()
            ready = pb_utils.get_input_tensor_by_name(request, "READY").as_numpy()
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()
            key = int(corrid.reshape(-1)[0])
            if int(ready.reshape(-1)[0]) == 0:
                total = np.zeros_like(value)
            else:
                if int(start.reshape(-1)[0]) == 1:
                    self.sums[key] = np.zeros_like(value)
                self.sums[key] = self.sums[key] + value
                total = self.sums[key]
            out = pb_utils.Tensor("OUT", total.astype(np.int32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
