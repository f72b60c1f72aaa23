"""identity_fp32: OUTPUT0 is INPUT0, unchanged; the least work a model can do."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """A Python-backend model that echoes its input; used to measure serving overhead."""

    def initialize(self, args):
        """Nothing to prepare."""

    def execute(self, requests):
        """Returns each request's INPUT0 as OUTPUT0."""
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", data)]))
        return responses

    def finalize(self):
        """Nothing to release."""
