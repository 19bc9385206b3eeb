"""Step 3 of the food_pipeline ensemble: 11 logits -> top label and its probability."""

import numpy as np
import triton_python_backend_utils as pb_utils

from servelab.core import food11  # labels, softmax


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            logits = pb_utils.get_input_tensor_by_name(request, "LOGITS").as_numpy()  # [n, 11]
            predictions = food11.predict_from_logits(logits)                          # softmax, then top-1
            labels = np.array([[p.label.encode()] for p in predictions], dtype=object)
            probabilities = np.array([[p.probability] for p in predictions], dtype=np.float32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("FOOD_LABEL", labels),
                pb_utils.Tensor("PROBABILITY", probabilities),
            ]))
        return responses
