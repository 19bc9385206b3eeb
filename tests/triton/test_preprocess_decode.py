"""food_preprocess's two decoders (models_staging/food_preprocess/1/model.py), on the CPU: which one
an instance picks and why (the `decode` parameter and the instance's kind), the GPU path's own code
run with device="cpu" against food11.preprocess, the fallback to the CPU when nvJPEG refuses a
batch, and the bad-input table through the GPU path. Run with a stand-in for Triton's
triton_python_backend_utils, as Triton's Python backend calls the file (initialize, execute)."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
import warnings

import numpy as np
import pytest

from servelab.core import food11, paths
from tests.services.helpers import bomb_png, scan_bomb_jpeg, truncated_jpeg, truncated_jpeg_with_end

from . import pbstub

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torchvision 0.29 here; the image pins 0.22.1
torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

MODEL_PY = paths.MODELS_STAGING / "food_preprocess" / "1" / "model.py"
CPU = torch.device("cpu")

# The GPU path's tensors against food11.preprocess, in normalised units (x / 255 - mean) / std.
# PIL rounds its resized pixels to uint8, the GPU path keeps them float: one uint8 level is
# 1 / (255 * 0.225) = 0.0174. Measured on the kit's four JPEG samples (360x480 to 1024x768, decoded
# in full by both): max 0.0159-0.0170, mean 0.0038-0.0047. Photos of 1280 px and more are decoded by
# food11 at 1/2 to 1/8 scale (its draft_size) and by nvJPEG in full: max 0.032-0.058, mean 0.0043-0.0045.
SAMPLE_MAX_DIFF, DRAFTED_MAX_DIFF, MEAN_DIFF = 0.02, 0.08, 0.006




@pytest.fixture
def model_py(monkeypatch):
    """model.py loaded against a stand-in of the backend's utilities; ``.logged`` holds its log lines."""
    logged: list[str] = []
    pb_utils = pbstub.stand_in(logged)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb_utils)
    spec = importlib.util.spec_from_file_location("food_preprocess_model_py", MODEL_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.logged = logged
    module.real_gpu_preprocess = module.gpu_preprocess   # the file's own, whatever a test patches
    return module


def _args(kind: str, decode: str | None) -> dict:
    config = {"name": "food_preprocess", "parameters": {"decode": {"string_value": decode}} if decode else {}}
    return {"model_config": json.dumps(config), "model_instance_kind": kind, "model_instance_device_id": "0",
            "model_instance_name": f"food_preprocess_0_{kind.lower()}"}


def _started(model_py, kind: str, decode: str | None):
    model = model_py.TritonPythonModel()
    model.initialize(_args(kind, decode))
    return model


def _gpu_path(model_py, items: list[bytes]) -> np.ndarray:
    with warnings.catch_warnings():   # torchvision 0.29 deprecates its image decoders (the image pins 0.22.1)
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        return model_py.real_gpu_preprocess(items, CPU)


# --------------------------------------------------------------------------
# Which decoder an instance picks
# --------------------------------------------------------------------------

@pytest.mark.parametrize("decode", ["auto", None])
def test_auto_on_a_kind_cpu_instance_decodes_on_the_cpu(model_py, decode):
    model = _started(model_py, "CPU", decode)
    assert model.device is None
    assert model_py.logged == ["food_preprocess_0_cpu: decoding on the CPU: the instance is KIND_CPU"]


def test_decode_cpu_keeps_a_kind_gpu_instance_on_the_cpu(model_py, monkeypatch):
    monkeypatch.setattr(model_py, "cuda_decode_problem", lambda device: pytest.fail("no GPU decoder is probed"))
    assert _started(model_py, "GPU", "cpu").device is None
    assert model_py.logged[-1].endswith("decoding on the CPU: decode=cpu in config.pbtxt")


def test_auto_on_a_kind_gpu_instance_without_cuda_says_why_it_decodes_on_the_cpu(model_py, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _started(model_py, "GPU", "auto").device is None
    assert model_py.logged[-1].endswith("decoding on the CPU: torch sees no CUDA device")


def test_auto_on_a_kind_gpu_instance_with_a_gpu_decoder_decodes_there(model_py, monkeypatch):
    seen = []
    monkeypatch.setattr(model_py, "cuda_decode_problem", lambda device: seen.append(device))
    model = _started(model_py, "GPU", "auto")
    assert seen == ["cuda:0"] and model.device == torch.device("cuda:0")
    assert model_py.logged[-1] == "food_preprocess_0_gpu: decoding on cuda:0 with nvJPEG (torchvision.io.decode_jpeg)"


def test_gpu_asked_where_it_cannot_be_had_is_a_load_failure_that_says_why(model_py, monkeypatch):
    """An accelerator the config asks for is refused with a clear message, never dropped silently."""
    with pytest.raises(ValueError, match="decode=gpu asked, but this instance is KIND_CPU: give food_preprocess a "
                                         "KIND_GPU instance_group"):
        _started(model_py, "CPU", "gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="decode=gpu asked, but torch sees no CUDA device"):
        _started(model_py, "GPU", "gpu")
    # A CUDA torch whose torchvision cannot decode there (a CPU build: "not compiled with nvJPEG support")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def refuses(images, device):
        raise RuntimeError("decode_jpegs_cuda: torchvision not compiled with nvJPEG support")
    monkeypatch.setattr(model_py, "gpu_preprocess", refuses)
    with pytest.raises(RuntimeError, match="torchvision has no working CUDA decode_jpeg .*nvJPEG support"):
        _started(model_py, "GPU", "gpu")
    assert _started(model_py, "GPU", "auto").device is None
    assert "decoding on the CPU: torchvision has no working CUDA decode_jpeg" in model_py.logged[-1]


def test_an_unknown_decode_value_is_a_load_failure(model_py):
    with pytest.raises(ValueError, match='parameter decode is "nvjpeg": use "auto", "cpu" or "gpu"'):
        _started(model_py, "GPU", "nvjpeg")


def test_the_shipped_config_asks_for_auto_on_kind_cpu():
    from servelab import triton

    cfg = triton.config_to_dict(triton.load_config(paths.MODELS_STAGING / "food_preprocess"))
    assert cfg["parameters"]["decode"]["string_value"] == "auto"
    assert [g["kind"] for g in cfg["instance_group"]] == ["KIND_CPU"]


# --------------------------------------------------------------------------
# The GPU path's code, run on the CPU
# --------------------------------------------------------------------------

def _jpegs() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in paths.sample_images() if p.suffix == ".jpg"}


def _bigger(name: str, scale: int) -> bytes:
    from PIL import Image

    img = Image.open(paths.SAMPLES_DIR / name).convert("RGB")
    buf = io.BytesIO()
    img.resize((img.width * scale, img.height * scale), Image.Resampling.BICUBIC).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def test_the_gpu_paths_tensors_agree_with_food11(model_py):
    jpegs = _jpegs()
    assert len(jpegs) >= 4
    ours = _gpu_path(model_py, list(jpegs.values()))   # one batch, as execute() sends it
    assert ours.shape == (len(jpegs), 3, 224, 224) and ours.dtype == np.float32
    for got, (name, data) in zip(ours, jpegs.items()):
        diff = np.abs(got - food11.preprocess(data))
        assert diff.max() <= SAMPLE_MAX_DIFF and diff.mean() <= MEAN_DIFF, (name, diff.max(), diff.mean())
    # Bigger photos: food11 decodes them at a reduced scale, the GPU path in full.
    for name, scale in (("soup_bowl.jpg", 2), ("rice_plate.jpg", 4)):
        data = _bigger(name, scale)
        diff = np.abs(_gpu_path(model_py, [data])[0] - food11.preprocess(data))
        assert diff.max() <= DRAFTED_MAX_DIFF and diff.mean() <= MEAN_DIFF, (name, scale, diff.max(), diff.mean())


def _gpu_instance_on_the_cpu(model_py, monkeypatch):
    """A started instance whose "GPU" is the CPU: execute() takes the GPU path's route."""
    monkeypatch.setattr(model_py, "cuda_decode_problem", lambda device: None)
    model = _started(model_py, "GPU", "gpu")
    model.device = CPU
    return model


def _request(*items: bytes) -> dict:
    return {"IMAGE_BYTES": np.array([[x] for x in items], dtype=object)}


def test_the_gpu_route_batches_jpegs_leaves_pngs_to_the_cpu_and_fails_only_bad_requests(model_py, monkeypatch):
    model = _gpu_instance_on_the_cpu(model_py, monkeypatch)
    batches = []

    def counted(images, device):
        batches.append(len(images))
        return _gpu_path(model_py, images)
    monkeypatch.setattr(model_py, "gpu_preprocess", counted)
    jpegs = list(_jpegs().values())
    png = (paths.SAMPLES_DIR / "green_salad.png").read_bytes()
    # refused by the food11 guards, before any decode
    bad = [("not_an_image", b"plain text, not a photo"), ("image_too_large", bomb_png()),
           ("image_too_large", scan_bomb_jpeg())]
    requests = [_request(jpegs[0]), *[_request(b) for _, b in bad], _request(png), _request(jpegs[1], png, jpegs[2])]
    responses = model.execute(requests)
    assert len(responses) == len(requests)
    assert batches == [3]   # the good requests' JPEGs, in one nvJPEG batch; the PNGs and the bad ones not
    np.testing.assert_array_equal(responses[0]["IMAGE_TENSOR"], _gpu_path(model_py, [jpegs[0]]))
    for (code, _), response in zip(bad, responses[1:4]):
        assert set(response) == {"error"} and response["error"].code == pbstub.TritonError.INVALID_ARG
        assert str(response["error"]).startswith(f"{code}: "), (code, str(response["error"]))
    np.testing.assert_array_equal(responses[4]["IMAGE_TENSOR"], food11.preprocess(png)[None])
    mixed = responses[5]["IMAGE_TENSOR"]
    assert mixed.shape == (3, 3, 224, 224)
    np.testing.assert_array_equal(mixed[1], food11.preprocess(png))
    np.testing.assert_array_equal(mixed[[0, 2]], _gpu_path(model_py, [jpegs[1], jpegs[2]]))


def test_a_cut_jpeg_on_the_gpu_route_fails_only_its_own_request(model_py, monkeypatch):
    """A JPEG cut short passes the header guards; the GPU route's decoder refuses the batch holding
    it (torchvision's CPU decoder here: "Image is incomplete or truncated"), the CPU decodes that
    batch image by image, and the cut one gets food11's truncated_image."""
    model = _gpu_instance_on_the_cpu(model_py, monkeypatch)
    good = list(_jpegs().values())[:2]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        responses = model.execute([_request(good[0]), _request(truncated_jpeg()), _request(good[1])])
    assert str(responses[1]["error"]).startswith("truncated_image: ")
    for data, response in zip(good, (responses[0], responses[2])):
        np.testing.assert_array_equal(response["IMAGE_TENSOR"], food11.preprocess(data)[None])
    assert any(line.startswith("nvJPEG refused a batch of 3") for line in model_py.logged)


def test_a_batch_nvjpeg_refuses_is_decoded_on_the_cpu_and_a_bad_image_still_fails_alone(model_py, monkeypatch):
    model = _gpu_instance_on_the_cpu(model_py, monkeypatch)

    def refuses(images, device):
        raise RuntimeError("Error while decoding JPEG images: nvjpegDecode failed: 7")   # all or nothing
    monkeypatch.setattr(model_py, "gpu_preprocess", refuses)
    good = list(_jpegs().values())[:2]
    responses = model.execute([_request(good[0]), _request(truncated_jpeg_with_end()), _request(good[1])])
    for data, response in zip((good[0], good[1]), (responses[0], responses[2])):
        np.testing.assert_array_equal(response["IMAGE_TENSOR"], food11.preprocess(data)[None])
    # The CPU decode judges each image of the refused batch: the cut one fails its own request only.
    assert str(responses[1]["error"]).startswith("truncated_image: ")
    assert any(line.startswith("nvJPEG refused a batch of 3, decoding it on the CPU: ") for line in model_py.logged)


def test_what_the_gpu_route_does_not_judge_a_cut_scan_given_its_end_marker_back(model_py, monkeypatch):
    """food11 refuses a one-scan JPEG cut short and given its end marker back (issue 48) while
    decoding it, not from its header: plain_jpeg passes it to the GPU route. Through torchvision's
    CPU decoder (libjpeg) it decodes, its missing blocks filled. What nvJPEG answers is not known
    here (no GPU): gpu-check's decode phase sends it through the GPU path and records it."""
    cut = truncated_jpeg_with_end()
    assert food11.plain_jpeg(cut) is True
    with pytest.raises(food11.TruncatedImageError):
        food11.preprocess(cut)
    model = _gpu_instance_on_the_cpu(model_py, monkeypatch)
    assert set(model.execute([_request(cut)])[0]) == {"IMAGE_TENSOR"}


def test_plain_jpeg_runs_the_guards_and_routes_only_plain_jpegs():
    from PIL import Image

    jpeg = (paths.SAMPLES_DIR / "soup_bowl.jpg").read_bytes()
    assert food11.plain_jpeg(jpeg) is True
    assert food11.plain_jpeg((paths.SAMPLES_DIR / "green_salad.png").read_bytes()) is False
    img = Image.open(io.BytesIO(jpeg))
    for mode, exif in (("CMYK", None), ("RGB", 6), ("L", None), ("RGB", 1)):
        buf = io.BytesIO()
        kw = {}
        if exif is not None:
            e = Image.Exif()
            e[0x0112] = exif
            kw["exif"] = e.tobytes()
        img.convert(mode).save(buf, "JPEG", **kw)
        assert food11.plain_jpeg(buf.getvalue()) is (mode in ("L", "RGB") and exif in (None, 1)), (mode, exif)
    # what the header alone decides; a cut scan is found while decoding (the tests above)
    for code, data in (("not_an_image", b"plain text"), ("image_too_large", scan_bomb_jpeg()),
                       ("image_too_large", bomb_png())):
        with pytest.raises(food11.ImageDecodeError) as err:
            food11.plain_jpeg(data)
        assert err.value.code == code
