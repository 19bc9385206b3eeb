"""servelab.core.food11: the contract every service shares."""

from __future__ import annotations

import base64
import io
import re
import struct
import zlib

import numpy as np
import pytest
from PIL import Image, ImageFile

from servelab.core import food11
from tests.services.helpers import scan_bomb_jpeg, truncated_jpeg_with_end


def _encode(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def test_labels_in_lab_order():
    assert food11.LABELS == (
        "Bread", "Dairy product", "Dessert", "Egg", "Fried food", "Meat",
        "Noodles/Pasta", "Rice", "Seafood", "Soup", "Vegetable/Fruit",
    )
    assert food11.NUM_CLASSES == 11


def test_preprocess_matches_torchvision_pipeline(sample_paths):
    """The numpy pipeline equals Resize((224,224)) -> ToTensor -> Normalize."""
    from torchvision import transforms

    tv = transforms.Compose([
        transforms.Resize((224, 224)),
        transforms.ToTensor(),
        transforms.Normalize(food11.MEAN.tolist(), food11.STD.tolist()),
    ])
    worst = 0.0
    for path in sample_paths:
        img = food11.load_image(path.read_bytes())
        ours = food11.preprocess_image(img)
        ref = tv(img).numpy()
        assert ours.shape == (3, 224, 224) and ours.dtype == np.float32
        worst = max(worst, float(np.abs(ours - ref).max()))
    print(f"max |numpy - torchvision| over {len(sample_paths)} sample images: {worst:.2e}")
    assert worst <= 1e-5


def test_preprocess_batch_shape_and_order(sample_paths):
    data = [p.read_bytes() for p in sample_paths[:3]]
    batch = food11.preprocess_batch(data)
    assert batch.shape == (3, 3, 224, 224)
    np.testing.assert_array_equal(batch[1], food11.preprocess(data[1]))
    assert food11.preprocess_batch([]).shape == (0, 3, 224, 224)


def test_softmax_is_stable_and_normalised():
    logits = np.array([[1000.0, -1000.0, 0.0] + [0.0] * 8, [-1000.0] * 11, [1e-9] * 11])
    p = food11.softmax(logits)
    assert np.all(np.isfinite(p))
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-12)
    assert p[0, 0] == pytest.approx(1.0)
    np.testing.assert_allclose(p[1], 1 / 11)
    # Softmax is shift-invariant: the stable form must not change values.
    x = np.random.default_rng(0).normal(size=(4, 11))
    np.testing.assert_allclose(food11.softmax(x), food11.softmax(x + 500.0), atol=1e-12)
    naive = np.exp(x) / np.exp(x).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(food11.softmax(x), naive, atol=1e-12)


def test_top1_label_and_probability():
    logits = np.zeros((2, 11))
    logits[0, 3] = 5.0
    logits[1, 9] = 2.0
    preds = food11.predict_from_logits(logits)
    assert [p.label for p in preds] == ["Egg", "Soup"]
    assert preds[0].probability == pytest.approx(np.exp(5) / (np.exp(5) + 10))
    assert preds[0].as_dict() == {"prediction": "Egg", "probability": preds[0].probability}
    with pytest.raises(ValueError):
        food11.top1(np.zeros((1, 10)))


# ---- decode guards -------------------------------------------------------

def test_not_an_image():
    with pytest.raises(food11.NotAnImageError) as e:
        food11.load_image(b"this is plain text, not a JPEG")
    assert e.value.status == 400 and e.value.code == "not_an_image"
    with pytest.raises(food11.NotAnImageError):
        food11.load_image(b"")


