"""Where things live in the repository (one place, so nothing hard-codes paths)."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # servelab/ (this file is in servelab/core/)
# The repository root: the folder holding servelab/. Overridable for
# installed copies (e.g. inside a container the repo is mounted elsewhere).
REPO_ROOT = Path(os.environ.get("SERVELAB_ROOT", PACKAGE_DIR.parent)).resolve()

SAMPLES_DIR = PACKAGE_DIR / "samples"
KIT_DIR_ON_NODE = "serve-system-chi"  # the kit's folder in the cc user's home on the GPU node
BUILD_DIR = REPO_ROOT / "build"
MODELS_BUILD_DIR = BUILD_DIR / "models"
# The earlier lab's trained model (its fastapi_pt/food11.pth), once servelab.node.weights has downloaded and
# checked it (on the node).
TRAINED_WEIGHTS = BUILD_DIR / "trained" / "food11.pth"
RESULTS_DIR = REPO_ROOT / "results"
# The node's reference run (servelab.node.reference), committed: the site shows it beside docs/reference/
# and the lesson tables cite its minutes.
NODE_REFERENCE_DIR = REPO_ROOT / "docs" / "reference-node"
MODELS_STAGING = REPO_ROOT / "models_staging"
MODELS_STREAMING = REPO_ROOT / "models_streaming"   # the token-streaming lesson's two models (notebook 6f)
MODELS_BLS = REPO_ROOT / "models_bls"               # the BLS cascade, loaded by its lesson (notebook 6a)
INPUT_JSON = REPO_ROOT / "input.json"

# Where each lesson folder expects the model artifacts.
PTH_TARGETS = (
    REPO_ROOT / "fastapi_pt" / "food11.pth",
    MODELS_STAGING / "food_classifier" / "1" / "food11.pth",
)
ONNX_TARGETS = (
    REPO_ROOT / "fastapi_onnx" / "food11.onnx",
    MODELS_STAGING / "food_classifier_onnx" / "1" / "model.onnx",
)
# Version 2 of the ONNX classifier (notebook 6a's rollout): a second deterministic export.
ONNX_V2_TARGET = MODELS_STAGING / "food_classifier_onnx" / "2" / "model.onnx"
# The same weights as food11.onnx in FP16, FP32 at its input and output (notebook 6e serves it as a copy).
ONNX_FP16 = MODELS_BUILD_DIR / "food11_fp16.onnx"


def sample_images() -> list[Path]:
    """The kit's bundled sample images, sorted by name."""
    return sorted(p for p in SAMPLES_DIR.iterdir() if p.suffix.lower() in {".jpg", ".jpeg", ".png"})
