"""BLS that passes its request's trace on (``trace=request.trace()``, as Triton's BLS does): the
called model's spans hang under this model's span."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            called = pb_utils.InferenceRequest(
                model_name="add_sub",
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[
                    pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                    pb_utils.get_input_tensor_by_name(request, "INPUT1"),
                ],
                trace=request.trace(),
            ).exec()
            if called.has_error():
                raise pb_utils.TritonModelException(called.error().message())
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor(
                            "OUTPUT0", pb_utils.get_output_tensor_by_name(called, "OUTPUT0").as_numpy()
                        ),
                        pb_utils.Tensor(
                            "OUTPUT1", pb_utils.get_output_tensor_by_name(called, "OUTPUT1").as_numpy()
                        ),
                    ]
                )
            )
        return responses
