"""Local Triton figures, measured side by side in one run (prints them).

1. ONNX: raw ONNX Runtime at batch 16 (images/s, same session options as
   the local runner) vs ``food_classifier_onnx`` served by the local Triton
   (servelab's Python-backend runner on onnxruntime) with dynamic batching,
   perf_analyzer at concurrency 16. Target: Triton >= 0.95 x raw ORT.
2. PyTorch: ``food_classifier`` (Python backend) at concurrency 8 with
   ``instance_group count: 2`` vs ``count: 1`` (model.py gives an instance
   alone every core, busy instances a share each). Target on 2 cores: >= 1.6x.

Each Triton run is paired with a raw-ORT run just before it, and the
count 1 / count 2 runs alternate, so slow drift on a shared machine hits
both sides. CPU time per image/inference is printed too: unlike images/s,
it does not depend on what else the machine is running. Usage::

    python benchmarks/bench_triton.py [--window-ms 5000 | --window-requests N] [--rounds 2] [--quick | --tiny] [--json out.json]
"""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

from servelab import triton
from servelab.bench import script
from servelab.core import food11, paths, procs
from servelab.triton import perf

ONNX_MODEL = "food_classifier_onnx"
PT_MODEL = "food_classifier"
ONNX_TARGET = 0.95
COUNT_TARGET = 1.6


class RawOrt:
    """ONNX Runtime alone at batch 16 on real preprocessed samples, with the
    session options the runner uses for one instance."""

    def __init__(self):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = procs.cpu_cores()
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as the runner
        self.session = ort.InferenceSession(str(paths.MODELS_STAGING / ONNX_MODEL / "1" / "model.onnx"),
                                            options, providers=["CPUExecutionProvider"])
        images = food11.preprocess_batch([p.read_bytes() for p in paths.sample_images()])
        self.batch = np.ascontiguousarray(np.resize(images, (16, *images.shape[1:])), dtype=np.float32)
        for _ in range(3):
            self.session.run(["output"], {"input": self.batch})

    def measure(self, seconds: float) -> tuple[float, float]:
        """(images/s, CPU ms per image)."""
        start, cpu0, runs = time.perf_counter(), time.process_time(), 0
        while time.perf_counter() - start < seconds:
            self.session.run(["output"], {"input": self.batch})
            runs += 1
        return runs * 16 / (time.perf_counter() - start), (time.process_time() - cpu0) * 1000 / (runs * 16)


def perf_window(window_ms: int, window_requests: int = 0) -> str:
    # Three windows, averaged by perf_analyzer; no stability retries, so the
    # run takes a known time on a noisy machine. With window_requests, each window
    # lasts until that many requests have completed (at least 1 s): a smoke run
    # that is quick when the machine is, and never records nothing when it is not.
    if window_requests:
        return (f"--measurement-mode count_windows --measurement-request-count {window_requests} "
                "--stability-percentage 999 --max-trials 3")
    return f"--measurement-interval {window_ms} --stability-percentage 999 --max-trials 3"


def run_perf(args: str, window: str) -> dict:
    result = perf.run(f"{args} {window}", timeout=600)
    return result.results[0]


