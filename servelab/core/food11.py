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
import functools
import io
import os
import re
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
# are decoded at reduced size (see load_image's draft_size), which is cheap,
# and their scans are bounded instead (MAX_JPEG_SCANS, MAX_JPEG_PASSES below).
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
# A JPEG's structure, read before anything is decoded
# --------------------------------------------------------------------------
#
# A JPEG is a list of marker segments (0xFF, a code, a 2-byte length, the body); after each
# SOS (start of scan, 0xFFDA) header comes entropy-coded data, which runs to the next 0xFF
# that is not a stuffed 0xFF00, a fill 0xFF or a restart marker (0xFFD0-0xFFD7). A progressive
# JPEG sends its picture in several scans, and libjpeg decodes every scan over every 8x8 block
# it covers, however few bytes the scan has: a 6000x6600 grey JPEG whose 61-byte last scan is
# repeated 2,000 times (277 KB) took 88 s of CPU here, decoded at 1/8 scale or not (issue 48).
# Photos are far from that: libjpeg's (and so Pillow's) progressive JPEG has 10 scans (6 grey,
# 18 CMYK) that go over the picture's blocks 4.7-6 times in all; mozjpeg keeps a subset of its
# 64 candidate scans (luma refined in up to 3 more steps, so a few passes more at most). Over
# either limit below the image is refused before decoding; at the limits a 40-megapixel scan
# bomb costs ~0.7 s here, near what a 40-megapixel progressive photo does (0.55 s).
MAX_JPEG_SCANS = int(os.environ.get("SERVELAB_MAX_JPEG_SCANS", 64))
MAX_JPEG_PASSES = int(os.environ.get("SERVELAB_MAX_JPEG_PASSES", 16))
# Walking the segments is a Python loop, and Pillow reads those before the first scan in Python
# too, byte by byte between segments (8 MB of junk after APP0: 0.9 s of CPU; 100,000 empty
# comments: 0.15 s). A photo has a few dozen segments and no junk.
MAX_JPEG_SEGMENTS = 1000
MAX_JPEG_JUNK_BYTES = 64 * 1024

_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}   # frame headers (0xC4 DHT, 0xCC DAC)
_PROGRESSIVE_SOF = frozenset({0xC2, 0xC6, 0xCA, 0xCE})
_NO_LENGTH = frozenset({0x01, *range(0xD0, 0xD8)})                   # TEM, RST0-7: a code and nothing else
_NEXT_MARKER = re.compile(rb"\xff[^\x00\xff]")                      # between segments: as libjpeg looks
_END_OF_SCAN = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")              # in a scan: restarts are part of it
# Put in place of the end marker of a one-scan JPEG (see _open_checked). libjpeg-turbo reads up
# to 57 bits ahead of the bits it decodes: 8 bytes is the least with which every whole scan
# tried here decoded; 16 for a margin (a cut scan then gets at most 128 zero bits to use up).
_JPEG_PAD = b"\x00" * 16


@dataclass(frozen=True)
class JpegLayout:
    """What the segments of a JPEG say. ``scans``: (component ids, Ss, Se, Al) per SOS;
    ``scan_end``: where the entropy-coded data of the last scan stops at a marker (None when
    the data ends inside it)."""

    sof: int | None
    blocks: dict[int, int]
    scans: tuple[tuple[tuple[int, ...], int, int, int], ...]
    scan_end: int | None

    def missing_part(self) -> str | None:
        """What part of the picture no scan carries (a file cut short, then given an end marker),
        or None when every component's every coefficient arrives in full (or this is a kind of
        JPEG this check does not judge: lossless, hierarchical, no frame or no scan)."""
        if self.sof not in (0xC0, 0xC1, 0xC2, 0xC9, 0xCA) or not self.scans or not self.blocks:
            return None
        if self.sof not in _PROGRESSIVE_SOF:  # sequential: every component in some scan
            sent = {c for comps, *_ in self.scans for c in comps}
            lost = [c for c in self.blocks if c not in sent]
            return f"component {lost[0]} has no scan" if lost else None
        # progressive: every coefficient (0 the DC, 1-63 the AC) down to its last bit (Al = 0)
        low = {c: [99] * 64 for c in self.blocks}
        for comps, ss, se, al in self.scans:
            for c in comps:
                row = low.get(c)
                for k in range(ss, min(se, 63) + 1) if row else ():
                    row[k] = min(row[k], al)
        for c, row in low.items():
            if any(row):
                return f"component {c} lacks {sum(1 for a in row if a)} of its 64 coefficients or their last bits"
        return None

    def one_sequential_scan(self) -> bool:
        """A baseline (or extended) Huffman JPEG in one scan of every component, whose data
        stops at a marker: what :func:`_open_checked` decodes without its end marker."""
        return (self.sof in (0xC0, 0xC1) and len(self.scans) == 1 and self.scan_end is not None
                and set(self.scans[0][0]) == set(self.blocks))


