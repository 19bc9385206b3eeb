"""Build the lab's model artifacts: `servelab models build [--weights PATH_OR_URL]`.

Outputs (all git-ignored, each with a ``<file>.json`` stamp beside it):

* ``food11.pth`` — a full pickled torchvision MobileNetV2 with an 11-class
  head, loadable the way the lab loads it: ``torch.load(p, weights_only=False)``;
* ``food11.onnx`` — the same network exported to ONNX: input ``input``
  [N, 3, 224, 224] float32, output ``output`` [N, 11] logits, dynamic batch;
* ``food11_v2.onnx`` — version 2 of the ONNX classifier for the rollout in
  notebook 6a: demo weights from the next seed (``DEMO_SEED + 1``), exported
  the same way, so the two versions are told apart by their answers;
* ``food11_fp16.onnx`` — ``food11.pth``'s weights in FP16, with FP32 at its input
  and output (a cast at each end), so food_classifier_onnx's config serves it
  unchanged. It stays in ``build/models/``: notebook 6e serves it as a copy of
  food_classifier_onnx beside the fp32 one (on the node's GPU, ONNX Runtime's CUDA
  provider runs its FP16 kernels).

They are built once into ``build/models/`` and copied to where each lesson
folder expects them (see ``servelab.core.paths``).

Default weights are *demo* weights: deterministic (fixed seed), untrained,
but calibrated so that different images get different labels — a plain
random init gives logits ~1e-9, a flat softmax, and the same label for
everything. ``--weights`` loads trained Food-11 weights instead (a full
pickled model or a state_dict, local path or URL). ``--prefer-weights PATH``
(the node's build, docker/docker-compose-models.yaml) uses PATH when it is there
and loads, else the demo weights, with one line saying why.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servelab.core import food11, paths, procs

# Bump when the way artifacts are made changes, so old builds are redone.
BUILD_RECIPE = 4
DEMO_SEED = 11
ONNX_OPSET = 17
PARITY_TOLERANCE = 1e-4
EXPECTED_HEAD = "MobileNetV2 with classifier[1] = Linear(1280, 11) (11 Food-11 classes)"


class WeightsError(ValueError):
    """Weights that cannot become the lab's 11-class MobileNetV2."""


@dataclass
class BuildResult:
    pth: Path
    onnx: Path
    parity_max_abs_diff: float
    weights_kind: str
    copied: list[Path]
    skipped: bool


# --------------------------------------------------------------------------
# The network
# --------------------------------------------------------------------------

def new_mobilenet_v2():
    import torchvision

    return torchvision.models.mobilenet_v2(weights=None, num_classes=food11.NUM_CLASSES)


def _calibration_batch(n: int = 48, seed: int = DEMO_SEED):
    """Deterministic, varied images (colour fields, stripes, blobs, noise)
    plus the bundled samples, preprocessed like real requests."""
    import torch
    from PIL import Image

    rng = np.random.default_rng(seed)
    images = []
    yy, xx = np.mgrid[0:224, 0:224] / 224.0
    for i in range(n):
        base = rng.uniform(0, 255, size=3)
        tilt = rng.uniform(-255, 255, size=(2, 3))
        freq = rng.uniform(1, 12)
        arr = base + xx[..., None] * tilt[0] + yy[..., None] * tilt[1]
        arr += 60 * np.sin(2 * np.pi * freq * (xx if i % 2 else yy))[..., None] * rng.uniform(-1, 1, size=3)
        arr += rng.normal(0, rng.uniform(0, 40), size=arr.shape)
        images.append(Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "RGB"))
    for p in paths.sample_images():
        images.append(food11.load_image(p.read_bytes()))
    return torch.from_numpy(food11.preprocess_batch(images))


def _noise_batch(n: int, seed: int):
    """Uniform pixel noise, normalised like real input."""
    import torch

    pixels = np.random.default_rng(seed).uniform(0, 1, size=(n, 224, 224, 3)).astype(np.float32)
    return torch.from_numpy(((pixels - food11.MEAN) / food11.STD).transpose(0, 3, 1, 2).copy())