# Dynamic-batching settings tried. With 16 clients and batches of 16, every
# client waits on the batch being computed and the instance idles while the
# next 16 requests arrive; preferred batches of 8 keep one batch queued while
# the other runs (a pipeline), at the same max_batch_size of 16.
ONNX_BATCHING = {
    "preferred16": {"max_queue_delay_microseconds": 50000, "preferred_batch_size": [16]},
    "preferred8": {"max_queue_delay_microseconds": 50000, "preferred_batch_size": [8]},
}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bench_onnx(t, window: str, ort_seconds: float) -> dict:
    """Each Triton run is paired with a raw-ORT run just before it, so both
    sides of a ratio see the same machine. Besides images/s, CPU ms per
    image (server + stub + perf_analyzer vs ORT alone) compares the work
    done independently of what else the machine runs."""
    raw = RawOrt()
    shape = "--shape input:3,224,224"
    figures = {}
    for name, batching in ONNX_BATCHING.items():
        reported = t.reload_model(ONNX_MODEL, {"dynamic_batching": batching})
        t.wait_for_stubs(ONNX_MODEL, 1)
        print(f"  {triton.describe_config(reported)}")
        for proto, client in (("http", f"-u {t.url}"), ("grpc", f"-i grpc -u {t.grpc_url}"),
                              # The client puts its tensors in system shared memory
                              # once; requests carry a reference, not 602 KB each.
                              # Registering shared memory is an admin API: it sends the key.
                              ("http+shm", f"-u {t.url} --shared-memory system -H admin-key:{t.admin_key}")):
            ort_rate, ort_cpu = raw.measure(ort_seconds)
            before = t.snapshot(ONNX_MODEL)
            pids = [s.pid for s in t.stub_processes(ONNX_MODEL)] + [t.pid]
            cpu0, child0 = sum(_cpu_seconds(p) for p in pids), _children_cpu()
            r = run_perf(f"{client} -m {ONNX_MODEL} -b 1 {shape} --concurrency-range 16", window)
            delta = triton.stats_delta(before, t.snapshot(ONNX_MODEL))
            cpu = sum(_cpu_seconds(p) for p in pids) - cpu0 + _children_cpu() - child0
            tri_cpu = cpu * 1000 / max(1, delta["inferences"])
            label = f"{name}/{proto}"
            figures[label] = {"infer_per_s": r["throughput"], "avg_batch_size": delta["avg_batch_size"],
                              "p50_ms": r["p50_latency_us"] / 1000, "raw_ort_images_per_s": ort_rate,
                              "ratio": r["throughput"] / ort_rate, "cpu_ms_per_image": tri_cpu,
                              "raw_ort_cpu_ms_per_image": ort_cpu, "cpu_ratio": ort_cpu / tri_cpu}
            print(f"  {label:20}: Triton {r['throughput']:6.1f} images/s (batch {delta['avg_batch_size'] or 0:4.1f}, "
                  f"p50 {r['p50_latency_us'] / 1000:3.0f} ms) vs raw ORT {ort_rate:6.1f} = {r['throughput'] / ort_rate:.2f}; "
                  f"CPU/image {tri_cpu:4.1f} vs {ort_cpu:4.1f} ms = {ort_cpu / tri_cpu:.2f}")
    return figures


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_counts(t, window: str, rounds: int, input_dir: Path) -> dict:
    """Throughput, plus CPU time per inference and cores the server got:
    on a shared machine the last one explains the first."""
    figures: dict = {1: [], 2: []}
    for _ in range(rounds):
        for count in (1, 2):
            t.reload_model(PT_MODEL, triton.set_instances(count))  # the config's kind (and GPU) kept
            t.wait_for_stubs(PT_MODEL, count)
            before = t.snapshot(PT_MODEL)
            pids = [s.pid for s in t.stub_processes(PT_MODEL)] + [t.pid]
            cpu0, wall0 = sum(_cpu_seconds(p) for p in pids), time.perf_counter()
            cwd = os.getcwd()
            os.chdir(input_dir)
            try:
                r = run_perf(f"-u {t.url} -m {PT_MODEL} --input-data input.json -b 1 --concurrency-range 8", window)
            finally:
                os.chdir(cwd)
            delta = triton.stats_delta(before, t.snapshot(PT_MODEL))
            cpu = sum(_cpu_seconds(p) for p in pids) - cpu0
            cores = cpu / (time.perf_counter() - wall0)
            per_request = delta["per_request_ms"]
            figures[count].append(r["throughput"])
            print(f"  {PT_MODEL} count {count} ({max(1, procs.cpu_cores() // count)} thread(s) each when all busy), "
                  f"c8: {r['throughput']:6.1f} infer/s, compute {per_request.get('compute_infer', 0.0):3.0f} ms, "
                  f"queue {per_request.get('queue', 0.0):3.0f} ms, CPU {cpu / max(1, delta['inferences']) * 1000:4.1f} "
                  f"ms/inference, server used {cores:.2f} of {procs.cpu_cores()} cores")
    return {c: sum(v) / len(v) for c, v in figures.items()} | {"runs": figures}


