"""Step 1 of the food_pipeline ensemble: image bytes -> float32 [3, 224, 224].

Triton hands execute() the requests its dynamic batcher grouped. Each one is
decoded on its own: a bad image fails only its own request, with the same
"<code>: <sentence>" the Python-backend food_classifier answers, and the
other requests of the batch are served.

Where the decoding runs: config.pbtxt's parameter "decode" and the instance's kind.
  auto  nvJPEG on the instance's GPU (torchvision.io.decode_jpeg) when the instance
        is KIND_GPU and that works; otherwise servelab.core.food11 on the CPU
  gpu   nvJPEG on the GPU, or the model does not load (never dropped silently)
  cpu   servelab.core.food11 on the CPU
What was checked of torchvision 0.22.1 (the Triton image's pin) and nvJPEG on a P100,
and what was not: servelab/gpucheck/decode.py, whose gpu-check phase measures both paths.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from servelab.core import food11  # the lab's decoding guards and preprocessing


def choose_device(asked, kind, device_id):
    """(torch device for nvJPEG, or None for the CPU; the sentence initialize() logs)."""
    if asked not in ("auto", "cpu", "gpu"):
        raise ValueError(f'parameter decode is "{asked}": use "auto", "cpu" or "gpu"')
    if asked == "cpu":
        return None, "decoding on the CPU: decode=cpu in config.pbtxt"
    if kind != "GPU":
        if asked == "gpu":
            raise ValueError(f"decode=gpu asked, but this instance is KIND_{kind}: give food_preprocess "
                             "a KIND_GPU instance_group, or set decode to auto or cpu")
        return None, f"decoding on the CPU: the instance is KIND_{kind}"
    device = f"cuda:{device_id}"
    problem = cuda_decode_problem(device)
    if problem and asked == "gpu":
        raise RuntimeError(f"decode=gpu asked, but {problem}")
    if problem:
        return None, f"decoding on the CPU: {problem}"
    import torch

    return torch.device(device), f"decoding on {device} with nvJPEG (torchvision.io.decode_jpeg)"


def cuda_decode_problem(device):
    """None when torchvision decodes a JPEG on ``device``, else why not."""
    try:
        import torch
        import torchvision.io
    except ImportError as err:
        return f"torch or torchvision cannot be imported ({err})"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    try:
        tiny = torchvision.io.encode_jpeg(torch.zeros((3, 8, 8), dtype=torch.uint8))
        gpu_preprocess([tiny.numpy().tobytes()], torch.device(device))
    except Exception as err:  # e.g. "torchvision not compiled with nvJPEG support"
        return f"torchvision has no working CUDA decode_jpeg ({type(err).__name__}: {err})"
    return None


def gpu_preprocess(images, device):
    """JPEG bytes -> float32 [n, 3, 224, 224] on the CPU, decoded and resized on ``device``:
    the tensor food11.preprocess makes (Resize 224x224 bilinear with antialiasing, then
    ImageNet normalisation). A list goes to nvJPEG as one batch, all or nothing."""
    import torch
    import torchvision.io

    encoded = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in images]  # must sit on the CPU
    decoded = torchvision.io.decode_jpeg(encoded, mode=torchvision.io.ImageReadMode.RGB, device=device)
    size = (food11.INPUT_SIZE, food11.INPUT_SIZE)
    batch = torch.cat([torch.nn.functional.interpolate(img[None].float(), size=size, mode="bilinear",
                                                       antialias=True, align_corners=False) for img in decoded])
    mean = torch.tensor(food11.MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(food11.STD, device=device).view(1, 3, 1, 1)
    # Back to host memory: food_classifier_onnx takes its input from Triton (602 KB an image).
    return ((batch / 255.0 - mean) / std).cpu().numpy()


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        asked = parameters.get("decode", {}).get("string_value", "auto")
        self.device, why = choose_device(asked, args["model_instance_kind"], args["model_instance_device_id"])
        pb_utils.Logger.log_info(f"{args['model_instance_name']}: {why}")

    def execute(self, requests):
        responses = [None] * len(requests)
        images, on_gpu = [], []  # every request's images (shape [n, 1]: n per request); nvJPEG's share
        for i, request in enumerate(requests):
            items = pb_utils.get_input_tensor_by_name(request, "IMAGE_BYTES").as_numpy().reshape(-1)
            images.append([bytes(item) for item in items])
            if self.device is None:
                continue
            try:
                # The food11 guards (size, pixels, a JPEG's scans) on the CPU before any GPU decode;
                # PNGs, CMYK and rotated JPEGs stay on the CPU. A scan cut short is found while
                # decoding: whether nvJPEG refuses one as food11 does is for gpu-check to show.
                on_gpu += [(i, k) for k, item in enumerate(images[i]) if food11.plain_jpeg(item)]
            except food11.ImageDecodeError as err:
                responses[i] = self.refused(err)

        decoded = {}
        if on_gpu:
            try:  # one nvJPEG batch for every request's JPEGs
                tensors = gpu_preprocess([images[i][k] for i, k in on_gpu], self.device)
                decoded = dict(zip(on_gpu, tensors))
            except RuntimeError as err:  # refused (no partial results): the CPU decodes them
                pb_utils.Logger.log_warn(f"nvJPEG refused a batch of {len(on_gpu)}, decoding it on the CPU: {err}")

        for i, items in enumerate(images):
            if responses[i] is not None:
                continue
            try:
                # food11.preprocess: size and pixel limits from the header first, then decode + resize + normalize.
                tensor = np.stack([decoded[(i, k)] if (i, k) in decoded else food11.preprocess(item)
                                   for k, item in enumerate(items)])
            except food11.ImageDecodeError as err:
                responses[i] = self.refused(err)
                continue
            responses[i] = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("IMAGE_TENSOR", tensor)])
        return responses

    def refused(self, err):
        error = pb_utils.TritonError(f"{err.code}: {err.message}", pb_utils.TritonError.INVALID_ARG)
        return pb_utils.InferenceResponse(error=error)
