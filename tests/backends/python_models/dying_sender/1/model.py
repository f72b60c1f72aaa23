"""A decoupled model whose response thread sends one response and ends without the FINAL flag (as one
that dies of an exception does, once its frame is freed)."""

import threading

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            threading.Thread(target=self._respond, args=(sender,), daemon=True).start()
        return None

    def _respond(self, sender):
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], np.int32))]))
