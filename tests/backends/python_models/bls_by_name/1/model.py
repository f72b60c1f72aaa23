"""BLS: the target model's name comes from the BYTES input MODEL_NAME (``as_numpy()[0]`` is bytes)."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            model_name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]
            inference_request = pb_utils.InferenceRequest(
                model_name=model_name,
                model_version=1,
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[
                    pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                    pb_utils.get_input_tensor_by_name(request, "INPUT1"),
                ],
                request_id="bls-" + request.request_id(),
                correlation_id=request.correlation_id(),
                parameters={"caller": "bls_by_name"},
                timeout=10_000_000,
                preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0),
            )
            inference_response = inference_request.exec()
            if inference_response.has_error():
                error = inference_response.error()
                responses.append(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(error.message(), error.code()))
                )
                continue
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.get_output_tensor_by_name(inference_response, "OUTPUT0"),
                        pb_utils.get_output_tensor_by_name(inference_response, "OUTPUT1"),
                    ],
                    parameters=json.loads(inference_response.parameters()),
                )
            )
        return responses
