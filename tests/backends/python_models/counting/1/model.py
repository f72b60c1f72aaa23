"""Doubles X; CALLS says how many requests this instance has executed (a cached answer repeats it)."""

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.executed = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            self.executed += 1
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            calls = np.full(x.shape, self.executed, dtype=np.int32)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("Y", (x * 2).astype(np.float32)), pb_utils.Tensor("CALLS", calls)]
                )
            )
        return responses
