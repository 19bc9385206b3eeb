"""Soak: many requests at steady concurrency; nothing may fail and no server
process may keep growing.

    .venv/bin/python benchmarks/soak.py [--requests 10000] [--concurrency 16]
                                        [--targets fastapi_onnx,triton_onnx] [--checkpoint 2000]
                                        [--quick | --tiny] [--json PATH]

For each target, on free loopback ports, with servelab.bench's closed-loop
load generator (the lab's own measuring tool):

* ``fastapi_onnx``: fastapi_onnx/app.py under uvicorn (the local stack's way);
* ``triton_onnx``: the real local Triton 2.51 serving ``food_classifier_onnx``
  with ``dynamic_batching`` switched on through the kit's reload helper.

``--requests`` are sent in chunks of ``--chunk``; after each chunk the resident
memory (RSS, psutil) of every server process is sampled — tritonserver and
each Python-backend stub separately. Passes when no request failed and every
process grew by less than ``--max-growth`` (10 %) between the ``--checkpoint``
request and the last one (the first requests warm caches, allocators and
shared memory, so growth before the checkpoint is expected). Prints a table
per target and a verdict; writes ``results/soak/soak-<time>.json`` (or ``--json``). Exit 1 on
a failed request or too much growth.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import psutil

from servelab import bench, paths, procs
from servelab.bench import script

TARGETS = ("fastapi_onnx", "triton_onnx")


def _rss_by_process(pid: int) -> dict[str, int]:
    """RSS of a server and its descendants, keyed 'name pid'."""
    out = {}
    try:
        root = psutil.Process(pid)
        members = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return out
    for p in members:
        try:
            name = p.name()
            if name.startswith("python"):
                name = "uvicorn" if "uvicorn" in " ".join(p.cmdline()) else name
            out[f"{name} {p.pid}"] = p.memory_info().rss
        except psutil.Error:
            continue
    return out


def soak(target, server_pid: int, requests: int, concurrency: int, chunk: int, label: str) -> dict:
    """Run ``requests`` in chunks; sample RSS after each; return the record."""
    # Warm-up (not counted): connections, allocators, first batches.
    bench.run(target, bench.closed(concurrency, requests=concurrency * 4, warmup=0), progress=False)
    samples = [{"requests": 0, "rss": _rss_by_process(server_pid)}]
    chunks, sent, ok, errors = [], 0, 0, {}
    t0 = time.perf_counter()
    while sent < requests:
        n = min(chunk, requests - sent)
        r = bench.run(target, bench.closed(concurrency, requests=n, warmup=0), progress=False)
        sent += r.sent
        ok += r.ok
        for k, v in r.errors.items():
            errors[k] = errors.get(k, 0) + v
        chunks.append({"requests": sent, "throughput": r.throughput, "p50_ms": r.latency.get("p50_ms"),
                       "p99_ms": r.latency.get("p99_ms"), "errors": r.error_count})
        samples.append({"requests": sent, "rss": _rss_by_process(server_pid)})
        print(f"  {label}: {sent:>6} requests, {r.throughput:6.1f} req/s, p50 {r.latency.get('p50_ms', 0):6.1f} ms, "
              f"p99 {r.latency.get('p99_ms', 0):6.1f} ms, errors {r.error_count}, "
              f"RSS {sum(samples[-1]['rss'].values()) / 2**20:7.1f} MiB", flush=True)
    return {"label": label, "sent": sent, "ok": ok, "errors": errors, "wall_s": time.perf_counter() - t0,
            "chunks": chunks, "samples": samples}


def growth(record: dict, checkpoint: int) -> dict[str, dict]:
    """Per process: RSS at the checkpoint and at the end, and the growth."""
    at = min((s for s in record["samples"] if s["requests"] >= checkpoint), key=lambda s: s["requests"])
    end = record["samples"][-1]
    out = {}
    for proc, rss_end in end["rss"].items():
        rss_at = at["rss"].get(proc)
        if rss_at:
            out[proc] = {"at_checkpoint": rss_at, "at_end": rss_end, "growth": rss_end / rss_at - 1.0,
                         "checkpoint": at["requests"], "end": end["requests"]}
    total_at, total_end = sum(at["rss"].values()), sum(end["rss"].values())
    out["total"] = {"at_checkpoint": total_at, "at_end": total_end, "growth": total_end / total_at - 1.0,
                    "checkpoint": at["requests"], "end": end["requests"]}
    return out


def run_fastapi_onnx(args) -> dict:
    from servelab import stack

    with stack.running(["fastapi_onnx"], free_ports=True) as st:
        server = st.servers["fastapi_onnx"]
        target = bench.FastAPITarget(st.urls["fastapi_onnx"])
        return soak(target, server.pid, args.requests, args.concurrency, args.chunk, "fastapi_onnx")


def run_triton_onnx(args) -> dict:
    from servelab import triton

    with triton.running(models=["food_classifier_onnx"], http_port=procs.free_port(),
                        grpc_port=procs.free_port(), metrics_port=procs.free_port(),
                        write_state=False) as t:
        cfg = t.reload_model("food_classifier_onnx", {"dynamic_batching": {}}, verbose=False)
        assert "dynamic_batching" in cfg, cfg
        before = t.snapshot("food_classifier_onnx")
        target = bench.triton_tensor_target(t.url, "food_classifier_onnx")
        record = soak(target, t.pid, args.requests, args.concurrency, args.chunk, "triton_onnx (dynamic batching)")
        delta = triton.stats_delta(before, t.snapshot("food_classifier_onnx"))
        record["triton_stats"] = {k: delta[k] for k in ("avg_batch_size", "batch_histogram", "failures", "requests")}
        record["stubs"] = [s.pid for s in t.stub_processes()]
        return record


def main(argv=None) -> int:
    ap = script.Parser(__doc__)
    ap.sized("--requests", type=int, full=10_000, quick=2_000, tiny=40)
    ap.sized("--concurrency", type=int, full=16, tiny=4)
    ap.sized("--checkpoint", type=int, full=2_000, quick=500, tiny=20, help="growth is measured from this request on")
    ap.sized("--chunk", type=int, full=1_000, quick=250, tiny=10, help="requests between memory samples")
    ap.add_argument("--max-growth", type=float, default=0.10)
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--out", dest="json", type=Path, help=argparse.SUPPRESS)  # the old name of --json
    args = ap.parse_args(argv)
    targets = [t for t in args.targets.split(",") if t]
    for t in targets:
        if t not in TARGETS:
            ap.error(f"unknown target {t!r}; choose from {', '.join(TARGETS)}")
    if args.checkpoint >= args.requests:
        ap.error("--checkpoint must be below --requests")

    print(f"soak: {args.requests} requests at concurrency {args.concurrency} per target; "
          f"RSS growth limit {args.max_growth:.0%} from request {args.checkpoint} to the end", flush=True)
    records, failed = [], False
    for name in targets:
        rec = (run_fastapi_onnx if name == "fastapi_onnx" else run_triton_onnx)(args)
        rec["growth"] = growth(rec, args.checkpoint)
        records.append(rec)

    print("\n=== soak summary ===")
    for rec in records:
        n_err = sum(rec["errors"].values())
        print(f"{rec['label']}: {rec['sent']} sent, {rec['ok']} ok, {n_err} failed {rec['errors'] or ''}, "
              f"{rec['sent'] / rec['wall_s']:.1f} req/s over {rec['wall_s']:.0f} s")
        if "triton_stats" in rec:
            ts = rec["triton_stats"]
            print(f"  Triton: average batch {ts['avg_batch_size'] or 0:.2f}, batch sizes {ts['batch_histogram']}, "
                  f"server-side failures {ts['failures']}")
        print(f"  {'process':<36} {'RSS @' + str(rec['growth']['total']['checkpoint']):>12} "
              f"{'RSS @' + str(rec['growth']['total']['end']):>12} {'growth':>8}")
        for proc, g in rec["growth"].items():
            verdict = "ok" if g["growth"] < args.max_growth else "TOO MUCH"
            print(f"  {proc:<36} {g['at_checkpoint'] / 2**20:>9.1f} MiB {g['at_end'] / 2**20:>9.1f} MiB "
                  f"{g['growth']:>+7.1%}  {verdict}")
            if proc != "total" and g["growth"] >= args.max_growth:
                failed = True
        if n_err or rec["ok"] != rec["sent"] or rec["sent"] != args.requests:
            failed = True

    out = args.json or paths.REPO_ROOT / "results" / "soak" / f"soak-{time.strftime('%Y%m%d-%H%M%S')}.json"
    script.write_json(out, {"args": vars(args) | {"json": str(out)}, "records": records})
    print(f"\nverdict: {'FAIL' if failed else 'PASS'} (0 failed requests and every process < "
          f"{args.max_growth:.0%} RSS growth required)   figures: {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    script.run(main)
