"""food_cascade: Business Logic Scripting (BLS), a conditional pipeline in Python.

For each request: food_preprocess turns the image into a tensor, food_classifier_onnx gives
11 logits; when the top probability is below ``threshold`` (config.pbtxt), the request is
escalated to food_classifier (PyTorch), whose answer is returned instead. PATH says which.

Notebook 6a copies this folder into Triton's repository beside the models it calls (it is not
one of the lab's standing models) and takes it out again.

Every call is an ordinary inference request that Triton schedules on the called model (its own
queue, batching and copies). A request whose image is bad, or whose inner call fails, gets its
own error; the other requests of the batch are served.
"""

import asyncio
import base64

import numpy as np
import triton_python_backend_utils as pb_utils

from servelab.core import food11  # softmax and labels


class InnerError(Exception):
    """An inner call's error. food_preprocess fails only on a bad image (the client's mistake:
    400); any other inner model that cannot answer makes this request unavailable (503)."""

    def __init__(self, model, error):
        super().__init__(f"{model}: {error.message()}")
        self.code = pb_utils.TritonError.INVALID_ARG if model == "food_preprocess" else pb_utils.TritonError.UNAVAILABLE


async def call(model, inputs, outputs):
    """One BLS call: an inference request to ``model``, run by Triton; its outputs as numpy arrays.
    ``async_exec``: while it waits, the other requests of the batch make their own calls, so the
    called models see them together and batch them."""
    request = pb_utils.InferenceRequest(model_name=model, inputs=inputs, requested_output_names=outputs)
    response = await request.async_exec()
    if response.has_error():
        raise InnerError(model, response.error())
    return [pb_utils.get_output_tensor_by_name(response, name).as_numpy() for name in outputs]


class TritonPythonModel:
    def initialize(self, args):
        import json

        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.threshold = float(parameters.get("threshold", {}).get("string_value", "0.5"))
        pb_utils.Logger.log_info(f"{args['model_instance_name']}: escalating below probability {self.threshold}")

    async def answer(self, images):
        """Labels, probabilities and paths for one request's images (shape [n, 1])."""
        [tensor] = await call("food_preprocess", [pb_utils.Tensor("IMAGE_BYTES", images)], ["IMAGE_TENSOR"])
        [logits] = await call("food_classifier_onnx", [pb_utils.Tensor("input", tensor)], ["output"])
        labels, probabilities, paths = [], [], []
        for image, prediction in zip(images.reshape(-1), food11.predict_from_logits(logits)):
            label, probability, path = prediction.label.encode(), prediction.probability, b"onnx"
            if probability < self.threshold:  # unsure: ask the PyTorch model (it takes base64)
                encoded = np.array([[base64.b64encode(bytes(image))]], dtype=object)
                label_out, prob_out = await call("food_classifier", [pb_utils.Tensor("INPUT_IMAGE", encoded)],
                                           ["FOOD_LABEL", "PROBABILITY"])
                label, probability, path = label_out.reshape(-1)[0], float(prob_out.reshape(-1)[0]), b"onnx+pytorch"
            labels.append([label])
            probabilities.append([probability])
            paths.append([path])
        return [pb_utils.Tensor("FOOD_LABEL", np.array(labels, dtype=object)),
                pb_utils.Tensor("PROBABILITY", np.array(probabilities, dtype=np.float32)),
                pb_utils.Tensor("PATH", np.array(paths, dtype=object))]

    async def respond(self, request):
        images = pb_utils.get_input_tensor_by_name(request, "IMAGE_BYTES").as_numpy()
        try:
            return pb_utils.InferenceResponse(output_tensors=await self.answer(images))
        except InnerError as err:  # this request alone fails, naming the inner model
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(err), err.code))

    async def execute(self, requests):
        # Every request of the batch at once: their inner calls overlap (asyncio, one thread).
        return await asyncio.gather(*(self.respond(r) for r in requests))