def main(argv=None) -> int:
    ap = script.Parser(__doc__, rounds=2)  # rounds: count 1 / count 2 alternations
    ap.sized("--window-ms", type=int, full=5000, quick=2500, tiny=2500, help="perf_analyzer measurement window")
    ap.sized("--window-requests", type=int, full=0, quick=0, tiny=16,
             help="perf_analyzer count windows of this many requests instead of time windows (0: --window-ms)")
    ap.sized("--ort-seconds", type=float, full=6.0, quick=2.0, tiny=0.3)
    ap.add_argument("--skip-onnx", action="store_true")
    ap.add_argument("--skip-counts", action="store_true")
    ap.add_argument("--omp-wait-policy", choices=["PASSIVE", "ACTIVE"], default=None,
                    help="OMP_WAIT_POLICY for the server (servelab sets none: libgomp's default)")
    args = ap.parse_args(argv)
    if args.omp_wait_policy:
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy

    window = perf_window(args.window_ms, args.window_requests)
    input_dir = paths.INPUT_JSON.parent
    if not paths.INPUT_JSON.exists():
        print("input.json is missing: run `python -m servelab samples input-json`", file=sys.stderr)
        return 2
    perf.install_shim()
    print(f"machine: {procs.cpu_cores()} cores, load average {os.getloadavg()[0]:.1f} at start, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset (libgomp default)')}")
    out: dict = {"cores": procs.cpu_cores(), "load_start": os.getloadavg()[0]}
    with triton.running(http_port=procs.free_port(), grpc_port=procs.free_port(),
                        metrics_port=procs.free_port(), write_state=False) as t:
        print(f"local Triton {t.url}: {ONNX_MODEL} runs on servelab's onnxruntime runner (Python backend)")
        if not args.skip_onnx:
            print("\n[1] ONNX Runtime batch 16 vs Triton food_classifier_onnx with dynamic batching, concurrency 16")
            tri = bench_onnx(t, window, args.ort_seconds)
            lab = tri["preferred16/http"]
            best = max(tri, key=lambda k: tri[k]["ratio"])
            print(f"  => Triton / raw ORT (images/s): the lab's command (preferred16/http) {lab['ratio']:.2f}, "
                  f"best {best} {tri[best]['ratio']:.2f}; CPU efficiency {lab['cpu_ratio']:.2f} / "
                  f"{tri[best]['cpu_ratio']:.2f} (target >= {ONNX_TARGET})")
            out["onnx"] = {"runs": tri, "ratio_lab_command": lab["ratio"], "best": best,
                           "ratio_best": tri[best]["ratio"]}
        if not args.skip_counts:
            print("\n[2] food_classifier (PyTorch, Python backend) at concurrency 8: count 2 vs count 1")
            counts = bench_counts(t, window, args.rounds, input_dir)
            ratio = counts[2] / counts[1]
            print(f"  => count 2 / count 1 = {counts[2]:.1f} / {counts[1]:.1f} = {ratio:.2f} "
                  f"(target >= {COUNT_TARGET})")
            out["counts"] = {"count1_infer_per_s": counts[1], "count2_infer_per_s": counts[2],
                             "ratio": ratio, "runs": counts["runs"]}
    out["load_end"] = os.getloadavg()[0]
    print(f"\nload average {out['load_end']:.1f} at the end (figures from a shared machine vary with it)")
    script.write_json(args.json, out)
    return 0


if __name__ == "__main__":
    script.run(main)
