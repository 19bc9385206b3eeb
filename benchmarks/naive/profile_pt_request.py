"""Profile one sequential FastAPI PyTorch request, stage by stage (issue 36): the kit's
fastapi_pt/app.py beside the plain reference (fastapi_pt_plain.py), each in its own
process, the photo bench_naive.py uses. Wall and CPU per stage (median of --requests).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/naive/profile_pt_request.py kit
    PYTHONPATH=$PWD .venv/bin/python benchmarks/naive/profile_pt_request.py plain

For the kit before a change, point PYTHONPATH (and --kit-dir) at an export of the older
commit: `git archive <commit> servelab fastapi_pt | tar -x -C /tmp/before` (copy the
model files in). The stages of the kit add up to its predict(); the full request adds
FastAPI's part (body parsing, validation, middleware, response model) in-process, without
a socket (the same for both). Not a benchmark of the smoke test: a diagnostic.
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import inspect
import io
import os
import statistics
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def timed(fn, n: int) -> tuple[float, float]:
    for _ in range(5):
        fn()
    wall, cpu = [], []
    for _ in range(n):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall) * 1000, statistics.median(cpu) * 1000


def in_thread(fn):
    """FastAPI runs a `def` endpoint in a worker thread: so do we."""
    t = threading.Thread(target=fn)
    t.start()
    t.join()


def load_app(path: Path):
    os.chdir(path.parent)
    spec = importlib.util.spec_from_file_location(f"profiled_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("which", choices=["kit", "plain"])
    ap.add_argument("--kit-dir", type=Path, default=REPO, help="folder holding fastapi_pt/ (default: this repo)")
    ap.add_argument("--requests", type=int, default=100)
    args = ap.parse_args()
    os.environ.setdefault("MODEL_PATH", str(REPO / "fastapi_pt" / "food11.pth"))
    photo = (REPO / "servelab" / "samples" / "soup_bowl.jpg").read_bytes()
    b64 = base64.b64encode(photo).decode()

    import torch
    from fastapi import Response
    from fastapi.testclient import TestClient

    app = load_app(args.kit_dir / "fastapi_pt" / "app.py" if args.which == "kit" else HERE / "fastapi_pt_plain.py")
    Request = getattr(app, "ImageRequest", None) or app.PredictRequest
    request = Request(image=b64)
    client = TestClient(app.app)
    n = args.requests
    # the kit's predict() also takes the Response it writes Server-Timing on (since issue 47)
    takes_response = "response" in inspect.signature(app.predict).parameters

    def predict():
        return app.predict(request, Response()) if takes_response else app.predict(request)

    stages = {"full request (FastAPI in-process)": timed(lambda: client.post("/predict", json={"image": b64}), n),
              "predict() in a worker thread": timed(lambda: in_thread(predict), n)}
    if args.which == "kit":
        from servelab.core import food11

        x = torch.from_numpy(food11.preprocess_base64(b64)).unsqueeze(0)

        def infer():
            if hasattr(app, "a_share_of_the_cores"):   # the lesson file since issue 47: the rule in the file
                with app.a_share_of_the_cores(), torch.inference_mode():
                    return app.model(x)
            if hasattr(app, "service"):   # issue 27 to 47: one servelab call held the share
                with app.service.inference(), torch.inference_mode():
                    return app.model(x)
            with app.cores.threads() as k, torch.inference_mode():   # before: the share in the lesson file
                if torch.get_num_threads() != k:
                    torch.set_num_threads(k)
                return app.model(x)

        logits = infer()
        stages |= {
            "  decode + preprocess (servelab.core.food11)": timed(lambda: food11.preprocess_base64(b64), n),
            "    of which base64 (food11.decode_base64)": timed(lambda: food11.decode_base64(b64), n),
            "  core share + forward pass": timed(lambda: in_thread(infer), n),
            "  softmax + response dict": timed(lambda: {**food11.predict_from_logits(logits.numpy())[0].as_dict(),
                                                        **app.info.response_fields()}, n),
        }
        where = sys.modules["servelab"].__file__
    else:
        from PIL import Image

        def preprocess():
            return app.transform(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB")).unsqueeze(0)

        x = preprocess()

        def infer():
            with torch.no_grad():
                return app.model(x)

        stages |= {
            "  decode + preprocess (PIL + torchvision)": timed(preprocess, n),
            "    of which base64 (base64.b64decode)": timed(lambda: base64.b64decode(b64), n),
            "  forward pass": timed(lambda: in_thread(infer), n),
        }
        where = "nothing from servelab"
    print(f"{args.which}: servelab from {where}; torch {torch.__version__}, {torch.get_num_threads()} thread(s); "
          f"load average {os.getloadavg()[0]:.1f}; median of {n}")
    for name, (wall, cpu) in stages.items():
        print(f"  {name:46} wall {wall:7.2f} ms   CPU {cpu:7.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
