"""A Python-based backend (tests/backends/test_python_based_backends.py): adds or subtracts, as the
model's own model.json says; it completes the model's configuration and reads its version folder
through pb_utils.get_model_dir()."""

import json
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        names = {i["name"] for i in config.as_dict()["input"]}
        for name in ("INPUT0", "INPUT1"):
            if name not in names:
                config.add_input({"name": name, "data_type": "TYPE_FP32", "dims": [4]})
        if not config.as_dict()["output"]:
            config.add_output({"name": "OUTPUT", "data_type": "TYPE_FP32", "dims": [4]})
        # the model's own settings are readable here too, as Triton's stub offers get_model_dir()
        with open(os.path.join(pb_utils.get_model_dir(), "model.json")) as f:
            if json.load(f).get("batching"):
                config.set_max_batch_size(8)
        return config

    def initialize(self, args):
        self.model_dir = pb_utils.get_model_dir()
        with open(os.path.join(self.model_dir, "model.json")) as f:
            self.operation = json.load(f)["operation"]

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            out = a + b if self.operation == "add" else a - b
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out)]))
        return responses
