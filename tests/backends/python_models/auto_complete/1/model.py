"""Declares its own inputs and outputs with auto_complete_config; doubles INPUT."""

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "INPUT", "data_type": "TYPE_FP32", "dims": [2]})
        auto_complete_model_config.add_output({"name": "OUTPUT", "data_type": "TYPE_FP32", "dims": [2]})
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [
                    pb_utils.Tensor(
                        "OUTPUT", pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy() * np.float32(2)
                    )
                ]
            )
            for r in requests
        ]
