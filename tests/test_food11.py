"""servelab.food11: the contract every service shares."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from servelab import food11


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
    for bad in ["not base64!!", "abc", "", "   ", "é" * 8]:
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
