"""Calls add_sub through a helper module (synchronous BLS) and returns its OUTPUT0 and the thread."""

import threading

import helper
import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            inputs = [pb_utils.get_input_tensor_by_name(request, n) for n in ("INPUT0", "INPUT1")]
            reply = helper.call("add_sub", inputs)
            if reply.has_error():
                raise pb_utils.TritonModelException(reply.error().message())
            out = pb_utils.get_output_tensor_by_name(reply, "OUTPUT0")
            thread = np.array([threading.current_thread().name.encode()], dtype=np.object_)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", out.as_numpy()), pb_utils.Tensor("THREAD", thread)]
                )
            )
        return responses
