"""The web page's calls to Triton, with Triton's own client library (tritonclient.http).

One request per upload. What travels depends on the model (models_staging/*/config.pbtxt):

* food_classifier and the food_pipeline ensemble: the photo itself (BYTES); the model decodes it,
  classifies it and names the class (outputs FOOD_LABEL and PROBABILITY);
* food_classifier_onnx: the float32 tensor the client made from the photo (FP32, [3, 224, 224]); Triton
  names the classes itself: its output has `label_filename: "labels.txt"`, and asking for that output
  with `class_count` (Triton's classification extension) returns "score:index:label" strings, best
  first, instead of the 11 raw numbers.

Each function takes a connected client (`httpclient.InferenceServerClient(url="triton_server:8000")`)
and returns (label, probability). `batched`: the model's config has max_batch_size > 0, so every
tensor starts with the batch dimension (here a batch of one).
"""

import numpy as np
import tritonclient.http as httpclient


def classify_image(client, model, payload, input_name="INPUT_IMAGE", batched=True):
    """food_classifier (payload: the photo as base64 text, input INPUT_IMAGE) or food_pipeline
    (payload: the file's own bytes, input IMAGE_BYTES)."""
    element = np.array([payload], dtype=object)                        # dims [1], BYTES
    if batched:
        element = element.reshape(1, 1)                                # [batch=1, 1]
    inp = httpclient.InferInput(input_name, list(element.shape), "BYTES")
    inp.set_data_from_numpy(element)
    outputs = [httpclient.InferRequestedOutput("FOOD_LABEL"), httpclient.InferRequestedOutput("PROBABILITY")]
    result = client.infer(model, [inp], outputs=outputs)
    label = result.as_numpy("FOOD_LABEL").reshape(-1)[0]
    label = label.decode("utf-8") if isinstance(label, bytes) else str(label)
    return label, float(result.as_numpy("PROBABILITY").reshape(-1)[0])


def classify_tensor(client, model, tensor, batched=True, classes=11):
    """food_classifier_onnx: ``tensor`` is the preprocessed photo (float32 [3, 224, 224]). All
    ``classes`` come back ranked and named by Triton; the probability is the softmax of the scores."""
    x = tensor[np.newaxis] if batched else tensor                      # [1, 3, 224, 224]
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    ranked = httpclient.InferRequestedOutput("output", binary_data=True, class_count=classes)
    result = client.infer(model, [inp], outputs=[ranked])
    entries = [e.decode("utf-8").split(":", 2) for e in result.as_numpy("output").reshape(-1)]
    scores = np.array([float(entry[0]) for entry in entries])         # logits, best first
    probability = 1.0 / np.exp(scores - scores[0]).sum()              # softmax of the best one
    best = entries[0]                                                 # [score, index, label]
    label = best[2] if len(best) > 2 else f"class {best[1]}"          # a model without label_filename
    return label, float(probability)
