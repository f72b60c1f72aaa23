"""Strings in and out: upper-cases each element and reports its length."""

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper = np.array(
                [t.decode("utf-8").upper().encode("utf-8") for t in text.reshape(-1)], dtype=np.object_
            )
            lengths = np.array([len(t) for t in text.reshape(-1)], dtype=np.int32)
            # round trip through Triton's serialized form, as models that handle raw buffers do
            wire = pb_utils.serialize_byte_tensor(upper)
            upper = pb_utils.deserialize_bytes_tensor(wire.item()).reshape(text.shape)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("UPPER", upper), pb_utils.Tensor("LENGTH", lengths.reshape(text.shape))]
                )
            )
        return responses
