"""Hypothesis strategies for hostile image uploads (shared by the fuzz tests).

What a stranger can send where the lab expects "a JPEG or PNG":

* random bytes, empty bytes, a few bytes of a real magic number;
* a real image in any format/mode PIL writes (palette, CMYK, 16-bit,
  float, alpha, greyscale, bilevel; PNG, JPEG, GIF, TIFF, BMP, WebP, ICO,
  TGA, PPM, JPEG 2000, ...), animated GIF/PNG/WebP included;
* such an image damaged: truncated, bytes overwritten, magic replaced,
  garbage appended or inserted;
* such an image whose header declares huge (or zero) dimensions while the
  payload stays tiny, with checksums fixed so the header still parses
  (the decompression-bomb pattern).

``hostile_images()`` mixes all of them; ``SETTINGS`` holds the hypothesis
profiles (``SERVELAB_FUZZ=long`` selects the long one for ``make fuzz``).
"""

from __future__ import annotations

import io
import os
import struct
import zlib

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from PIL import Image

# --------------------------------------------------------------------------
# Profiles. Not loaded globally (other test modules keep their own settings):
# tests apply ``fuzz_settings()`` as a decorator.
# --------------------------------------------------------------------------

_COMMON = dict(
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture],
    derandomize=False,
    print_blob=True,
)
settings.register_profile("servelab-quick", max_examples=150, deadline=10_000, **_COMMON)
settings.register_profile("servelab-long", max_examples=3000, deadline=20_000, **_COMMON)

PROFILE = "servelab-long" if os.environ.get("SERVELAB_FUZZ", "").lower() == "long" else "servelab-quick"


def fuzz_settings(scale: float = 1.0, **overrides):
    """The active profile, with ``max_examples`` scaled (HTTP fuzzing is
    slower per case than in-process decoding)."""
    base = settings.get_profile(PROFILE)
    n = max(10, int(base.max_examples * scale))
    return settings(base, max_examples=n, **overrides)


# --------------------------------------------------------------------------
# Real images in many formats and modes
# --------------------------------------------------------------------------

# Formats PIL can write here, each with the modes it accepts (checked against
# pillow 13: every pair below saves and reopens).
FORMAT_MODES: dict[str, tuple[str, ...]] = {
    "PNG": ("1", "L", "LA", "P", "PA", "RGB", "RGBA", "I;16", "I"),
    "JPEG": ("L", "RGB", "CMYK", "YCbCr"),
    "GIF": ("L", "P", "RGB"),
    "TIFF": ("1", "L", "LA", "P", "RGB", "RGBA", "CMYK", "YCbCr", "LAB", "I", "I;16", "F"),
    "BMP": ("1", "L", "P", "RGB", "RGBA"),
    "WEBP": ("RGB", "RGBA"),
    "ICO": ("RGBA", "RGB"),
    "PPM": ("1", "L", "RGB", "I;16"),
    "TGA": ("L", "LA", "P", "RGB", "RGBA"),
    "JPEG2000": ("L", "RGB", "RGBA"),
    "PCX": ("1", "L", "P", "RGB"),
    "SGI": ("L", "RGB", "RGBA"),
    "IM": ("L", "P", "RGB", "CMYK", "F", "I"),
    "QOI": ("RGB", "RGBA"),
    "DDS": ("RGB", "RGBA"),
}
MULTI_FRAME = ("GIF", "PNG", "WEBP", "TIFF")
# What a phone, a browser or a photo editor hands a student: these must be
# classified. The others may be classified or refused with a clean 400 (a
# service may well restrict PIL to an allowlist of formats).
COMMON_FORMATS = ("JPEG", "PNG", "GIF", "BMP", "WEBP", "TIFF")
TIFF_COMPRESSION = (None, "raw", "tiff_lzw", "tiff_adobe_deflate", "packbits")


