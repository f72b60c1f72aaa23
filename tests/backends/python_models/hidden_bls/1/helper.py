"""A BLS call made outside model.py, where a scan of model.py cannot see it."""

import triton_python_backend_utils as pb_utils


def call(model_name, tensors):
    request = pb_utils.InferenceRequest(
        model_name=model_name, requested_output_names=["OUTPUT0"], inputs=tensors
    )
    return request.exec()
