"""The Food-11 contract: labels, safe image decoding, preprocessing, softmax.

Every service in the lab (both FastAPI apps, the Triton Python model, the
Flask app, the benchmarks) imports this module, so they all agree on:

* the 11 class labels, in the order the model's output uses;
* how untrusted bytes become an image (with limits, so an upload cannot
  exhaust memory);
* how an image becomes the float32 tensor the model expects;
* how logits become a probability.

Only PIL and numpy are needed: the ONNX paths never import torch.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import warnings
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
from PIL import Image, UnidentifiedImageError

LABELS: tuple[str, ...] = (
    "Bread",
    "Dairy product",
    "Dessert",
    "Egg",
    "Fried food",
    "Meat",
    "Noodles/Pasta",
    "Rice",
    "Seafood",
    "Soup",
    "Vegetable/Fruit",
)
NUM_CLASSES = len(LABELS)

INPUT_SIZE = 224
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)

# Limits on untrusted input. Both can be changed by environment variable.
# 8 MiB of encoded image is far more than any phone photo needs after JPEG;
# 40 megapixels decoded is ~120 MB of RGB, the most one request may cost.
MAX_IMAGE_BYTES = int(os.environ.get("SERVELAB_MAX_IMAGE_BYTES", 8 * 1024 * 1024))
MAX_IMAGE_PIXELS = int(os.environ.get("SERVELAB_MAX_IMAGE_PIXELS", 40_000_000))


ALLOWED_FORMATS = ("JPEG", "PNG", "GIF", "BMP", "WEBP", "TIFF", "MPO")


class ImageDecodeError(ValueError):
    """Raised for input that cannot become an image. ``code`` is stable and
    machine-readable; ``str(err)`` is a sentence a student understands.
    ``status`` is the HTTP status a service should answer with."""

    code = "invalid_image"
    status = 400

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidBase64Error(ImageDecodeError):
    code = "invalid_base64"


class NotAnImageError(ImageDecodeError):
    code = "not_an_image"


class TruncatedImageError(ImageDecodeError):
    code = "truncated_image"


class ImageTooLargeError(ImageDecodeError):
    """Too many pixels (a decompression bomb), or too many bytes."""

    code = "image_too_large"
    status = 413


@dataclass(frozen=True)
class Prediction:
    label: str
    probability: float
    index: int

    def as_dict(self) -> dict:
        return {"prediction": self.label, "probability": self.probability}


# --------------------------------------------------------------------------
# Decoding untrusted input
# --------------------------------------------------------------------------

def decode_base64(data: str | bytes, max_bytes: int | None = None) -> bytes:
    """Strict base64 → bytes, refusing anything that would decode to more
    than ``max_bytes`` *before* decoding it."""
    max_bytes = MAX_IMAGE_BYTES if max_bytes is None else max_bytes
    if isinstance(data, str):
        try:
            data = data.encode("ascii")
        except UnicodeEncodeError:
            raise InvalidBase64Error("The image field is not base64: it contains non-ASCII characters.") from None
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidBase64Error("The image field must be a base64 string.")
    data = bytes(data).strip()
    # Accept data URLs ("data:image/jpeg;base64,....") as browsers produce them.
    if data[:5] == b"data:" and b"," in data[:100]:
        data = data.split(b",", 1)[1]
    if not data:
        raise InvalidBase64Error("The image field is empty.")
    if len(data) * 3 // 4 > max_bytes:
        raise ImageTooLargeError(
            f"The image is larger than the {max_bytes} byte limit."
        )
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidBase64Error(
            "The image field is not valid base64 (check for stray characters or missing padding)."
        ) from None


def load_image(data: bytes, max_bytes: int | None = None, max_pixels: int | None = None) -> Image.Image:
    """Untrusted encoded image bytes → fully decoded RGB ``PIL.Image``.

    Checks the byte size first, then the declared pixel count from the header
    (cheap: nothing is decoded yet), then decodes everything so truncation is
    caught here rather than later."""
    max_bytes = MAX_IMAGE_BYTES if max_bytes is None else max_bytes
    max_pixels = MAX_IMAGE_PIXELS if max_pixels is None else max_pixels
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise NotAnImageError("Expected image bytes.")
    data = bytes(data)
    if len(data) == 0:
        raise NotAnImageError("The image is empty (0 bytes).")
    if len(data) > max_bytes:
        raise ImageTooLargeError(f"The image is {len(data)} bytes; the limit is {max_bytes}.")
    try:
        with warnings.catch_warnings():
            # PIL warns (and raises past 2x) on its own global bomb limit; we
            # apply our own explicit limit below instead.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS)
            width, height = img.size
            if width <= 0 or height <= 0:
                raise NotAnImageError("The image has zero width or height.")
            if width * height > max_pixels:
                raise ImageTooLargeError(
                    f"The image is {width}x{height} = {width * height} pixels; "
                    f"the limit is {max_pixels} (a possible decompression bomb)."
                )
            img.load()  # the first frame of an animation: nothing else is read
            return _to_rgb(img)
    except ImageDecodeError:
        raise
    except Image.DecompressionBombError:
        raise ImageTooLargeError("The image declares too many pixels (a possible decompression bomb).") from None
    except UnidentifiedImageError:
        raise NotAnImageError("The data is not an image PIL can read (expected JPEG, PNG, ...).") from None
    except (OSError, SyntaxError, EOFError) as err:
        text = str(err).lower()
        if "truncated" in text or "broken data stream" in text or isinstance(err, EOFError) or "end of file" in text:
            raise TruncatedImageError("The image is truncated: the file ends before all its pixels.") from None
        raise NotAnImageError(f"The image could not be decoded: {err}") from None
    except Exception as err:  # whatever else a decoder raises on hostile bytes
        raise NotAnImageError(f"The image could not be decoded: {type(err).__name__}") from None


def _to_rgb(img: Image.Image) -> Image.Image:
    """Any PIL mode (palette, CMYK, 16-bit, alpha, greyscale) → RGB, with at
    most one extra full-size copy besides the result."""
    if img.mode == "RGB":
        return img
    if img.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        lo, hi = img.getextrema() if img.mode == "F" else (0, img.getextrema()[1])
        lo = 0.0 if lo != lo or lo in (float("inf"), float("-inf")) else float(lo)
        hi = 1.0 if hi != hi or hi in (float("inf"), float("-inf")) else float(hi)
        scale = 255.0 / ((hi - lo) or 1.0)
        src = img if img.mode in ("I", "F") else img.convert("I")
        img = src.point(lambda x: x * scale - lo * scale, "L") if src.mode == "I" else \
            src.point(lambda x: x * scale - lo * scale).convert("L")
        return img.convert("RGB")
    if img.mode in ("RGBA", "LA", "PA", "La", "RGBa") or (img.mode == "P" and "transparency" in img.info):
        rgba = img if img.mode == "RGBA" else img.convert("RGBA")
        out = Image.new("RGB", rgba.size, (255, 255, 255))
        out.paste(rgba, (0, 0), rgba)  # composite on white, alpha as the mask
        return out
    return img.convert("RGB")


# --------------------------------------------------------------------------
# Preprocessing: the numpy twin of torchvision's
#   Resize((224, 224)) -> ToTensor() -> Normalize(MEAN, STD)
# --------------------------------------------------------------------------

def preprocess_image(img: Image.Image) -> np.ndarray:
    """RGB PIL image → float32 array [3, 224, 224], ImageNet-normalized."""
    if img.mode != "RGB":
        img = _to_rgb(img)
    # torchvision's Resize on a PIL image calls PIL's resize with bilinear
    # filtering and antialiasing, which is exactly this call.
    resized = np.asarray(img.resize((INPUT_SIZE, INPUT_SIZE), Image.Resampling.BILINEAR))  # HWC uint8
    # (x / 255 - mean) / std, channel by channel straight into CHW order:
    # one pass per channel instead of broadcasting over the size-3 last axis.
    out = np.empty((3, INPUT_SIZE, INPUT_SIZE), dtype=np.float32)
    for c in range(3):
        np.multiply(resized[:, :, c], 1.0 / (255.0 * STD[c]), out=out[c], casting="unsafe")
        out[c] -= MEAN[c] / STD[c]
    return out


def preprocess(data: bytes | Image.Image, **limits) -> np.ndarray:
    """Encoded image bytes (or a PIL image) → float32 [3, 224, 224]."""
    img = data if isinstance(data, Image.Image) else load_image(data, **limits)
    return preprocess_image(img)


def preprocess_batch(items: Sequence[bytes | Image.Image], **limits) -> np.ndarray:
    """A list of images → float32 [N, 3, 224, 224]."""
    if len(items) == 0:
        return np.zeros((0, 3, INPUT_SIZE, INPUT_SIZE), dtype=np.float32)
    return np.stack([preprocess(item, **limits) for item in items])


def preprocess_base64(data: str | bytes, **limits) -> np.ndarray:
    """base64 string → float32 [3, 224, 224] (the FastAPI request path)."""
    max_bytes = limits.get("max_bytes")
    return preprocess(decode_base64(data, max_bytes=max_bytes), **limits)


# --------------------------------------------------------------------------
# Postprocessing
# --------------------------------------------------------------------------

def softmax(logits: np.ndarray | Iterable, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax: subtract the row max before exp, so logits
    of +-1000 give finite probabilities instead of inf/nan."""
    x = np.asarray(logits, dtype=np.float64)
    if x.ndim == 0:
        raise ValueError("softmax needs at least one logit")
    shifted = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(shifted)
    return e / np.sum(e, axis=axis, keepdims=True)