def _jpeg_blocks(frame: bytes) -> dict[int, int]:
    """Component id → its 8x8 blocks, from an SOFn body (P, Y, X, Nf, then Nf x (id, HV, Tq)):
    a component sampled at h/hmax across and v/vmax down covers that share of the picture."""
    height, width, count = int.from_bytes(frame[1:3], "big"), int.from_bytes(frame[3:5], "big"), frame[5]
    if count == 0 or len(frame) < 6 + 3 * count:
        return {}
    comps = [(frame[6 + 3 * i], frame[7 + 3 * i] >> 4, frame[7 + 3 * i] & 15) for i in range(count)]
    hmax, vmax = max(h for _, h, _ in comps) or 1, max(v for _, _, v in comps) or 1

    def ceil(a: int, b: int) -> int:
        return -(-a // b)
    return {cid: ceil(ceil(width * h, hmax), 8) * ceil(ceil(height * v, vmax), 8) for cid, h, v in comps}


def jpeg_layout(data: bytes, max_scans: int | None = None, max_passes: int | None = None) -> JpegLayout | None:
    """Walk a JPEG's marker segments up to its end marker, decoding nothing, and refuse (413)
    a structure out of proportion to a photo: too many scans, scans that go over the picture's
    blocks too many times, too many segments or too much junk between them. None when ``data``
    is not a JPEG (the decoder judges what the walk cannot read)."""
    max_scans = MAX_JPEG_SCANS if max_scans is None else max_scans
    max_passes = MAX_JPEG_PASSES if max_passes is None else max_passes
    if data[:3] != b"\xff\xd8\xff":
        return None
    sof, blocks, scans, scan_end = None, {}, [], None
    pos, segments, junk, work, size = 2, 0, 0, 0, len(data)
    while pos < size:
        found = _NEXT_MARKER.search(data, pos)
        if found is None:
            break
        junk += found.start() - pos - data.count(b"\xff", pos, found.start())   # fill 0xFF bytes are allowed
        marker, pos = data[found.start() + 1], found.start() + 2
        segments += 1
        if segments > MAX_JPEG_SEGMENTS or junk > MAX_JPEG_JUNK_BYTES:
            what = (f"more than {MAX_JPEG_SEGMENTS} marker segments" if segments > MAX_JPEG_SEGMENTS
                    else f"more than {MAX_JPEG_JUNK_BYTES} bytes outside its segments")
            raise ImageTooLargeError(f"The JPEG has {what} (a photo has a few dozen segments and nothing "
                                     "between them); reading it would cost CPU out of proportion to a photo.")
        if marker in (0xD8, 0xD9):   # a second start (the decoder refuses it), or the end
            break
        if marker in _NO_LENGTH:
            continue
        length = int.from_bytes(data[pos:pos + 2], "big")
        if length < 2 or pos + length > size:
            break
        body, pos = data[pos + 2:pos + length], pos + length
        if marker in _SOF_MARKERS and sof is None and len(body) >= 6:
            sof, blocks = marker, _jpeg_blocks(body)
        elif marker == 0xDA and body:
            comps = tuple(body[1 + 2 * i] for i in range(min(body[0], (len(body) - 1) // 2)))
            tail = body[1 + 2 * len(comps):]
            ss, se, al = (tail[0], tail[1], tail[2] & 15) if len(tail) >= 3 else (0, 63, 0)
            scans.append((comps, ss, se, al))
            work += sum(blocks.get(c, 0) for c in comps)
            if len(scans) > max_scans:
                raise ImageTooLargeError(
                    f"The JPEG has more than {max_scans} scans (a progressive photo has about 10): each scan is "
                    "decoded over the whole picture, so this file would cost CPU out of proportion to its size.")
            total = sum(blocks.values())
            if total and work > max_passes * total:
                raise ImageTooLargeError(
                    f"The JPEG's scans go over its {total} blocks of 8x8 pixels more than {max_passes} times "
                    "(a progressive photo: 5 or 6); decoding it would cost CPU out of proportion to a photo.")
            end = _END_OF_SCAN.search(data, pos)
            scan_end = end.start() if end else None
            if end is None:
                break
            pos = end.start()
    return JpegLayout(sof, blocks, tuple(scans), scan_end)


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
    header alone can decide: bytes, format, a JPEG's structure, pixels, pixels per byte."""
    max_bytes = MAX_IMAGE_BYTES if max_bytes is None else max_bytes
    max_pixels = MAX_IMAGE_PIXELS if max_pixels is None else max_pixels
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise NotAnImageError("Expected image bytes.")
    if len(data) == 0:
        raise NotAnImageError("The image is empty (0 bytes).")
    if len(data) > max_bytes:
        raise ImageTooLargeError(f"The image is {len(data)} bytes; the limit is {max_bytes}.")
    data = bytes(data)
    jpeg = jpeg_layout(data)  # scans and segments counted; refused here if out of proportion to a photo
    missing = jpeg.missing_part() if jpeg else None
    if missing:
        raise TruncatedImageError(f"The image is truncated: its data ends before all its pixels ({missing}).")
    if jpeg and jpeg.one_sequential_scan():
        # A JPEG cut short and given its end marker back decodes without an error: libjpeg fills
        # the missing blocks from zero bits (issue 48: rice_plate.jpg[:1000] + FFD9 was called
        # "Bread"). So a one-scan JPEG (what cameras and most encoders write) is decoded from its
        # scan followed by zero bytes instead of the end marker: a whole scan never reads them
        # (the same pixels, bit for bit), a cut one runs out of data and is reported truncated.
        data = data[:jpeg.scan_end] + _JPEG_PAD
    img = Image.open(io.BytesIO(data), formats=_OPENERS)
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


def plain_jpeg(data: bytes, max_bytes: int | None = None, max_pixels: int | None = None) -> bool:
    """Every check ``load_image`` makes before decoding (an ImageDecodeError as it raises), then
    whether ``data`` is a JPEG another decoder can take as it is (nvJPEG on a GPU: the
    food_preprocess model): one frame (not MPO), greyscale or YCbCr (not CMYK), and upright (no
    EXIF rotation to apply; torchvision applies one only on the CPU). Anything else goes to
    :func:`load_image`, which handles every case."""
    img = _decode_errors(lambda: _open_checked(data, max_bytes, max_pixels))
    if img.format != "JPEG" or img.mode not in ("L", "RGB"):
        return False
    try:
        return img.getexif().get(0x0112, 1) == 1   # 0x0112: EXIF Orientation (1: as stored)
    except Exception:  # an EXIF block PIL cannot read: load_image judges the image
        return False


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
        ImageOps.exif_transpose(img, in_place=True)  # phone photos stored sideways (in place: no full copy)
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
        grey = src.point(lambda x: x * scale - lo * scale, "L") if src.mode == "I" else \
            src.point(lambda x: x * scale - lo * scale).convert("L")
        del src  # the 32-bit copy goes before the RGB result is made
        return grey.convert("RGB")
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
    if isinstance(data, Image.Image):
        return preprocess_image(data)
    img = load_image(data, **limits)
    pixels = img.width * img.height
    out = preprocess_image(img)
    del img
    if pixels >= _TRIM_PIXELS:
        _give_back_freed_memory()
    return out


# A large decode frees tens of MB; glibc keeps freed memory in its heaps for reuse, and while
# decodes overlap on many threads those heaps fragment and grow (fastapi_onnx, 2 MP 16-bit
# uploads 16 at a time: +57-81 MB per burst, and 48 MB kept after four bursts; with this,
# +30-43 MB and nothing kept). malloc_trim(0) hands the free pages back: ~10 us, after a
# decode that took tens of ms.
_TRIM_PIXELS = 1_000_000


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or a no-op where the C library is not glibc (macOS, musl)."""
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return lambda pad: 0


def _give_back_freed_memory() -> None:
    _malloc_trim()(0)


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


@dataclass(frozen=True)
class ModelInfo:
    """What model file answers: every service's /health and every prediction say it."""
    name: str
    path: str
    version: str
    weights_kind: str

    @property
    def note(self) -> str:
        if self.weights_kind == "demo":
            return DEMO_WEIGHTS_NOTE
        if self.weights_kind == "trained":
            return "trained Food-11 weights"
        return "weights of unknown origin (no build stamp beside the model file)"

    def response_fields(self) -> dict:
        """What every prediction carries besides label and probability."""
        return {"model": self.name, "model_version": self.version,
                "weights_kind": self.weights_kind, "note": self.note}


def model_info(path: str | os.PathLike, name: str = "food11") -> ModelInfo:
    """Name, version (first 12 hex digits of the file's sha256, as recorded in
    its build stamp) and weights kind of a model artifact."""
    import hashlib
    import json

    version = None
    try:
        with open(f"{os.fspath(path)}.json", encoding="utf-8") as f:
            version = str(json.load(f).get("sha256", ""))[:12] or None
    except (OSError, ValueError, AttributeError):
        pass
    if version is None:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        version = h.hexdigest()[:12]
    return ModelInfo(name=name, path=os.fspath(path), version=version, weights_kind=weights_kind(path))

