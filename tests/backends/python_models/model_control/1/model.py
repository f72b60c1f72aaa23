"""BLS model control: ACTION (bytes) "load", "unload" or "ready" on the model named in TARGET."""

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            action = pb_utils.get_input_tensor_by_name(request, "ACTION").as_numpy()[0].decode()
            target = pb_utils.get_input_tensor_by_name(request, "TARGET").as_numpy()[0]
            try:
                if action == "load":
                    pb_utils.load_model(model_name=target)
                elif action == "unload":
                    pb_utils.unload_model(model_name=target, unload_dependents=False)
                ready = pb_utils.is_model_ready(model_name=target, model_version="1")
            except pb_utils.TritonModelException as error:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(error.message())))
                continue
            out = pb_utils.Tensor("READY", np.array([ready], dtype=np.bool_))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