def build_demo_model(seed: int = DEMO_SEED):
    """MobileNetV2 with deterministic, calibrated, untrained weights."""
    import torch

    torch.manual_seed(seed)
    model = new_mobilenet_v2()
    batch = torch.cat([_calibration_batch(seed=seed), _noise_batch(8, seed + 1)])
    with torch.no_grad():
        # 1. Batch-norm calibration: set every BN layer's running statistics
        #    to the statistics its input really has, so activations keep a
        #    healthy scale through all 52 layers instead of vanishing.
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.reset_running_stats()
                m.momentum = None  # cumulative average: one pass = exact stats
        model.train()
        model(batch)
        model.eval()
        # Near-constant channels would get huge gains (1/sqrt(var)) that
        # amplify float rounding: floor each layer's variances at its median.
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_var.clamp_(min=float(m.running_var.median()))
        # 2. Head: a random projection of standardised features, so each
        #    class's logit varies across images by a couple of units.
        feats = torch.nn.functional.adaptive_avg_pool2d(model.features(batch), 1).flatten(1)
        mu, sd = feats.mean(0), feats.std(0)
        sd = sd.clamp_min(float(sd.median()))
        head: torch.nn.Linear = model.classifier[1]
        w = torch.randn(head.out_features, head.in_features) / head.in_features ** 0.5
        w = 2.5 * w / sd
        head.weight.copy_(w)
        head.bias.copy_(-(w @ mu))
    return model


def _strip_prefix(state: dict, prefix: str) -> dict:
    if state and all(k.startswith(prefix) for k in state):
        return {k[len(prefix):]: v for k, v in state.items()}
    return state


def _from_state_dict(obj: dict, source: str):
    """A MobileNetV2 with Food-11's head loaded from a (possibly wrapped or prefixed) state_dict."""
    for key in ("state_dict", "model_state_dict", "model"):
        if key in obj and isinstance(obj[key], dict):
            obj = obj[key]
            break
    state = _strip_prefix(_strip_prefix(obj, "module."), "model.")
    model = new_mobilenet_v2()
    expected = model.state_dict()
    bad = [
        f"{k}: got {tuple(v.shape)}, expected {tuple(expected[k].shape)}"
        for k, v in state.items() if k in expected and hasattr(v, "shape") and v.shape != expected[k].shape
    ]
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if bad or missing or unexpected:
        detail = "; ".join(bad[:3] + [f"missing {missing[:3]}"] * bool(missing) + [f"unexpected {unexpected[:3]}"] * bool(unexpected))
        raise WeightsError(f"{source}: these weights do not fit {EXPECTED_HEAD}: {detail}.")
    model.load_state_dict(state)
    return model


def load_trained(source: str):
    """A full pickled model or a state_dict (path or URL) → the 11-class model."""
    import torch

    path = fetch(source)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # pickle/zip errors come in many types
        raise WeightsError(f"{source}: not a PyTorch checkpoint ({err}).") from None
    if isinstance(obj, torch.nn.Module):
        import torchvision

        if not isinstance(obj, torchvision.models.MobileNetV2):
            raise WeightsError(f"{source}: a pickled {type(obj).__name__}, not {EXPECTED_HEAD}.")
        model = obj
    elif isinstance(obj, dict):
        model = _from_state_dict(obj, source)
    else:
        raise WeightsError(f"{source}: expected a pickled model or a state_dict, got {type(obj).__name__}.")
    model.eval()
    # The output must be 11 logits (a MobileNetV2 whose head was replaced with another size is refused here).
    with torch.no_grad():
        try:
            out = model(torch.zeros(1, 3, food11.INPUT_SIZE, food11.INPUT_SIZE))
        except Exception as err:
            raise WeightsError(f"{source}: the model fails on a [1,3,224,224] input ({err}).") from None
    if tuple(out.shape) != (1, food11.NUM_CLASSES):
        raise WeightsError(
            f"{source}: the model outputs shape {tuple(out.shape)}; expected (1, {food11.NUM_CLASSES}): {EXPECTED_HEAD}."
        )
    return model


