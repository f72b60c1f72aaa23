"""Answers each request with a TritonError carrying the code named in CODE (bytes), or OK."""

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            name = pb_utils.get_input_tensor_by_name(request, "CODE").as_numpy()[0].decode()
            if name == "OK":
                out = pb_utils.Tensor("OUT", np.array([1], dtype=np.int32))
                responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            elif name == "EXCEPTION":
                raise pb_utils.TritonModelException("the whole batch failed")
            else:
                code = getattr(pb_utils.TritonError, name)
                error = pb_utils.TritonError(f"failed with {name}", code)
                responses.append(pb_utils.InferenceResponse(error=error))
        return responses