def _pixels(mode: str, w: int, h: int, seed: int, pattern: str) -> Image.Image:
    rng = np.random.default_rng(seed)
    if pattern == "solid":
        if mode in ("P", "PA"):
            return Image.new("RGB", (w, h), tuple(int(x) for x in rng.integers(0, 256, 3))).convert(mode)
        if mode in ("I", "I;16", "F", "1", "L"):
            return Image.new(mode, (w, h), int(rng.integers(0, 2 if mode == "1" else 255)))
        return Image.new(mode, (w, h))
    # noise: build RGBA noise, convert into the mode
    if mode in ("I;16",):
        return Image.fromarray(rng.integers(0, 65536, (h, w), dtype=np.uint16))          # mode I;16
    if mode == "I":
        return Image.fromarray(rng.integers(-(2 ** 31), 2 ** 31 - 1, (h, w), dtype=np.int32))  # mode I
    if mode == "F":
        arr = rng.normal(0, 1e3, (h, w)).astype(np.float32)
        if seed % 5 == 0:
            arr.flat[0] = np.nan  # NaN/inf pixels are legal in float TIFF/IM
        if seed % 7 == 0:
            arr.flat[-1] = np.inf
        return Image.fromarray(arr)  # mode F
    rgba = Image.fromarray(rng.integers(0, 256, (h, w, 4), dtype=np.uint8), mode="RGBA")
    if mode in ("P", "PA"):
        return rgba.convert("RGB").convert("P", palette=Image.Palette.ADAPTIVE, colors=int(rng.integers(2, 257))) \
            if mode == "P" else rgba.convert("PA")
    return rgba.convert(mode)


def encode(img: Image.Image, fmt: str, frames: list[Image.Image] | None = None, **kw) -> bytes:
    buf = io.BytesIO()
    if frames:
        img.save(buf, fmt, save_all=True, append_images=frames, **kw)
    else:
        img.save(buf, fmt, **kw)
    return buf.getvalue()


@st.composite
def valid_images(draw, max_side: int = 48, formats: tuple[str, ...] | None = None) -> bytes:
    """A well-formed image: any writable format (or one of ``formats``) and
    mode, maybe animated."""
    fmt = draw(st.sampled_from(sorted(formats or FORMAT_MODES)))
    mode = draw(st.sampled_from(FORMAT_MODES[fmt]))
    w = draw(st.integers(1, max_side))
    h = draw(st.integers(1, max_side))
    if fmt == "ICO":
        w = h = max(w, 16)
    if fmt == "DDS":
        w, h = max(4, w - w % 4), max(4, h - h % 4)
    seed = draw(st.integers(0, 2 ** 32 - 1))
    pattern = draw(st.sampled_from(["noise", "solid"]))
    img = _pixels(mode, w, h, seed, pattern)
    kw: dict = {}
    frames = None
    if fmt == "JPEG":
        kw = {"quality": draw(st.integers(1, 100)), "progressive": draw(st.booleans())}
    elif fmt == "TIFF":
        comp = draw(st.sampled_from(TIFF_COMPRESSION))
        if comp:
            kw["compression"] = comp
    elif fmt == "PNG" and mode == "P" and draw(st.booleans()):
        kw["transparency"] = 0  # palette entry 0 transparent
    if fmt in MULTI_FRAME and mode not in ("I", "I;16", "F", "LAB") and draw(st.integers(0, 3)) == 0:
        n = draw(st.integers(1, 4))
        frames = [_pixels(mode, w, h, seed + i + 1, "noise") for i in range(n)]
        if fmt in ("GIF", "PNG", "WEBP"):
            kw["duration"] = draw(st.integers(0, 200))
            kw["loop"] = 0
    try:
        return encode(img, fmt, frames, **kw)
    except (OSError, ValueError, KeyError, TypeError):
        # a format/option pair this PIL build cannot write: plain PNG instead
        return encode(img.convert("RGBA") if img.mode not in ("RGB", "RGBA", "L") else img, "PNG")


# --------------------------------------------------------------------------
# Damage
# --------------------------------------------------------------------------

