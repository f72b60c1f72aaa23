"""crnn_postprocess: greedy CTC decoding of crnn's [26, 37] scores into text.

Class 0 is the CTC blank; classes 1..36 are the characters of the ``alphabet`` parameter.
The decoder takes the best class per time step, merges repeats, then drops blanks.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

DEFAULT_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


def greedy_ctc_decode(scores, alphabet):
    """[batch, steps, classes] scores -> one decoded bytes string per row."""
    best = scores.argmax(axis=-1)
    texts = []
    for path in best:
        keep = np.ones(path.shape, dtype=bool)
        keep[1:] = path[1:] != path[:-1]
        labels = path[keep & (path != 0)]
        texts.append("".join(alphabet[label - 1] for label in labels).encode("utf-8"))
    return texts


class TritonPythonModel:
    """A Python-backend post-processing model, the last step of text_recognition."""

    def initialize(self, args):
        """Reads the alphabet from the model's parameters."""
        model_config = json.loads(args["model_config"])
        parameter = model_config.get("parameters", {}).get("alphabet", {})
        self.alphabet = parameter.get("string_value") or DEFAULT_ALPHABET

    def execute(self, requests):
        """Returns TEXT ([batch, 1] BYTES) for each request's batch of scores."""
        responses = []
        for request in requests:
            scores = pb_utils.get_input_tensor_by_name(request, "LOGITS").as_numpy()
            texts = np.array(greedy_ctc_decode(scores, self.alphabet), dtype=np.object_)
            output = pb_utils.Tensor("TEXT", texts.reshape(-1, 1))
            responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses

    def finalize(self):
        """Nothing to release."""
