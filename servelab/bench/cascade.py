"""The BLS cascade beside the ensemble and the single models (issue 50, item 1).

``food_cascade`` (models_bls/food_cascade/1/model.py) runs food_preprocess and
food_classifier_onnx for each request, and asks food_classifier (PyTorch) only when the
ONNX answer's top probability is below its threshold. This run measures, in one go, on one
Triton, closed loop at 1 and 8 clients, the same photos:

* ``food_classifier`` (PyTorch in the Python backend, base64 photo in);
* ``food_classifier_onnx`` (the client preprocesses: a float32 tensor in);
* ``food_pipeline`` (the ensemble: photo bytes in, three steps in the server);
* ``food_cascade`` (BLS: the ensemble's steps from Python, and the escalation),

each with p50, p99 and throughput, and for the cascade the share escalated, counted by
Triton itself (food_classifier's requests during the cascade's run over the cascade's).

    python -m servelab.bench.cascade [--requests 120] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from servelab.bench import load
from servelab.bench.targets import triton_target
from servelab.bench.triton import TritonObserver
from servelab.triton import stats

MODELS = ("food_classifier", "food_classifier_onnx", "food_pipeline", "food_cascade")
CONCURRENCY = (1, 8)
CASCADE = "food_cascade"


def repository(dest: Path) -> Path:
    """A model repository at ``dest``: the lab's models (links into models_staging/) and the cascade
    (a link to models_bls/food_cascade), which is not one of the lab's standing models."""
    from servelab.core import paths

    dest.mkdir(parents=True, exist_ok=True)
    for folder in [*sorted(p for p in paths.MODELS_STAGING.iterdir() if (p / "config.pbtxt").is_file()),
                   paths.MODELS_BLS / CASCADE]:
        link = dest / folder.name
        if not link.exists():
            link.symlink_to(folder.resolve(), target_is_directory=True)
    return dest


def _requests(url: str, model: str) -> int:
    return int(stats.snapshot(url, model)["inference_stats"]["success"]["count"])


def measure(url: str, requests: int = 120, concurrency=CONCURRENCY, models=MODELS, log=print) -> list[dict]:
    rows = []
    for c in concurrency:
        for model in models:
            target = triton_target(url, model)
            load.warm(target, requests=max(4, c), concurrency=c)
            # Triton's counts of both models around the run (retries of a spoiled run included in both)
            counts = (_requests(url, "food_classifier"), _requests(url, model)) if model == "food_cascade" else None
            r = load.run_checked(target, load.closed(c, requests=requests),
                                 lambda m=model: [TritonObserver(url, m)], label=f"{model} @ {c}", progress=False)
            row = {"model": model, "clients": c, "ok": r.ok, "sent": r.sent, "errors": r.errors,
                   "p50_ms": r.latency["p50_ms"], "p99_ms": r.latency["p99_ms"], "throughput": r.throughput,
                   "verdict": r.verdict, "validity": r.validity}
            if counts is not None:
                row["escalated"] = ((_requests(url, "food_classifier") - counts[0])
                                    / max(1, _requests(url, model) - counts[1]))
            rows.append(row)
            log(line(row))
    return rows


def line(r: dict) -> str:
    s = (f"{r['model']:>21} @ {r['clients']}: p50 {r['p50_ms']:7.1f} ms, p99 {r['p99_ms']:7.1f} ms, "
         f"{r['throughput']:6.1f} req/s ({r['ok']}/{r['sent']} answered)")
    if "escalated" in r:
        s += f", escalated {r['escalated']:.0%}"
    if r["errors"]:
        s += f", errors {r['errors']}"
    return s + ("" if r["verdict"] == "valid" else f" [{r['verdict']}]")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m servelab.bench.cascade", description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=120, help="per model and concurrency")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    import tempfile

    from servelab import triton

    print("starting a local Triton ...", flush=True)
    with tempfile.TemporaryDirectory(prefix="servelab-cascade-") as tmp:
        server = triton.start(repository(Path(tmp) / "models"), **triton.free_ports(), write_state=False)
        try:
            rows = measure(server.url, a.requests)
        finally:
            server.stop()
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
