"""image_preprocess: grey UINT8 images of any size -> FP32 [1, 32, 100] inputs for crnn.

Each image is resized to 32 x 100 (nearest neighbour) and scaled from [0, 255] to [-1, 1].
"""

import numpy as np
import triton_python_backend_utils as pb_utils

HEIGHT, WIDTH = 32, 100


def _resize_nearest(images, height, width):
    """Resizes a [batch, h, w] array to [batch, height, width] by nearest neighbour."""
    rows = (np.arange(height) * images.shape[1] // height).clip(0, images.shape[1] - 1)
    cols = (np.arange(width) * images.shape[2] // width).clip(0, images.shape[2] - 1)
    return images[:, rows][:, :, cols]


def preprocess(images):
    """[batch, h, w] UINT8 -> [batch, 1, 32, 100] FP32 in [-1, 1]."""
    resized = _resize_nearest(images, HEIGHT, WIDTH).astype(np.float32)
    return (resized / 127.5 - 1.0)[:, np.newaxis, :, :]


class TritonPythonModel:
    """A Python-backend pre-processing model, the first step of text_recognition."""

    def initialize(self, args):
        """Nothing to prepare."""

    def execute(self, requests):
        """Returns PREPROCESSED for each request's batch of images."""
        responses = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
            if images.ndim != 3 or images.shape[1] == 0 or images.shape[2] == 0:
                error = pb_utils.TritonError(
                    f"image_preprocess: IMAGE must be [batch, height, width] with height, width > 0; got {list(images.shape)}"
                )
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            output = pb_utils.Tensor("PREPROCESSED", preprocess(images))
            responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses

    def finalize(self):
        """Nothing to release."""
