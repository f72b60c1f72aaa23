import numpy as np

import triton_python_backend_utils as pb_utils

LOW = np.NINF  # NumPy 1's names, as a model written for Triton 2.51's stub uses them


class TritonPythonModel:
    def execute(self, requests):
        out = np.array([np.NaN, np.PINF, LOW, np.NZERO], dtype=np.float_).astype(np.float32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out)]) for _ in requests]
