"""Sample images and perf_analyzer's ``input.json``, made by the kit.

No data set can be downloaded for the lab's demos and tests, so the kit
draws a handful of food-like pictures itself (plates, bowls, grains,
leaves) at different sizes and formats. They are committed under
``servelab/samples/``; ``servelab samples build`` redraws them.

``input.json`` is perf_analyzer's ``--input-data`` for the Python-backend
model: one request whose ``INPUT_IMAGE`` (a BYTES tensor, shape [1]) holds
a base64-encoded JPEG — what ``perf_analyzer -m food_classifier
--input-data input.json -b 1`` sends.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from servelab.core import paths

INPUT_JSON_SAMPLE = "soup_bowl.jpg"


def _background(rng, size, tone):
    w, h = size
    noise = rng.normal(0, 12, size=(h // 8 + 1, w // 8 + 1, 3))
    arr = np.kron(noise, np.ones((8, 8, 1)))[:h, :w] + np.array(tone)
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "RGB")


def _scatter(draw, rng, box, n, radius, colours):
    x0, y0, x1, y1 = box
    for _ in range(n):
        cx, cy = rng.uniform(x0, x1), rng.uniform(y0, y1)
        rx, ry = radius * rng.uniform(0.6, 1.4), radius * rng.uniform(0.3, 0.9)
        colour = tuple(int(c) for c in colours[rng.integers(len(colours))])
        draw.ellipse((cx - rx, cy - ry, cx + rx, cy + ry), fill=colour)


def draw_samples() -> dict[str, Image.Image]:
    """Name → image. Deterministic: the same pixels every time."""
    rng = np.random.default_rng(2024)
    out: dict[str, Image.Image] = {}

    # Soup: an orange bowl on a wooden table.
    img = _background(rng, (640, 480), (120, 80, 45))
    d = ImageDraw.Draw(img)
    d.ellipse((120, 60, 520, 420), fill=(235, 235, 230))
    d.ellipse((170, 105, 470, 375), fill=(225, 120, 40))
    _scatter(d, rng, (200, 140, 440, 340), 25, 8, [(245, 200, 90), (90, 140, 60)])
    out["soup_bowl.jpg"] = img.filter(ImageFilter.GaussianBlur(1.2))

    # Salad: greens with tomatoes, square PNG.
    img = _background(rng, (500, 500), (210, 210, 205))
    d = ImageDraw.Draw(img)
    _scatter(d, rng, (40, 40, 460, 460), 160, 28, [(60, 150, 50), (90, 180, 70), (40, 110, 40)])
    _scatter(d, rng, (80, 80, 420, 420), 14, 18, [(200, 30, 30), (230, 60, 40)])
    out["green_salad.png"] = img

    # Rice: many small white grains on a blue plate, large JPEG.
    img = _background(rng, (1024, 768), (40, 60, 120))
    d = ImageDraw.Draw(img)
    d.ellipse((160, 60, 864, 708), fill=(235, 240, 245))
    _scatter(d, rng, (260, 160, 764, 608), 1400, 7, [(250, 250, 245), (225, 225, 215), (240, 235, 220)])
    out["rice_plate.jpg"] = img

    # Bread: a brown loaf with darker scoring, portrait.
    img = _background(rng, (360, 480), (230, 215, 180))
    d = ImageDraw.Draw(img)
    d.rounded_rectangle((40, 110, 320, 380), radius=90, fill=(170, 105, 45))
    for k in range(4):
        d.line((90 + 50 * k, 150, 130 + 50 * k, 340), fill=(110, 60, 25), width=9)
    out["bread_loaf.jpg"] = img.filter(ImageFilter.SMOOTH)

    # Egg: a fried egg on a dark pan, small PNG with an alpha channel.
    img = Image.new("RGBA", (256, 192), (0, 0, 0, 0))
    d = ImageDraw.Draw(img)
    d.ellipse((8, 8, 248, 184), fill=(45, 45, 50, 255))
    d.polygon([(60, 60), (130, 30), (200, 70), (190, 150), (90, 160), (50, 110)], fill=(250, 250, 245, 255))
    d.ellipse((105, 70, 155, 120), fill=(250, 180, 20, 255))
    out["fried_egg.png"] = img

    # Pasta: yellow noodles in tomato sauce, wide JPEG.
    img = _background(rng, (800, 450), (245, 245, 240))
    d = ImageDraw.Draw(img)
    for _ in range(90):
        pts = [(rng.uniform(150, 650), rng.uniform(60, 390)) for _ in range(4)]
        d.line(pts, fill=(240, 200, 90), width=6, joint="curve")
    _scatter(d, rng, (250, 120, 550, 330), 20, 20, [(180, 40, 20)])
    out["pasta_sauce.jpg"] = img
    return out


def build_samples(dest: Path | None = None, log=print) -> list[Path]:
    dest = Path(dest or paths.SAMPLES_DIR)
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for name, img in draw_samples().items():
        path = dest / name
        if name.endswith(".jpg"):
            img.convert("RGB").save(path, "JPEG", quality=88, optimize=False, progressive=False)
        else:
            img.save(path, "PNG", optimize=False)
        written.append(path)
        log(f"  {path}  {img.size[0]}x{img.size[1]} {img.mode}")
    return written


def input_json_text(image_path: Path | None = None) -> str:
    """The text of input.json for ``image_path`` (default: the soup sample)."""
    image_path = Path(image_path or paths.SAMPLES_DIR / INPUT_JSON_SAMPLE)
    b64 = base64.b64encode(image_path.read_bytes()).decode("ascii")
    doc = {"data": [{"INPUT_IMAGE": {"content": [b64], "shape": [1]}}]}
    return json.dumps(doc, indent=2) + "\n"


def write_input_json(dest: Path | None = None, image_path: Path | None = None) -> Path:
    dest = Path(dest or paths.INPUT_JSON)
    dest.write_text(input_json_text(image_path))
    return dest


def add_parser(sub) -> None:
    p = sub.add_parser("samples", help="sample images and perf_analyzer's input.json")
    ssub = p.add_subparsers(dest="samples_command", metavar="ACTION")
    ssub.required = True
    b = ssub.add_parser("build", help="redraw the bundled sample images")
    b.add_argument("--dest", type=Path, help=f"folder (default {paths.SAMPLES_DIR})")
    b.set_defaults(func=_cmd_build)
    j = ssub.add_parser("input-json", help="write input.json (perf_analyzer --input-data) from a sample image")
    j.add_argument("--image", type=Path, help=f"image (default the bundled {INPUT_JSON_SAMPLE})")
    j.add_argument("--out", type=Path, help="output file (default input.json at the repository root)")
    j.set_defaults(func=_cmd_input_json)
    ls = ssub.add_parser("list", help="list the bundled sample images")
    ls.set_defaults(func=_cmd_list)


def _cmd_build(args) -> int:
    build_samples(args.dest)
    return 0


def _cmd_list(args) -> int:
    print("\n".join(str(p) for p in paths.sample_images()))
    return 0


def _cmd_input_json(args) -> int:
    try:
        out = write_input_json(args.out, args.image)
    except OSError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0
