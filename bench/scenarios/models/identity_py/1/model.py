"""A trivial Python-backend model: OUTPUT0 is INPUT0, for measuring serving overhead."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Returns its input unchanged, one response per request."""

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", data)
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
