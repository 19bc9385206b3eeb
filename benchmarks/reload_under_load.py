"""Live reconfiguration under load: reload a Triton model three times while
closed-loop clients keep sending, and count what fails.

    .venv/bin/python benchmarks/reload_under_load.py [--model food_classifier] [--concurrency 8]
                                                     [--settle 3] [--quick | --tiny] [--json PATH]

Starts the real local Triton 2.51 (free loopback ports), puts ``--concurrency``
closed-loop HTTP clients on ``--model``, and, through the kit's reload helper
(``TritonServer.reload_model``: edits the runtime repository's config, then
``load_model`` over gRPC with the admin key), applies in turn:

1. ``instance_group`` count 2 and ``dynamic_batching {}``;
2. count 1, ``dynamic_batching`` removed;
3. count 2 and ``dynamic_batching { max_queue_delay_microseconds: 1000 }``.

After each reload it checks the config Triton reports and the number of stub
processes. Prints every figure: requests, failures (status, message, when
relative to the reload), reload durations, latency before/during/after.
Exit 1 if any client request failed. ``measure()`` is what the test calls.
"""

from __future__ import annotations

import argparse
import base64
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from servelab.bench import script, stats
from servelab.bench.targets import triton_infer_body
from servelab.core import food11, paths, procs

EDITS = (
    ("count 2 + dynamic_batching", {"instance_group": [{"count": 2, "kind": "KIND_CPU"}], "dynamic_batching": {}}),
    ("count 1, no dynamic_batching", {"instance_group": [{"count": 1, "kind": "KIND_CPU"}], "dynamic_batching": None}),
    ("count 2 + dynamic_batching 1 ms", {"instance_group": [{"count": 2, "kind": "KIND_CPU"}],
                                         "dynamic_batching": {"max_queue_delay_microseconds": 1000}}),
)


@dataclass
class Sample:
    t_send: float
    t_done: float
    status: int        # HTTP status, 0 = no answer (connection error / timeout)
    error: str = ""


@dataclass
class Load:
    """Closed-loop clients: each sends its next request when the last returns."""

    url: str
    model: str
    concurrency: int
    timeout: float = 60.0
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _body(self):
        images = [p.read_bytes() for p in paths.sample_images()]
        if self.model == "food_classifier_onnx":
            return [triton_infer_body([("input", "FP32", [1, 3, 224, 224], food11.preprocess(b)[None])], ["output"])
                    for b in images]
        return [triton_infer_body([("INPUT_IMAGE", "BYTES", [1, 1], [base64.b64encode(b)])],
                                  ["FOOD_LABEL", "PROBABILITY"]) for b in images]

    def _worker(self, k: int, bodies) -> None:
        session = requests.Session()
        i = k
        while not self._stop.is_set():
            body, headers = bodies[i % len(bodies)]
            i += 1
            t0 = time.perf_counter()
            try:
                r = session.post(f"{self.url}/v2/models/{self.model}/infer", data=body, headers=headers,
                                 timeout=self.timeout)
                s = Sample(t0, time.perf_counter(), r.status_code, "" if r.status_code == 200 else r.text[:300])
            except requests.RequestException as err:
                s = Sample(t0, time.perf_counter(), 0, f"{type(err).__name__}: {err}"[:300])
                session.close()
                session = requests.Session()
            with self._lock:
                self.samples.append(s)
        session.close()

    def start(self) -> "Load":
        bodies = self._body()
        for k in range(self.concurrency):
            th = threading.Thread(target=self._worker, args=(k, bodies), daemon=True, name=f"load-{k}")
            th.start()
            self._threads.append(th)
        return self

    def stop(self) -> None:
        self._stop.set()
        for th in self._threads:
            th.join(timeout=self.timeout + 5)

    def count(self) -> int:
        with self._lock:
            return len(self.samples)


