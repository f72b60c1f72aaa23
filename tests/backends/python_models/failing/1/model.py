"""Fails on purpose, as the MODE input asks: an error response, a raised exception, a wrong return."""

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        modes = [pb_utils.get_input_tensor_by_name(r, "MODE").as_numpy().reshape(-1)[0] for r in requests]
        if b"raise" in modes:
            raise pb_utils.TritonModelException("asked to raise")
        if b"crash" in modes:
            return 1 / 0
        if b"short" in modes:
            return []
        responses = []
        for mode in modes:
            if mode == b"invalid":
                error = pb_utils.TritonError("bad value for MODE", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
            elif mode == b"unsupported":
                responses.append(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError("no", pb_utils.TritonError.UNSUPPORTED)
                    )
                )
            else:
                responses.append(
                    pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], dtype=np.int32))])
                )
        return responses