def top1(probabilities: np.ndarray) -> list[Prediction]:
    """Probabilities [N, 11] (or [11]) → one Prediction per row."""
    p = np.asarray(probabilities, dtype=np.float64)
    if p.ndim == 1:
        p = p[None, :]
    if p.shape[-1] != NUM_CLASSES:
        raise ValueError(f"expected {NUM_CLASSES} classes, got shape {p.shape}")
    idx = p.argmax(axis=-1)
    return [Prediction(LABELS[i], float(row[i]), int(i)) for i, row in zip(idx, p)]


def predict_from_logits(logits: np.ndarray) -> list[Prediction]:
    """Logits [N, 11] → softmax → top-1 label and its probability per row."""
    return top1(softmax(logits))


# --------------------------------------------------------------------------
# What the weights are: every place that shows a prediction says it.
# --------------------------------------------------------------------------

DEMO_WEIGHTS_NOTE = (
    "untrained demo weights: latency is real, labels are not"
)


def weights_kind(model_path: str | os.PathLike) -> str:
    """'demo' or 'trained', read from the stamp ``servelab models build``
    writes beside each artifact (``<artifact>.json``); 'unknown' if absent."""
    import json

    stamp = f"{os.fspath(model_path)}.json"
    try:
        with open(stamp, encoding="utf-8") as f:
            return str(json.load(f).get("weights_kind", "unknown"))
    except (OSError, ValueError):
        return "unknown"
