"""add_sub: OUTPUT0 = INPUT0 + INPUT1 and OUTPUT1 = INPUT0 - INPUT1, element by element."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """A Python-backend model; each request of a batch gets its own response."""

    def initialize(self, args):
        """Reads the output data types from the model configuration."""
        model_config = json.loads(args["model_config"])
        self.output_dtypes = [
            pb_utils.triton_string_to_numpy(
                pb_utils.get_output_config_by_name(model_config, name)["data_type"]
            )
            for name in ("OUTPUT0", "OUTPUT1")
        ]

    def execute(self, requests):
        """Returns one response per request, in the order of the requests."""
        sum_dtype, diff_dtype = self.output_dtypes
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            out0 = pb_utils.Tensor("OUTPUT0", (in0 + in1).astype(sum_dtype))
            out1 = pb_utils.Tensor("OUTPUT1", (in0 - in1).astype(diff_dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out0, out1]))
        return responses

    def finalize(self):
        """Nothing to release."""
