"""Answers which thread ran ``execute``; sleeps ``SLEEP_MS`` (a model parameter) first."""

import json
import threading
import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.sleep_s = float(parameters.get("SLEEP_MS", {}).get("string_value", "0")) / 1000

    def execute(self, requests):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        thread = threading.current_thread().name.encode()
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("THREAD", np.array([thread], dtype=np.object_))])
            for _ in requests
        ]
