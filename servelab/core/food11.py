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
from PIL import Image, ImageOps, UnidentifiedImageError

# Register every plugin now, so that _OPENERS below sees them all.
Image.init()

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
# Decoding costs CPU per pixel, not per byte: a flat 40 MP PNG of 131 KB costs
# ~0.9 s of CPU against ~3 ms for a photo. Images over RATIO_FREE_PIXELS must
# carry at least one byte per MAX_PIXELS_PER_BYTE pixels (photos carry one per
# 1-10 pixels; a diagram saved as PNG one per 10-50). JPEGs are exempt: they
# are decoded at reduced size (see load_image's draft_size), which is cheap.
MAX_PIXELS_PER_BYTE = int(os.environ.get("SERVELAB_MAX_PIXELS_PER_BYTE", 64))
RATIO_FREE_PIXELS = 4_000_000


ALLOWED_FORMATS = ("JPEG", "PNG", "GIF", "BMP", "WEBP", "TIFF", "MPO")
# What Image.open may try: a format without an opener of its own (MPO is read
# by the JPEG plugin in Pillow 13) would make Image.open raise KeyError.
_OPENERS = tuple(f for f in ALLOWED_FORMATS if f in Image.OPEN)


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

_B64_STANDARD_BYTES = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_B64_STANDARD = frozenset(_B64_STANDARD_BYTES)
_B64_URLSAFE_TABLE = bytes.maketrans(b"-_", b"+/")
_WHITESPACE = b" \t\r\n\v\f"


def _base64_payload(data: str | bytes) -> bytes:
    """The base64 text as bytes: ASCII only, stripped, without a data URL's
    ("data:image/jpeg;base64,....", as browsers produce them) prefix."""
    if isinstance(data, str):
        try:
            data = data.encode("ascii")
        except UnicodeEncodeError:
            raise InvalidBase64Error("The image field is not base64: it contains non-ASCII characters.") from None
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidBase64Error("The image field must be a base64 string.")
    data = bytes(data).strip()
    if data[:5] == b"data:" and b"," in data[:100]:
        data = data.split(b",", 1)[1]
    return data


def _standard_alphabet(body: bytes, padding: int) -> bytes:
    """``body`` (base64 without its ``padding`` '=' characters) in the
    standard alphabet, or a sentence naming what is wrong with it."""
    urlsafe = b"-" in body or b"_" in body
    if urlsafe and (b"+" in body or b"/" in body):
        raise InvalidBase64Error("The image field mixes the standard (+/) and URL-safe (-_) base64 alphabets; "
                                 "use one of them.")
    if urlsafe:
        body = body.translate(_B64_URLSAFE_TABLE)
    bad = set(body) - _B64_STANDARD
    if bad:
        if b"=" in body:
            raise InvalidBase64Error("The image field is not valid base64: '=' padding may only appear at the end.")
        shown = ", ".join(repr(chr(c)) for c in sorted(bad)[:5])
        raise InvalidBase64Error(f"The image field is not valid base64: it contains {shown}.")
    if len(body) % 4 == 1:
        raise InvalidBase64Error(f"The image field is not valid base64: its length ({len(body)} characters "
                                 "without padding) leaves one character over; was it cut short?")
    if padding > 2 or (padding and (len(body) + padding) % 4):
        raise InvalidBase64Error("The image field is not valid base64: wrong number of '=' padding characters.")
    return body


def decode_base64(data: str | bytes, max_bytes: int | None = None) -> bytes:
    """base64 → bytes, refusing anything that would decode to more than
    ``max_bytes`` *before* decoding it.

    Accepts what users actually send: standard or URL-safe alphabet, with or
    without ``=`` padding, wrapped in lines (``base64`` CLI, ``encodebytes``),
    or as a data URL. Anything else gets a sentence naming what is wrong."""
    max_bytes = MAX_IMAGE_BYTES if max_bytes is None else max_bytes
    data = _base64_payload(data)
    if len(data) * 3 // 4 > max_bytes:  # checked before any copy below
        raise ImageTooLargeError(
            f"The image is larger than the {max_bytes} byte limit."
        )
    # What nearly every client sends: one line, standard alphabet, padded. One C pass
    # (delete every alphabet byte: what is left must be the padding) proves it, and it
    # decodes as is; the checks below cost 0.47 ms more on a 36 KB photo (issue 36).
    rest = data.translate(None, _B64_STANDARD_BYTES)
    if rest in (b"", b"=", b"==") and data.endswith(rest) and len(data) % 4 == 0 and len(data) > len(rest):
        return binascii.a2b_base64(data)
    data = data.translate(None, _WHITESPACE)  # line breaks of wrapped base64
    if not data:
        raise InvalidBase64Error("The image field is empty.")
    body = data.rstrip(b"=")
    body = _standard_alphabet(body, padding=len(data) - len(body))
    body += b"=" * (-len(body) % 4)
    try:
        return base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError) as err:
        raise InvalidBase64Error(f"The image field is not valid base64 ({err}).") from None


NOT_AN_IMAGE_MESSAGE = "The data is not an image PIL can read (expected JPEG, PNG, ...)."


