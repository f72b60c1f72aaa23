"""auto_complete_scale: OUTPUT0 = 2 * INPUT0; its configuration comes from auto_complete_config()."""

import triton_python_backend_utils as pb_utils

SCALE = 2.0


class TritonPythonModel:
    """A Python-backend model whose config.pbtxt names only the backend."""

    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        """Adds the inputs, outputs, max_batch_size and dynamic batching the config leaves out."""
        config = auto_complete_model_config.as_dict()
        present = {tensor["name"] for tensor in config.get("input", []) + config.get("output", [])}
        if "INPUT0" not in present:
            auto_complete_model_config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]})
        if "OUTPUT0" not in present:
            auto_complete_model_config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]})
        if config.get("max_batch_size", 0) == 0:
            auto_complete_model_config.set_max_batch_size(8)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def initialize(self, args):
        """Nothing to prepare."""

    def execute(self, requests):
        """Returns each request's INPUT0 multiplied by two."""
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            output = pb_utils.Tensor("OUTPUT0", (data * SCALE).astype(data.dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses

    def finalize(self):
        """Nothing to release."""
