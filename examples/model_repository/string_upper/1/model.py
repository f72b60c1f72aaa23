"""string_upper: upper-cases each string of a BYTES tensor (numpy object arrays of bytes)."""

import numpy as np
import triton_python_backend_utils as pb_utils


def _upper(value):
    """Upper-cases one element; BYTES elements arrive as bytes (or str where a client sent text)."""
    if isinstance(value, bytes):
        return value.decode("utf-8").upper().encode("utf-8")
    return str(value).upper().encode("utf-8")


class TritonPythonModel:
    """A Python-backend model over string tensors."""

    def initialize(self, args):
        """Nothing to prepare."""

    def execute(self, requests):
        """Returns OUTPUT0 with the shape of INPUT0, each element upper-cased."""
        responses = []
        for request in requests:
            strings = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            upper = np.array([_upper(value) for value in strings.reshape(-1)], dtype=np.object_)
            output = pb_utils.Tensor("OUTPUT0", upper.reshape(strings.shape))
            responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses

    def finalize(self):
        """Nothing to release."""