def _open_checked(data: bytes, max_bytes: int | None, max_pixels: int | None) -> Image.Image:
    """Open (header only: no pixel is decoded) and apply every limit that the
    header alone can decide: bytes, format, pixels, pixels per byte."""
    max_bytes = MAX_IMAGE_BYTES if max_bytes is None else max_bytes
    max_pixels = MAX_IMAGE_PIXELS if max_pixels is None else max_pixels
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise NotAnImageError("Expected image bytes.")
    if len(data) == 0:
        raise NotAnImageError("The image is empty (0 bytes).")
    if len(data) > max_bytes:
        raise ImageTooLargeError(f"The image is {len(data)} bytes; the limit is {max_bytes}.")
    img = Image.open(io.BytesIO(bytes(data)), formats=_OPENERS)
    width, height = img.size
    pixels = width * height
    if width <= 0 or height <= 0:
        raise NotAnImageError("The image has zero width or height.")
    if pixels > max_pixels:
        raise ImageTooLargeError(
            f"The image is {width}x{height} = {pixels} pixels; "
            f"the limit is {max_pixels} (a possible decompression bomb)."
        )
    if img.format not in ("JPEG", "MPO") and pixels > min(RATIO_FREE_PIXELS, max_pixels) \
            and pixels > MAX_PIXELS_PER_BYTE * len(data):
        raise ImageTooLargeError(
            f"The image is {width}x{height} = {pixels} pixels in only {len(data)} bytes "
            f"({pixels / len(data):.0f} pixels per byte); an image over {RATIO_FREE_PIXELS} pixels must carry "
            f"at least one byte per {MAX_PIXELS_PER_BYTE} pixels (decoding costs CPU per pixel). "
            "Save it as JPEG or make it smaller."
        )
    return img


def _decode_errors(fn):
    """Run ``fn`` (which opens/decodes untrusted bytes) and turn whatever a
    decoder raises into an ImageDecodeError with a sentence."""
    try:
        with warnings.catch_warnings():
            # PIL warns (and raises past 2x) on its own global bomb limit; we
            # apply our own explicit limits instead.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return fn()
    except ImageDecodeError:
        raise
    except Image.DecompressionBombError:
        raise ImageTooLargeError("The image declares too many pixels (a possible decompression bomb).") from None
    except UnidentifiedImageError:
        raise NotAnImageError(NOT_AN_IMAGE_MESSAGE) from None
    except (OSError, SyntaxError, EOFError) as err:
        text = str(err).lower()
        if "truncated" in text or "broken data stream" in text or isinstance(err, EOFError) or "end of file" in text:
            raise TruncatedImageError("The image is truncated: the file ends before all its pixels.") from None
        raise NotAnImageError(f"The image could not be decoded: {err}") from None
    except Exception as err:  # whatever else a decoder raises on hostile bytes
        raise NotAnImageError(f"The image could not be decoded: {type(err).__name__}") from None


def check_image_header(data: bytes, max_bytes: int | None = None,
                       max_pixels: int | None = None) -> tuple[str, tuple[int, int]]:
    """The cheap check: (format, (width, height)) from the header alone, with
    every limit ``load_image`` applies before decoding. For a front end (the
    Flask page) that forwards the bytes to a model server that decodes them:
    refuses non-images and bombs without spending a decode of its own. A
    truncated body is only found by decoding (the model server says so)."""
    img = _decode_errors(lambda: _open_checked(data, max_bytes, max_pixels))
    return img.format, img.size


def load_image(data: bytes, max_bytes: int | None = None, max_pixels: int | None = None,
               draft_size: int | None = None) -> Image.Image:
    """Untrusted encoded image bytes → fully decoded, upright RGB ``PIL.Image``.

    Checks the byte size first, then the declared pixel count from the header
    (cheap: nothing is decoded yet), then decodes everything so truncation is
    caught here rather than later. ``draft_size``: a JPEG is decoded straight
    to the smallest of 1/1, 1/2, 1/4, 1/8 scale that keeps both sides at least
    this long (its DCT allows it; far less CPU and memory). The EXIF
    orientation is applied, as browsers do."""
    def decode():
        img = _open_checked(data, max_bytes, max_pixels)
        if draft_size and img.format in ("JPEG", "MPO"):
            img.draft("RGB", (draft_size, draft_size))
        img.load()  # the first frame of an animation: nothing else is read
        img = ImageOps.exif_transpose(img)  # phone photos stored sideways
        return _to_rgb(img)

    return _decode_errors(decode)


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


# JPEGs are decoded to at least twice the model's input (load_image's
# draft_size), then resized like torchvision: a 40 MP photo costs what a
# 1 MP one does, and the result stays within ~1 % of decoding every pixel.
DRAFT_SIZE = 2 * INPUT_SIZE


def preprocess(data: bytes | Image.Image, **limits) -> np.ndarray:
    """Encoded image bytes (or a PIL image) → float32 [3, 224, 224]."""
    limits.setdefault("draft_size", DRAFT_SIZE)
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
