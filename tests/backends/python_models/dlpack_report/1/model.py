"""DLPack both ways, with numpy and torch; FACTS = [X is_cpu, Y is_cpu, Y shares X's buffer, DOUBLED is_cpu].

Y is X through ``to_dlpack``/``from_dlpack``; DOUBLED is X doubled by torch (read through
``torch.utils.dlpack.from_dlpack``, written back with ``pb_utils.Tensor.from_dlpack``).
"""

import numpy as np
import torch
import torch.utils.dlpack

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            y = pb_utils.Tensor.from_dlpack("Y", x.to_dlpack())
            doubled = torch.utils.dlpack.from_dlpack(x.to_dlpack()) * 2
            doubled = pb_utils.Tensor.from_dlpack("DOUBLED", torch.utils.dlpack.to_dlpack(doubled))
            shares = bool(np.shares_memory(x.as_numpy(), y.as_numpy()))
            facts = np.array([x.is_cpu(), y.is_cpu(), shares, doubled.is_cpu()], dtype=bool)
            responses.append(pb_utils.InferenceResponse([y, doubled, pb_utils.Tensor("FACTS", facts)]))
        return responses
