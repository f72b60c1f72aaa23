"""Logs TEXT through pb_utils.Logger at every level, in Triton's documented forms; answers its pid."""

import os

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_info(f"initialized {args['model_name']} version {args['model_version']}")

    def execute(self, requests):
        logger = pb_utils.Logger
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()[0].decode()
            logger.log_info(f"{text} info")
            logger.log_warn(f"{text} warn")
            logger.log_error(f"{text} error")
            logger.log_verbose(f"{text} verbose")
            logger.log(f"{text} leveled", logger.ERROR)
            pid = pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64))
            responses.append(pb_utils.InferenceResponse([pid]))
        return responses
