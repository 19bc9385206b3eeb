"""Step 1 of the food_pipeline ensemble: image bytes -> float32 [3, 224, 224].

Triton hands execute() the requests its dynamic batcher grouped. Each one is
decoded on its own: a bad image fails only its own request, with the same
"<code>: <sentence>" the Python-backend food_classifier answers, and the
other requests of the batch are served.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

from servelab.core import food11  # the lab's decoding guards and preprocessing


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_info(f"{args['model_instance_name']}: decoding with servelab.core.food11")

    def execute(self, requests):
        responses = []
        for request in requests:
            # Shape [n, 1]: one request may carry n images.
            items = pb_utils.get_input_tensor_by_name(request, "IMAGE_BYTES").as_numpy().reshape(-1)
            try:
                # food11.preprocess: size and pixel limits from the header first, then decode + resize + normalize.
                tensor = np.stack([food11.preprocess(bytes(item)) for item in items])
            except food11.ImageDecodeError as err:
                error = pb_utils.TritonError(f"{err.code}: {err.message}", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("IMAGE_TENSOR", tensor)]))
        return responses