def measure(server, model: str = "food_classifier", concurrency: int = 8, settle: float = 3.0,
            edits=EDITS, log=print) -> dict:
    """Run the load, apply ``edits`` one by one, return every figure."""
    load = Load(server.http_url, model, concurrency).start()
    reloads = []
    try:
        time.sleep(settle)  # baseline
        for name, edit in edits:
            t0 = time.perf_counter()
            reported = server.reload_model(model, edit, verbose=False)
            t1 = time.perf_counter()
            want = sum(int(g.get("count", 1)) for g in edit.get("instance_group", [])) or None
            # The old instances' stubs exit a moment after the new ones are ready.
            deadline = time.monotonic() + 20
            stubs = server.stub_processes(model)
            while want and len(stubs) != want and time.monotonic() < deadline:
                time.sleep(0.2)
                stubs = server.stub_processes(model)
            reloads.append({
                "edit": name, "t_start": t0, "t_end": t1, "duration_s": t1 - t0,
                "reported_instances": sum(int(g.get("count", 1)) for g in reported.get("instance_group", [])),
                "reported_dynamic_batching": "dynamic_batching" in reported,
                "wanted_instances": want, "stubs": len(stubs),
                "wanted_dynamic_batching": edit.get("dynamic_batching") is not None,
            })
            if log:
                log(f"  reload {len(reloads)} ({name}): {t1 - t0:.2f} s; Triton reports "
                    f"{reloads[-1]['reported_instances']} instance(s), dynamic_batching "
                    f"{'on' if reloads[-1]['reported_dynamic_batching'] else 'off'}; {len(stubs)} stub(s)")
            time.sleep(settle)
    finally:
        load.stop()
    samples = sorted(load.samples, key=lambda s: s.t_send)
    failed = [s for s in samples if s.status != 200]
    first = reloads[0]["t_start"] if reloads else samples[-1].t_done

    def during(s: Sample) -> bool:
        return any(s.t_done >= r["t_start"] and s.t_send <= r["t_end"] for r in reloads)

    base = [(s.t_done - s.t_send) * 1000 for s in samples if s.t_done < first and s.status == 200]
    dur = [(s.t_done - s.t_send) * 1000 for s in samples if during(s) and s.status == 200]
    failures = [{"status": s.status, "error": s.error, "t_since_first_reload_s": s.t_send - first,
                 "during_reload": during(s)} for s in failed]
    window = (max(s.t_done for s in failed) - min(s.t_send for s in failed)) if failed else 0.0
    return {
        "model": model, "concurrency": concurrency, "requests": len(samples), "failed": len(failed),
        "failures": failures[:50], "failure_window_s": window, "reloads": reloads,
        "latency_ms": {"baseline_p50": stats.percentile(base, 50), "baseline_p99": stats.percentile(base, 99),
                       "during_reload_p50": stats.percentile(dur, 50),
                       "during_reload_max": max(dur) if dur else float("nan")},
        "throughput": len(samples) / (samples[-1].t_done - samples[0].t_send) if samples else 0.0,
    }


def report(rec: dict) -> str:
    lines = [f"model {rec['model']}, {rec['concurrency']} closed-loop clients: {rec['requests']} requests, "
             f"{rec['failed']} failed, {rec['throughput']:.1f} req/s overall"]
    for i, r in enumerate(rec["reloads"], 1):
        ok = (r["reported_instances"] == r["wanted_instances"] and r["stubs"] == r["wanted_instances"]
              and r["reported_dynamic_batching"] == r["wanted_dynamic_batching"])
        lines.append(f"  reload {i}: {r['edit']:<34} {r['duration_s']:5.2f} s  instances {r['reported_instances']} "
                     f"(stubs {r['stubs']})  dynamic_batching {'on' if r['reported_dynamic_batching'] else 'off'}"
                     f"  {'as asked' if ok else 'NOT AS ASKED'}")
    lat = rec["latency_ms"]
    lines.append(f"  latency: baseline p50 {lat['baseline_p50']:.0f} ms / p99 {lat['baseline_p99']:.0f} ms; "
                 f"requests overlapping a reload p50 {lat['during_reload_p50']:.0f} ms, "
                 f"max {lat['during_reload_max']:.0f} ms")
    if rec["failed"]:
        lines.append(f"  failures within {rec['failure_window_s']:.2f} s:")
        for f in rec["failures"][:10]:
            lines.append(f"    +{f['t_since_first_reload_s']:.2f} s  HTTP {f['status']}  "
                         f"{'(during a reload) ' if f['during_reload'] else ''}{f['error'][:160]}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = script.Parser(__doc__)
    ap.add_argument("--model", default="food_classifier", choices=["food_classifier", "food_classifier_onnx"])
    ap.sized("--concurrency", type=int, full=8, tiny=2)
    ap.sized("--settle", type=float, full=3.0, quick=1.5, tiny=0.3,
             help="seconds of load before, between and after reloads")
    ap.add_argument("--out", dest="json", type=Path, help=argparse.SUPPRESS)  # the old name of --json
    args = ap.parse_args(argv)
    from servelab import triton

    with triton.running(models=[args.model], http_port=procs.free_port(), grpc_port=procs.free_port(),
                        metrics_port=procs.free_port(), write_state=False) as t:
        print(f"Triton ready on {t.http_url}; {args.concurrency} clients on {args.model}; 3 reloads", flush=True)
        rec = measure(t, args.model, args.concurrency, args.settle)
    print(report(rec))
    out = script.write_json(args.json or paths.REPO_ROOT / "results" / "reload"
                            / f"reload-{time.strftime('%Y%m%d-%H%M%S')}.json", rec)
    print(f"verdict: {'PASS' if rec['failed'] == 0 else 'FAIL'} ({rec['failed']} failed client requests)   "
          f"figures: {out}")
    return 0 if rec["failed"] == 0 else 1


if __name__ == "__main__":
    script.run(main)