MAGICS = [b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff\xe0", b"GIF89a", b"GIF87a", b"II*\x00", b"MM\x00*",
          b"BM", b"RIFF\x00\x00\x00\x00WEBP", b"\x00\x00\x01\x00", b"P6\n", b"\x00\x00\x00\x0cjP  ",
          b"qoif", b"DDS ", b"%PDF-1.4", b"8BPS", b"\x00\x00\x00\x00"]


@st.composite
def damaged_images(draw) -> bytes:
    data = bytearray(draw(valid_images()))
    how = draw(st.sampled_from(["truncate", "overwrite", "magic", "append", "insert", "zero_tail"]))
    if how == "truncate":
        return bytes(data[: draw(st.integers(0, max(0, len(data) - 1)))])
    if how == "overwrite":
        for _ in range(draw(st.integers(1, 8))):
            pos = draw(st.integers(0, len(data) - 1))
            data[pos] = draw(st.integers(0, 255))
        return bytes(data)
    if how == "magic":
        magic = draw(st.sampled_from(MAGICS))
        return magic + bytes(data[len(magic):])
    if how == "append":
        return bytes(data) + draw(st.binary(min_size=1, max_size=512))
    if how == "insert":
        pos = draw(st.integers(0, len(data)))
        return bytes(data[:pos]) + draw(st.binary(min_size=1, max_size=64)) + bytes(data[pos:])
    cut = draw(st.integers(0, len(data) - 1))
    return bytes(data[:cut]) + b"\x00" * (len(data) - cut)


# --------------------------------------------------------------------------
# Lying headers: tiny payload, huge (or zero) declared dimensions
# --------------------------------------------------------------------------

DIMENSIONS = st.one_of(
    st.sampled_from([0, 1, 2, 6324, 6325, 10_000, 30_000, 65_535, 65_536, 2 ** 24, 2 ** 31 - 1]),
    st.integers(0, 70_000),
)


