"""BLS into the decoupled model ``repeat`` with ``await async_exec(decoupled=True)``, two calls at once."""

import asyncio

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            inference_request = pb_utils.InferenceRequest(
                model_name="repeat", requested_output_names=["OUT"], inputs=[pb_utils.Tensor("IN", values)]
            )
            streams = await asyncio.gather(
                inference_request.async_exec(decoupled=True), inference_request.async_exec(decoupled=True)
            )
            received = []
            for infer_responses in streams:
                for infer_response in infer_responses:
                    if infer_response.has_error():
                        raise pb_utils.TritonModelException(infer_response.error().message())
                    if len(infer_response.output_tensors()) > 0:
                        received.append(
                            int(pb_utils.get_output_tensor_by_name(infer_response, "OUT").as_numpy()[0])
                        )
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("VALUES", np.array(received, dtype=np.int32)),
                        pb_utils.Tensor("COUNT", np.array([len(received)], dtype=np.int32)),
                    ]
                )
            )
        return responses