def test_truncated_jpeg_and_png(sample_paths):
    for path in sample_paths:
        data = path.read_bytes()
        with pytest.raises(food11.ImageDecodeError) as e:
            food11.load_image(data[: len(data) // 2])
        assert isinstance(e.value, (food11.TruncatedImageError, food11.NotAnImageError))
        assert e.value.status == 400
    jpeg = next(p for p in sample_paths if p.suffix == ".jpg").read_bytes()
    with pytest.raises(food11.TruncatedImageError):
        food11.load_image(jpeg[: len(jpeg) * 2 // 3])


def _png_declaring(width: int, height: int) -> bytes:
    """A tiny PNG whose header declares width x height (a decompression bomb's header)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 16)) + chunk(b"IEND", b"")


def test_decompression_bomb_refused_before_decoding():
    with pytest.raises(food11.ImageTooLargeError) as e:
        food11.load_image(_png_declaring(100_000, 100_000))
    assert e.value.status == 413 and "pixels" in str(e.value)


def test_pixel_and_byte_limits_are_configurable():
    img = Image.new("RGB", (300, 300), (10, 200, 30))
    data = _encode(img, "PNG")
    assert food11.load_image(data).size == (300, 300)
    with pytest.raises(food11.ImageTooLargeError):
        food11.load_image(data, max_pixels=300 * 300 - 1)
    with pytest.raises(food11.ImageTooLargeError):
        food11.load_image(data, max_bytes=len(data) - 1)


def test_base64_errors_and_data_urls(sample_paths):
    raw = sample_paths[0].read_bytes()
    b64 = base64.b64encode(raw).decode()
    assert food11.decode_base64(b64) == raw
    assert food11.decode_base64(f"data:image/jpeg;base64,{b64}") == raw
    for bad in ["not base64!!", "abcde", "", "   ", "é" * 8]:   # ("abc" is unpadded base64: accepted)
        with pytest.raises(food11.InvalidBase64Error) as e:
            food11.decode_base64(bad)
        assert e.value.status == 400
    with pytest.raises(food11.InvalidBase64Error):
        food11.decode_base64(12345)  # type: ignore[arg-type]
    with pytest.raises(food11.ImageTooLargeError):
        food11.decode_base64(b64, max_bytes=len(raw) // 2)
    x = food11.preprocess_base64(b64)
    np.testing.assert_array_equal(x, food11.preprocess(raw))


@pytest.mark.parametrize("mode", ["L", "LA", "P", "PA", "RGBA", "CMYK", "I;16", "I", "F", "1"])
def test_every_pil_mode_becomes_rgb(mode):
    rng = np.random.default_rng(1)
    rgb = Image.fromarray(rng.integers(0, 255, (40, 60, 3), dtype=np.uint8), "RGB")
    if mode == "I;16":
        img = Image.fromarray(rng.integers(0, 65535, (40, 60), dtype=np.uint16)).convert("I;16")
    elif mode == "F":
        img = Image.fromarray(rng.normal(size=(40, 60)).astype(np.float32), "F")
    else:
        img = rgb.convert(mode)
    fmt = "TIFF" if mode in ("CMYK", "F", "I", "PA") else "PNG"
    out = food11.load_image(_encode(img, fmt))
    assert out.mode == "RGB" and out.size == (60, 40)
    assert food11.preprocess(out).shape == (3, 224, 224)


def test_transparent_pixels_become_white():
    img = Image.new("RGBA", (8, 8), (255, 0, 0, 0))
    out = food11.load_image(_encode(img, "PNG"))
    assert out.getpixel((0, 0)) == (255, 255, 255)


def test_weights_kind_reads_the_stamp(tmp_path):
    model = tmp_path / "m.onnx"
    assert food11.weights_kind(model) == "unknown"
    (tmp_path / "m.onnx.json").write_text('{"weights_kind": "demo"}')
    assert food11.weights_kind(model) == "demo"


# ---- issue 15: CPU amplification, EXIF, non-images, base64 variants -------

def _flat_png(width: int, height: int) -> bytes:
    return _encode(Image.new("RGB", (width, height), (200, 180, 40)), "PNG", compress_level=9)


def test_extreme_pixels_per_byte_is_refused_before_decoding():
    """A flat PNG declares millions of pixels in a few KB: decoding it costs
    ~0.9 s of CPU at 40 MP against ~3 ms for a photo. Refused from the header."""
    data = _flat_png(3000, 3000)                        # 9 MP in ~30 KB
    assert len(data) * food11.MAX_PIXELS_PER_BYTE < 3000 * 3000
    with pytest.raises(food11.ImageTooLargeError) as e:
        food11.load_image(data)
    assert e.value.status == 413 and e.value.code == "image_too_large"
    assert "per byte" in e.value.message and "3000x3000" in e.value.message
    with pytest.raises(food11.ImageTooLargeError):
        food11.check_image_header(data)                 # the cheap check (no decode) says the same
    # Small images are never refused for compressing well (a flat 1 MP diagram).
    assert food11.load_image(_flat_png(1000, 1000)).size == (1000, 1000)
    # Photos compress far less than MAX_PIXELS_PER_BYTE.
    rng = np.random.default_rng(0)
    noisy = Image.fromarray(rng.integers(0, 255, (1500, 1800, 3), dtype=np.uint8), "RGB")
    assert food11.load_image(_encode(noisy, "PNG")).size == (1800, 1500)


def test_check_image_header_reads_no_pixels(sample_paths, monkeypatch):
    calls = []
    monkeypatch.setattr(Image.Image, "load", lambda self, *a, **k: calls.append(self.size))
    for path in sample_paths:
        fmt, size = food11.check_image_header(path.read_bytes())
        assert fmt in food11.ALLOWED_FORMATS and size[0] > 0 and size[1] > 0
    assert calls == [], "check_image_header decoded pixels"
    with pytest.raises(food11.NotAnImageError):
        food11.check_image_header(b"not an image")
    with pytest.raises(food11.ImageTooLargeError):
        food11.check_image_header(_png_declaring(100_000, 100_000))


def test_big_jpeg_is_decoded_at_reduced_size(monkeypatch):
    """JPEG's DCT can decode straight to 1/2, 1/4 or 1/8 size: preprocess asks
    for the smallest size that still covers twice the model's input."""
    from PIL import JpegImagePlugin

    y, x = np.mgrid[0:3000, 0:4000]
    big = np.stack([(x % 256), (y % 256), ((x + y) // 32 % 256)], axis=-1).astype(np.uint8)
    data = _encode(Image.fromarray(big, "RGB"), "JPEG", quality=90)
    asked = []
    real_draft = JpegImagePlugin.JpegImageFile.draft

    def spy(self, mode, size):
        asked.append(size)
        return real_draft(self, mode, size)

    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", spy)
    x_fast = food11.preprocess(data)
    assert asked and all(s is not None and max(s) <= 2 * food11.INPUT_SIZE for s in asked), asked
    small = food11.load_image(data, draft_size=2 * food11.INPUT_SIZE)
    assert 2 * food11.INPUT_SIZE <= min(small.size) and small.size[0] < 4000, small.size
    # Close to decoding every pixel first (what torchvision would see).
    full = food11.preprocess_image(food11.load_image(data))
    assert x_fast.shape == full.shape and float(np.abs(x_fast - full).mean()) < 0.05


def test_exif_orientation_is_applied():
    """A phone photo stored sideways with EXIF orientation 6 is shown upright
    by every browser; the model must see it upright too."""
    img = Image.new("RGB", (40, 20), (255, 0, 0))
    img.paste((0, 0, 255), (20, 0, 40, 20))            # left red, right blue (as stored)
    exif = Image.Exif()
    exif[0x0112] = 6                                   # Orientation: rotate 90 CW to display
    data = _encode(img, "JPEG", exif=exif.tobytes(), quality=95)
    out = food11.load_image(data)
    assert out.size == (20, 40), "EXIF orientation ignored: the model sees the photo sideways"
    r, g, b = out.getpixel((10, 5))
    assert r > 200 and b < 60, "rotated 90 degrees clockwise, the stored left (red) half is on top"
    r, g, b = out.getpixel((10, 35))
    assert b > 200 and r < 60, "and the stored right (blue) half at the bottom"
    assert food11.preprocess(data).shape == (3, 224, 224)


@pytest.mark.parametrize("kind", ["svg", "heic", "ico", "pdf", "text"])
def test_non_images_get_the_documented_message(kind):
    data = {
        "svg": b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect/></svg>',
        "heic": b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + b"\x00" * 64,
        "ico": _encode(Image.new("RGB", (16, 16)), "ICO"),
        "pdf": b"%PDF-1.4\n1 0 obj<<>>endobj\ntrailer<<>>\n%%EOF\n",
        "text": b"this is plain text, not a JPEG",
    }[kind]
    with pytest.raises(food11.NotAnImageError) as e:
        food11.load_image(data)
    assert e.value.message == "The data is not an image PIL can read (expected JPEG, PNG, ...)."
    assert "KeyError" not in e.value.message


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "GIF", "BMP", "WEBP", "TIFF"])
def test_every_allowed_format_decodes(fmt):
    assert food11.load_image(_encode(Image.new("RGB", (30, 20), (1, 2, 3)), fmt)).size == (30, 20)


def test_base64_variants_users_send(sample_paths):
    import textwrap

    # A sample whose standard base64 ends in '=' padding, so "unpadded" differs.
    raw = next(d for d in (p.read_bytes() for p in sample_paths) if len(d) % 3)
    std = base64.b64encode(raw).decode()
    variants = {
        "line-wrapped (encodebytes)": base64.encodebytes(raw).decode(),
        "line-wrapped CRLF (base64 CLI on Windows)": "\r\n".join(textwrap.wrap(std, 76)),
        "URL-safe": base64.urlsafe_b64encode(raw).decode(),
        "unpadded": std.rstrip("="),
        "URL-safe unpadded": base64.urlsafe_b64encode(raw).decode().rstrip("="),
    }
    for name, text in variants.items():
        assert food11.decode_base64(text) == raw, name


@pytest.mark.parametrize("text,says", [
    ("abc+def-ghi/", "mixes"),                        # both alphabets
    ("abcde", "length"),                              # 5 chars: one is left over
    ("ab=cd", "padding"),                             # '=' inside
    ("abc$", "'$'"),                                  # a stray character, named
])
def test_base64_errors_say_what_is_wrong(text, says):
    with pytest.raises(food11.InvalidBase64Error) as e:
        food11.decode_base64(text)
    assert says in e.value.message, e.value.message


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 300])
def test_canonical_base64_fast_path_matches_the_standard_decoder(n):
    raw = bytes(range(256)) * 2
    raw = raw[:n]
    text = base64.b64encode(raw)
    assert food11.decode_base64(text) == raw == food11.decode_base64(text.decode())


@pytest.mark.parametrize("bad", [b"AB=C", b"====", b"A===", b"QQ=A", b"=QQ=", b"QUJD\x00"])
def test_misplaced_padding_still_gets_its_sentence(bad):
    with pytest.raises(food11.InvalidBase64Error):
        food11.decode_base64(bad)


# ---- A JPEG's structure, read before decoding (issue 48) ----------------------

def _refuse_decoding(monkeypatch) -> list:
    """Every pixel decode of a file is recorded; a refusal from the segments decodes nothing."""
    decoded = []
    real_load = ImageFile.ImageFile.load

    def spy(self):
        decoded.append(self.size)
        return real_load(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", spy)
    return decoded


def test_scan_bomb_is_refused_before_decoding(monkeypatch):
    """A ~40 MP grey progressive JPEG whose last scan is repeated: libjpeg decodes every scan
    over all 618,750 blocks (~44 ms each here), so it is refused from its segments alone, by
    every entry point the services use."""
    bomb = scan_bomb_jpeg()
    decoded = _refuse_decoding(monkeypatch)
    for entry in (food11.load_image, food11.preprocess, food11.check_image_header,
                  lambda data: food11.preprocess_base64(base64.b64encode(data))):
        with pytest.raises(food11.ImageTooLargeError) as e:
            entry(bomb)
        assert e.value.status == 413 and e.value.code == "image_too_large"
        assert "scans" in e.value.message and "618750 blocks" in e.value.message, e.value.message
    assert decoded == []


def test_scan_limits_count_scans_and_passes_over_the_blocks():
    plain = _encode(Image.new("L", (640, 480), 128), "JPEG", progressive=True)  # libjpeg's 6 grey scans
    layout = food11.jpeg_layout(plain)
    assert len(layout.scans) == 6 and layout.blocks == {1: 80 * 60}
    last, end = plain.rindex(b"\xff\xda"), plain.rindex(b"\xff\xd9")
    assert layout.scan_end == end
    ten_more = plain[:end] + plain[last:end] * 10 + plain[end:]   # 16 scans, each over every block
    assert len(food11.jpeg_layout(ten_more).scans) == 16
    with pytest.raises(food11.ImageTooLargeError, match="more than 15 scans"):
        food11.jpeg_layout(ten_more, max_scans=15)
    with pytest.raises(food11.ImageTooLargeError, match="more than 15 times"):
        food11.jpeg_layout(ten_more, max_passes=15)
    eleven_more = plain[:end] + plain[last:end] * 11 + plain[end:]  # 17 passes: over the default 16
    with pytest.raises(food11.ImageTooLargeError):
        food11.load_image(eleven_more)
    assert food11.load_image(ten_more).size == (640, 480)


@pytest.mark.parametrize("mode,options", [
    ("RGB", {"progressive": True}), ("RGB", {"progressive": True, "subsampling": 0, "optimize": True}),
    ("L", {"progressive": True}), ("CMYK", {"progressive": True}), ("RGB", {"restart_marker_rows": 1}),
    ("RGB", {"progressive": True, "restart_marker_blocks": 3}), ("RGB", {"quality": 100, "subsampling": 0}),
])
def test_photos_pass_the_structure_checks_and_decode_unchanged(mode, options):
    """Noise makes the entropy-coded data hold stuffed 0xFF00 bytes (and restart markers where
    asked), which the walk must step over; the pixels are those Pillow decodes by itself."""
    noise = np.random.default_rng(3).integers(0, 256, (301, 402, 3), dtype=np.uint8)
    data = _encode(Image.fromarray(noise).convert(mode), "JPEG", **options)
    layout = food11.jpeg_layout(data)
    assert layout.scan_end == data.rindex(b"\xff\xd9") and layout.missing_part() is None
    assert len(layout.scans) == {"RGB": 10, "L": 6, "CMYK": 18}[mode] if options.get("progressive") else 1
    ours = food11.load_image(data)
    with Image.open(io.BytesIO(data)) as img:
        theirs = img.convert("RGB")
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


def test_many_segments_or_junk_between_them_are_refused(sample_paths):
    """Pillow reads the segments before the first scan in Python, byte by byte between them:
    8 MB of junk after APP0 cost 0.9 s of CPU, 100,000 empty comments 0.15 s."""
    jpeg = next(p for p in sample_paths if p.suffix == ".jpg").read_bytes()
    app0_end = 4 + int.from_bytes(jpeg[4:6], "big")
    comments = jpeg[:2] + b"\xff\xfe\x00\x02" * 2000 + jpeg[2:]          # limits: 1,000 segments,
    junk = jpeg[:app0_end] + b"\x00" * 100_000 + jpeg[app0_end:]          # 64 KiB of junk
    for data, says in ((comments, "marker segments"), (junk, "outside its segments")):
        with pytest.raises(food11.ImageTooLargeError, match=says):
            food11.check_image_header(data)
    few = jpeg[:2] + b"\xff\xfe\x00\x02" * 20 + jpeg[2:app0_end] + b"\x00" * 100 + jpeg[app0_end:]
    assert food11.load_image(few).size == food11.load_image(jpeg).size


def test_jpeg_cut_short_then_given_its_end_marker_is_truncated(sample_paths):
    """libjpeg decodes a JPEG cut short without an error when an end marker follows (it fills
    the rest from zero bits): rice_plate.jpg[:1000] + FFD9 was classified. Cut anywhere, with
    or without reduced-size decoding, it is a 400 truncated_image."""
    assert food11.TruncatedImageError.code == "truncated_image"
    with pytest.raises(food11.TruncatedImageError):
        food11.preprocess(truncated_jpeg_with_end())
    for path in sample_paths:
        if path.suffix != ".jpg":
            continue
        data = path.read_bytes()
        end = data.rindex(b"\xff\xd9")
        for cut in (end // 3, end // 2, end * 9 // 10, end - 64):
            for limits in ({}, {"draft_size": food11.DRAFT_SIZE}):
                with pytest.raises(food11.TruncatedImageError):
                    food11.load_image(data[:cut] + b"\xff\xd9", **limits)
        assert food11.load_image(data).size == Image.open(io.BytesIO(data)).size  # whole: decoded


def test_progressive_jpeg_missing_its_last_scans_is_truncated(sample_paths):
    """A progressive JPEG cut between scans (or inside one) and given an end marker lacks the
    scans that carry the rest of its coefficients: refused from the segments, before decoding."""
    rice = next(p for p in sample_paths if p.name == "rice_plate.jpg")
    data = _encode(Image.open(rice), "JPEG", progressive=True)
    scans = [m.start() for m in re.finditer(rb"\xff\xda", data)]
    assert len(scans) == 10
    for cut in (scans[3], scans[-1], (scans[2] + scans[3]) // 2):
        with pytest.raises(food11.TruncatedImageError, match="coefficients"):
            food11.check_image_header(data[:cut] + b"\xff\xd9")
    assert food11.load_image(data).size == (1024, 768)


_ONE_DECODE = r"""
import io, sys, threading, time
import psutil
from PIL import Image
from servelab.core import food11
pixels = 2_000_000
side = int(pixels ** 0.5)
buf = io.BytesIO()
Image.new("I;16", (side, side), 1000).save(buf, "PNG")   # the costliest upload per pixel
data = buf.getvalue()
food11.preprocess(data, max_pixels=pixels)                # first-call allocations are not the point
import ctypes; ctypes.CDLL("libc.so.6").malloc_trim(0)       # start from a trimmed heap
me = psutil.Process()
base = peak = me.memory_info().rss
done = threading.Event()
def sample():
    global peak
    while not done.is_set():
        peak = max(peak, me.memory_info().rss)
        time.sleep(0.0005)
watcher = threading.Thread(target=sample)
watcher.start()
for _ in range(3):
    food11.preprocess(data, max_pixels=pixels)
done.set()
watcher.join()
print((peak - base) / pixels, (me.memory_info().rss - base) / pixels)
"""


def test_a_worst_case_decode_holds_one_full_size_copy_besides_its_result():
    """A 16-bit PNG decodes to 2 B/pixel, its 32-bit copy 4, grey 1, RGB 4: holding the 32-bit copy
    into the RGB result, or copying the image for an EXIF orientation it does not have, costs
    16 B/pixel; the kit holds ~10. Memory freed after the decode goes back (glibc would keep it)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _ONE_DECODE], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "MALLOC_ARENA_MAX": "2"})
    assert out.returncode == 0, out.stderr
    peak, after = map(float, out.stdout.split())
    assert peak <= 12, f"one 2 MP 16-bit decode held {peak:.1f} B per pixel at its peak"
    assert after <= 1, f"{after:.1f} B per pixel stayed after the decodes"