def png_with_size(w: int, h: int, color_type: int = 2, bit_depth: int = 8, idat: bytes | None = None) -> bytes:
    """A PNG whose IHDR says ``w`` x ``h`` (valid CRCs) over a tiny IDAT."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", w & 0xFFFFFFFF, h & 0xFFFFFFFF, bit_depth, color_type, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64) if idat is None else idat
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _patch_gif(data: bytearray, w: int, h: int) -> bytes:
    w, h = min(w, 65535), min(h, 65535)
    data[6:10] = struct.pack("<HH", w, h)             # logical screen
    i = data.find(b"\x2c", 13)                        # first image descriptor
    if i > 0 and i + 9 <= len(data):
        data[i + 5:i + 9] = struct.pack("<HH", w, h)
    return bytes(data)


def _patch_bmp(data: bytearray, w: int, h: int, flip: bool) -> bytes:
    w, h = min(w, 2 ** 31 - 1), min(h, 2 ** 31 - 1)
    data[18:26] = struct.pack("<ii", w, -h if flip else h)
    return bytes(data)


def _patch_jpeg(data: bytearray, w: int, h: int) -> bytes:
    w, h = min(w, 65535), min(h, 65535)
    for marker in (b"\xff\xc0", b"\xff\xc2", b"\xff\xc1"):
        i = data.find(marker)
        if i > 0 and i + 9 <= len(data):
            data[i + 5:i + 9] = struct.pack(">HH", h, w)
            break
    return bytes(data)


def _patch_tiff(data: bytearray, w: int, h: int) -> bytes:
    if data[:4] != b"II*\x00":
        return bytes(data)
    (ifd,) = struct.unpack_from("<I", data, 4)
    (n,) = struct.unpack_from("<H", data, ifd)
    for k in range(n):
        off = ifd + 2 + 12 * k
        tag = struct.unpack_from("<H", data, off)[0]
        if tag in (256, 257):  # ImageWidth, ImageLength → LONG
            struct.pack_into("<HHII", data, off, tag, 4, 1, (w if tag == 256 else h) & 0xFFFFFFFF)
    return bytes(data)


@st.composite
def lying_headers(draw) -> bytes:
    w, h = draw(DIMENSIONS), draw(DIMENSIONS)
    kind = draw(st.sampled_from(["png", "gif", "bmp", "jpeg", "tiff"]))
    if kind == "png":
        color_type, depth = draw(st.sampled_from([(0, 1), (0, 8), (0, 16), (2, 8), (2, 16), (3, 8),
                                                  (4, 8), (6, 8), (6, 16)]))
        return png_with_size(w, h, color_type, depth)
    small = Image.new("RGB", (8, 8), (200, 30, 30))
    if kind == "gif":
        return _patch_gif(bytearray(encode(small.convert("P"), "GIF")), w, h)
    if kind == "bmp":
        return _patch_bmp(bytearray(encode(small, "BMP")), w, h, draw(st.booleans()))
    if kind == "jpeg":
        return _patch_jpeg(bytearray(encode(small, "JPEG", progressive=draw(st.booleans()))), w, h)
    return _patch_tiff(bytearray(encode(small, "TIFF")), w, h)


def random_bytes() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.just(b""),
        st.binary(max_size=2048),
        st.builds(lambda m, tail: m + tail, st.sampled_from(MAGICS), st.binary(max_size=256)),
    )


def hostile_images() -> st.SearchStrategy[bytes]:
    """Everything above, mixed."""
    return st.one_of(random_bytes(), valid_images(), damaged_images(), lying_headers())


# --------------------------------------------------------------------------
# Inputs the fuzzer found that once escaped servelab.core.food11.load_image as an
# exception other than ImageDecodeError (a 500 in every service).
# --------------------------------------------------------------------------

def _dds_with_pixel_format_flags(flags: int, fourcc: bytes | None = None) -> bytes:
    data = bytearray(encode(Image.new("RGB", (8, 8)), "DDS"))
    data[80:84] = flags.to_bytes(4, "little")   # DDS_PIXELFORMAT.dwFlags
    if fourcc is not None:
        data[84:88] = fourcc                    # DDS_PIXELFORMAT.dwFourCC
    return bytes(data)


def _gif_with_dangling_image_separator() -> bytes:
    data = encode(Image.new("RGB", (8, 6), (200, 10, 10)).convert("P"), "GIF")
    return data[:-1] + b","  # the ';' trailer replaced by an image separator with no descriptor


def _tiff_with_bad_second_frame(compression: int = 0) -> bytes:
    """A valid one-frame TIFF whose next-IFD pointer leads to a second frame
    with an unknown compression code (PIL raises KeyError counting frames)."""
    data = bytearray(encode(Image.new("RGB", (8, 8)), "TIFF"))
    (ifd,) = struct.unpack_from("<I", data, 4)
    (n,) = struct.unpack_from("<H", data, ifd)
    next_ptr = ifd + 2 + 12 * n
    offset = len(data) + len(data) % 2
    data += b"\0" * (offset - len(data))
    entries = [(256, 3, 1, 8), (257, 3, 1, 8), (259, 3, 1, compression)]  # width, height, compression
    data += struct.pack("<H", len(entries))
    data += b"".join(struct.pack("<HHIHH", tag, typ, count, value, 0) for tag, typ, count, value in entries)
    data += b"\0\0\0\0"
    struct.pack_into("<I", data, next_ptr, offset)
    return bytes(data)


FINDINGS: dict[str, bytes] = {
    "tiff-second-frame-unknown-compression": _tiff_with_bad_second_frame(0),   # KeyError
    "dds-unknown-pixel-format-flags": _dds_with_pixel_format_flags(0),         # NotImplementedError
    "dds-unknown-fourcc": _dds_with_pixel_format_flags(4, b"ZZZZ"),            # NotImplementedError
    "gif-dangling-image-separator": _gif_with_dangling_image_separator(),      # struct.error
}


def expected_status(data: bytes) -> int:
    """What a service must answer for ``data``: 200 if servelab.core.food11 decodes
    it (e.g. a TIFF whose broken second frame is never read), else the
    decoder error's own 4xx status. Never a 5xx."""
    from servelab.core import food11

    try:
        food11.load_image(data)
    except food11.ImageDecodeError as err:
        return err.status
    return 200