def fetch(source: str) -> Path:
    """A local path as is; an http(s)/file URL downloaded into build/downloads/."""
    parsed = urllib.parse.urlparse(source)
    if parsed.scheme in ("http", "https", "file"):
        name = Path(parsed.path).name or "weights.pth"
        digest = hashlib.sha256(source.encode()).hexdigest()[:12]
        dest = paths.BUILD_DIR / "downloads" / f"{digest}-{name}"
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_suffix(".part")
            print(f"downloading {source} ...")
            with urllib.request.urlopen(source, timeout=60) as r, open(tmp, "wb") as f:
                shutil.copyfileobj(r, f)
            tmp.replace(dest)
        return dest
    path = Path(source).expanduser()
    if not path.is_file():
        raise WeightsError(f"{source}: no such file.")
    return path


# --------------------------------------------------------------------------
# Export and parity
# --------------------------------------------------------------------------

def export_onnx(model, dest: Path) -> None:
    import warnings

    import torch

    dummy = torch.zeros(2, 3, food11.INPUT_SIZE, food11.INPUT_SIZE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dynamo=False prints a deprecation warning
        torch.onnx.export(
            model, dummy, str(dest), input_names=["input"], output_names=["output"],
            dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
            opset_version=ONNX_OPSET, dynamo=False,
        )


def parity(model, onnx_path: Path, batch: int = 4, seed: int = 0) -> float:
    """Max |ORT − PyTorch| over the logits of a batch of random images
    (uniform pixel noise, normalised like real input)."""
    import onnxruntime as ort
    import torch

    x = _noise_batch(batch, seed).numpy()
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    got = sess.run(["output"], {"input": x})[0]
    return float(np.max(np.abs(ref - got)))


# --------------------------------------------------------------------------
# The build
# --------------------------------------------------------------------------

def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fingerprint(weights: str | None) -> dict:
    import torch

    if weights is None:
        source = {"kind": "demo", "seed": DEMO_SEED,
                  "samples": [_sha256(p) for p in paths.sample_images()]}
    else:
        src = fetch(weights)
        source = {"kind": "trained", "source": weights, "sha256": _sha256(src)}
    return {"recipe": BUILD_RECIPE, "torch": torch.__version__, "weights": source}


def _current(out_dir: Path, fp: dict) -> dict | None:
    stamp = out_dir / "build.json"
    try:
        info = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return None
    if info.get("fingerprint") != fp:
        return None
    for name in ("food11.pth", "food11.onnx"):
        f = out_dir / name
        if not f.exists() or _sha256(f) != info["sha256"][name]:
            return None
    return info


def _place(src: Path, dest: Path, info: dict) -> bool:
    """Copy ``src`` to ``dest`` (with its stamp) unless it is already there."""
    stamp = {
        "weights_kind": info["weights_kind"],
        "sha256": info["sha256"][src.name],
        "built_at": info["built_at"],
        "source": info["fingerprint"]["weights"].get("source", "demo"),
        "note": food11.DEMO_WEIGHTS_NOTE if info["weights_kind"] == "demo" else "trained Food-11 weights",
    }
    stamp_path = Path(f"{dest}.json")
    if dest.exists() and stamp_path.exists() and _sha256(dest) == stamp["sha256"]:
        try:
            if json.loads(stamp_path.read_text()) == stamp:
                return False
        except ValueError:
            pass
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.copyfile(src, tmp)
    tmp.replace(dest)
    stamp_path.write_text(json.dumps(stamp, indent=2) + "\n")
    return True


def build(weights: str | None = None, out_dir: Path | None = None, force: bool = False,
          place: bool = True, log=print) -> BuildResult:
    """Build (or reuse) the artifacts and copy them where the lessons expect."""
    import torch

    out_dir = Path(out_dir or paths.MODELS_BUILD_DIR)
    fp = _fingerprint(weights)
    info = None if force else _current(out_dir, fp)
    skipped = info is not None
    if info is None:
        t0 = time.perf_counter()
        torch.set_num_threads(procs.cpu_cores())
        model = build_demo_model() if weights is None else load_trained(weights)
        out_dir.mkdir(parents=True, exist_ok=True)
        pth, onnx_path = out_dir / "food11.pth", out_dir / "food11.onnx"
        torch.save(model, pth)
        export_onnx(model, onnx_path)
        diff = parity(model, onnx_path)
        log(f"export parity: max |ONNX Runtime - PyTorch| = {diff:.2e} on a random batch of 4 "
            f"(limit {PARITY_TOLERANCE:.0e})")
        if not diff <= PARITY_TOLERANCE:
            raise RuntimeError(f"ONNX export does not match PyTorch: max abs diff {diff:.3e} > {PARITY_TOLERANCE}")
        info = {
            "fingerprint": fp,
            "weights_kind": "demo" if weights is None else "trained",
            "parity_max_abs_diff": diff,
            "sha256": {"food11.pth": _sha256(pth), "food11.onnx": _sha256(onnx_path)},
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (out_dir / "build.json").write_text(json.dumps(info, indent=2) + "\n")
        log(f"built {info['weights_kind']} weights in {time.perf_counter() - t0:.1f} s")
    else:
        log(f"artifacts are current ({info['weights_kind']} weights, built {info['built_at']}); nothing to rebuild")
        log(f"export parity (recorded at build): max abs diff = {info['parity_max_abs_diff']:.2e}")
    copied = []
    if place:
        for src, targets in ((out_dir / "food11.pth", paths.PTH_TARGETS), (out_dir / "food11.onnx", paths.ONNX_TARGETS)):
            for dest in targets:
                if _place(src, dest, info):
                    copied.append(dest)
                log(f"  {'wrote ' if dest in copied else 'kept  '} {_rel(dest)}")
    build_second_version(out_dir, force=force, place=place, log=log)
    build_fp16(out_dir, force=force, log=log)
    if info["weights_kind"] == "demo":
        log(f"note: {food11.DEMO_WEIGHTS_NOTE} (use --weights to load trained Food-11 weights)")
    return BuildResult(out_dir / "food11.pth", out_dir / "food11.onnx", info["parity_max_abs_diff"],
                       info["weights_kind"], copied, skipped and not copied)


def build_preferring(trained: str | Path, force: bool = False, out_dir: Path | None = None, place: bool = True,
                     log=print) -> BuildResult:
    """The node's build (the models container's command): the trained weights in ``trained`` when that file
    is there and builds (a MobileNetV2 with 11 classes whose ONNX export matches), else the demo weights,
    with one line saying why. ``servelab.node.weights fetch`` puts the file there only after checking its
    git blob id."""
    path = Path(trained)
    if not path.is_absolute():
        path = paths.REPO_ROOT / path
    if not path.is_file():
        log(f"trained weights: none at {_rel(path)} (notebook 2 downloads them: python3 -m servelab.node.weights "
            "fetch); building the demo weights")
        return build(None, out_dir=out_dir, force=force, place=place, log=log)
    try:
        return build(str(path), out_dir=out_dir, force=force, place=place, log=log)
    except Exception as err:  # WeightsError: not the lab's model; anything else: its export or its parity failed
        log(f"trained weights refused ({err}); building the demo weights")
        return build(None, out_dir=out_dir, force=force, place=place, log=log)


def _stamped(stamp: Path, fp: dict, built: Path) -> dict | None:
    """The stamp's record when ``built`` is what it records, made from the recipe ``fp``; else None."""
    try:
        info = json.loads(stamp.read_text())
        return info if info.get("fingerprint") == fp and _sha256(built) == info["sha256"][built.name] else None
    except (OSError, ValueError, KeyError):
        return None


def build_second_version(out_dir: Path | None = None, force: bool = False, place: bool = True,
                         log=print) -> Path:
    """``food11_v2.onnx`` (demo weights, seed ``DEMO_SEED + 1``), placed as
    version 2 of food_classifier_onnx. Deterministic, so rebuilt only when its
    recipe changes."""
    import torch

    out_dir = Path(out_dir or paths.MODELS_BUILD_DIR)
    onnx_path, stamp = out_dir / "food11_v2.onnx", out_dir / "build_v2.json"
    fp = {"recipe": BUILD_RECIPE, "torch": torch.__version__, "weights": {"kind": "demo", "seed": DEMO_SEED + 1}}
    info = _stamped(stamp, fp, onnx_path)
    if force or info is None:
        t0 = time.perf_counter()
        model = build_demo_model(seed=DEMO_SEED + 1)
        out_dir.mkdir(parents=True, exist_ok=True)
        export_onnx(model, onnx_path)
        diff = parity(model, onnx_path)
        if not diff <= PARITY_TOLERANCE:
            raise RuntimeError(f"ONNX export of version 2 does not match PyTorch: max abs diff {diff:.3e}")
        info = {"fingerprint": fp, "weights_kind": "demo", "parity_max_abs_diff": diff,
                "sha256": {"food11_v2.onnx": _sha256(onnx_path)},
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        stamp.write_text(json.dumps(info, indent=2) + "\n")
        log(f"built version 2 of the ONNX classifier (demo weights, seed {DEMO_SEED + 1}) "
            f"in {time.perf_counter() - t0:.1f} s")
    if place:
        wrote = _place(onnx_path, paths.ONNX_V2_TARGET, info)
        log(f"  {'wrote ' if wrote else 'kept  '} {_rel(paths.ONNX_V2_TARGET)}")
    return onnx_path


FP16_MIN_TOP1 = 0.9   # FP16 rounding may flip a near tie between two classes; more flips is a broken export


def fp16_fidelity(model, onnx_path: Path, seed: int = 0) -> dict:
    """The FP16 export against the fp32 network on the calibration images (varied patterns and the
    kit's samples): max |Δlogit| and the share of images with the same top-1 class."""
    import onnxruntime as ort
    import torch

    batch = _calibration_batch(n=32, seed=seed)
    with torch.no_grad():
        ref = model(batch).numpy()
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"input": batch.numpy()})[0]
    return {"max_abs_logit_diff": float(np.abs(got - ref).max()),
            "top1_agreement": float((got.argmax(1) == ref.argmax(1)).mean()), "images": len(batch)}


def build_fp16(out_dir: Path | None = None, force: bool = False, log=print) -> Path:
    """``food11_fp16.onnx`` from ``food11.pth`` (the weights food_classifier_onnx serves), in the build
    folder; rebuilt when food11.pth or the recipe changes."""
    import torch

    out_dir = Path(out_dir or paths.MODELS_BUILD_DIR)
    pth, onnx_path, stamp = out_dir / "food11.pth", out_dir / "food11_fp16.onnx", out_dir / "build_fp16.json"
    main = json.loads((out_dir / "build.json").read_text())   # what build() made food11.pth from
    fp = {"recipe": BUILD_RECIPE, "torch": torch.__version__, "food11.pth": _sha256(pth),
          "weights": main["fingerprint"]["weights"]}
    info = _stamped(stamp, fp, onnx_path)
    rebuilt = force or info is None
    if rebuilt:
        t0 = time.perf_counter()
        model = torch.load(pth, map_location="cpu", weights_only=False).eval()

        class HalfInside(torch.nn.Module):   # FP32 in, FP16 through the network, FP32 out
            def __init__(self, net):
                super().__init__()
                self.net = net

            def forward(self, x):
                return self.net(x.half()).float()

        import copy

        export_onnx(HalfInside(copy.deepcopy(model).half()).eval(), onnx_path)
        fidelity = fp16_fidelity(model, onnx_path)
        if fidelity["top1_agreement"] < FP16_MIN_TOP1:
            raise RuntimeError(f"the FP16 export agrees with fp32 on {fidelity['top1_agreement']:.0%} of the top-1 "
                               f"classes (at least {FP16_MIN_TOP1:.0%})")
        info = {"fingerprint": fp, "weights_kind": main["weights_kind"], "fidelity": fidelity,
                "sha256": {"food11_fp16.onnx": _sha256(onnx_path)},
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        stamp.write_text(json.dumps(info, indent=2) + "\n")
        log(f"built the FP16 ONNX classifier in {time.perf_counter() - t0:.1f} s: max |Δlogit| against fp32 "
            f"{fidelity['max_abs_logit_diff']:.3f}, top-1 the same on {fidelity['top1_agreement']:.0%} of "
            f"{fidelity['images']} images")
    log(f"  {'built ' if rebuilt else 'kept  '} {_rel(onnx_path)} (FP16; notebook 6e serves it)")
    return onnx_path


def _rel(p: Path) -> str:
    try:
        return str(p.relative_to(paths.REPO_ROOT))
    except ValueError:
        return str(p)


def artifacts_ready() -> bool:
    return all(p.exists() for p in (*paths.PTH_TARGETS, *paths.ONNX_TARGETS, paths.ONNX_V2_TARGET, paths.ONNX_FP16))


# --------------------------------------------------------------------------
# One-image check through each artifact (the first README command prints it)
# --------------------------------------------------------------------------

def predict_each(image_path: Path) -> dict[str, food11.Prediction]:
    import onnxruntime as ort
    import torch

    x = food11.preprocess(image_path.read_bytes())[None]
    model = torch.load(paths.PTH_TARGETS[0], weights_only=False)
    model.eval()
    with torch.no_grad():
        pt = food11.predict_from_logits(model(torch.from_numpy(x)).numpy())[0]
    sess = ort.InferenceSession(str(paths.ONNX_TARGETS[0]), providers=["CPUExecutionProvider"])
    ox = food11.predict_from_logits(sess.run(["output"], {"input": x})[0])[0]
    return {"food11.pth (PyTorch)": pt, "food11.onnx (ONNX Runtime)": ox}


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------

def add_parser(sub) -> None:
    p = sub.add_parser("models", help="build the Food-11 model artifacts (food11.pth, food11.onnx)")
    msub = p.add_subparsers(dest="models_command", metavar="ACTION")
    msub.required = True
    b = msub.add_parser("build", help="build or reuse the artifacts and place them for each lesson folder")
    b.add_argument("--weights", metavar="PATH_OR_URL",
                   help="trained Food-11 weights: a full pickled model or a state_dict (default: demo weights)")
    b.add_argument("--prefer-weights", metavar="PATH",
                   help="trained weights to use if PATH is there and loads as MobileNetV2 with 11 classes; "
                        "else the demo weights, with one line saying why (the node's build)")
    b.add_argument("--force", action="store_true", help="rebuild even if the artifacts are current")
    b.set_defaults(func=_cmd_build)
    pr = msub.add_parser("predict", help="classify one image through each artifact")
    pr.add_argument("image", nargs="?", help="image file (default: every bundled sample)")
    pr.set_defaults(func=_cmd_predict)


def _cmd_build(args) -> int:
    if args.weights and args.prefer_weights:
        print("error: give --weights or --prefer-weights, not both", file=sys.stderr)
        return 2
    if args.prefer_weights:
        build_preferring(args.prefer_weights, force=args.force)
        return 0
    try:
        build(weights=args.weights, force=args.force)
    except WeightsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def _cmd_predict(args) -> int:
    if not artifacts_ready():
        print("error: model artifacts missing: run `python -m servelab models build` first", file=sys.stderr)
        return 2
    images = [Path(args.image)] if args.image else paths.sample_images()
    kind = food11.weights_kind(paths.PTH_TARGETS[0])
    print(f"weights: {kind}" + (f" ({food11.DEMO_WEIGHTS_NOTE})" if kind == "demo" else ""))
    for img in images:
        try:
            preds = predict_each(img)
        except food11.ImageDecodeError as err:
            print(f"error: {img}: {err}", file=sys.stderr)
            return 2
        cells = "  |  ".join(f"{k}: {v.label} {v.probability:.3f}" for k, v in preds.items())
        print(f"{img.name:<24} {cells}")
    return 0
