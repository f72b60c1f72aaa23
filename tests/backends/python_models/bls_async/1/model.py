"""BLS from an async execute: two calls to the target model run concurrently."""

import asyncio

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            swapped = [pb_utils.Tensor("INPUT0", in1.as_numpy()), pb_utils.Tensor("INPUT1", in0.as_numpy())]
            first, second = await asyncio.gather(
                pb_utils.InferenceRequest(
                    model_name="add_sub", requested_output_names=["OUTPUT1"], inputs=[in0, in1]
                ).async_exec(),
                pb_utils.InferenceRequest(
                    model_name="add_sub", requested_output_names=["OUTPUT1"], inputs=swapped
                ).async_exec(),
            )
            for response in (first, second):
                if response.has_error():
                    responses.append(pb_utils.InferenceResponse(error=response.error()))
                    break
            else:
                diff = pb_utils.get_output_tensor_by_name(first, "OUTPUT1").as_numpy()
                back = pb_utils.get_output_tensor_by_name(second, "OUTPUT1").as_numpy()
                responses.append(
                    pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.abs(diff) + np.abs(back))])
                )
        return responses
