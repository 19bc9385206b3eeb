"""``servelab bench``: load a FastAPI service or a Triton model from the shell.

Examples::

    servelab bench fastapi http://127.0.0.1:8011 -c 1,16 -n 200
    servelab bench triton 127.0.0.1:8000 -m food_classifier -c 1,8,16 -d 10 --metrics 127.0.0.1:8002
    servelab bench triton 127.0.0.1:8000 -m food_classifier_onnx --rate 50,100 --distribution poisson -d 10
    servelab bench http http://127.0.0.1:8080/ -c 16 -d 5        # any GET endpoint

Prints a table; ``--out DIR`` also writes results.json, results.csv and plots.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from servelab.bench import http, load, table, targets


def _numbers(kind):
    def parse(s: str):
        try:
            vals = [kind(x) for x in s.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {s!r}") from None
        if not vals or any(v <= 0 for v in vals):
            raise argparse.ArgumentTypeError(f"expected positive numbers, got {s!r}")
        return vals
    return parse


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "bench", help="load-test a FastAPI service or a Triton model",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=("fastapi", "triton", "http"), help="what kind of endpoint")
    p.add_argument("url", nargs="?", help="base URL (fastapi: $FASTAPI_SERVER_URL; triton: host:port, "
                                          "$TRITON_SERVER_URL, default 127.0.0.1:8000)")
    p.add_argument("-m", "--model", default=os.environ.get("FOOD11_MODEL_NAME", "food_classifier"),
                   help="Triton model (default: $FOOD11_MODEL_NAME or food_classifier)")
    p.add_argument("--model-version", default=None, help="Triton model version (default: server's choice)")
    p.add_argument("--grpc", action="store_true", help="Triton over gRPC (url is then the gRPC host:port)")
    p.add_argument("--stats-url", help="Triton HTTP host:port for statistics when --grpc is used")
    p.add_argument("--json-encoding", action="store_true", help="Triton HTTP: plain JSON instead of binary tensors")
    p.add_argument("--metrics", help="Triton metrics host:port to sample CPU/GPU utilization (e.g. 127.0.0.1:8002)")
    p.add_argument("--image", action="append", type=Path, help="image file(s) to send (default: the kit's samples)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("-c", "--concurrency", type=_numbers(int), help="closed loop: clients, e.g. 1,8,16")
    g.add_argument("-r", "--rate", type=_numbers(float), help="open loop: requests/s, e.g. 50,100")
    p.add_argument("--distribution", choices=("constant", "poisson"), default="constant")
    p.add_argument("-n", "--requests", type=int, help="measured requests per run")
    p.add_argument("-d", "--duration", type=float, help="measured seconds per run")
    p.add_argument("--warmup", type=int, help="unmeasured requests first (default: one per client)")
    p.add_argument("--max-in-flight", type=int, default=128, help="open loop: cap on outstanding requests")
    p.add_argument("--timeout", type=float, default=30.0, help="per-request timeout, seconds")
    p.add_argument("--seed", type=int, default=0, help="Poisson schedule seed")
    p.add_argument("--out", type=Path, help="folder for results.json, results.csv and plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_bench)


def build_target(args) -> targets.Target:
    images = [str(x) for x in args.image] if args.image else None
    if args.kind == "fastapi":
        url = args.url or os.environ.get("FASTAPI_SERVER_URL", "http://127.0.0.1:8010")
        return targets.FastAPITarget(url, images, timeout=args.timeout)
    if args.kind == "http":
        if not args.url:
            raise SystemExit("servelab bench http: give the URL to GET")
        host, port, path = http.split_url(args.url)
        return targets.HTTPTarget(f"http://{host}:{port}", path or "/", timeout=args.timeout)
    url = args.url or os.environ.get("TRITON_SERVER_URL", "127.0.0.1:8000")
    if args.grpc:
        return targets.grpc_target(url, args.model, args.model_version, images, args.timeout)
    return targets.triton_target(url, args.model, args.model_version, binary=not args.json_encoding,
                                 images=images, timeout=args.timeout)


def patterns(args) -> list[load.Pattern]:
    if args.requests is None and args.duration is None:
        args.requests = 100
    if args.rate:
        return [load.open_loop(r, args.distribution, args.requests, args.duration,
                               warmup=args.warmup or 0, max_in_flight=args.max_in_flight,
                               seed=args.seed, timeout=args.timeout) for r in args.rate]
    return [load.closed(c, args.requests, args.duration, warmup=args.warmup, timeout=args.timeout)
            for c in (args.concurrency or [1])]


def _observers_factory(args):
    """Fresh observers for each run: Triton's statistics, or the host's CPU when saving results."""
    def observers():
        from servelab.bench.triton import HostCPUObserver, TritonObserver
        if args.kind != "triton":
            return [HostCPUObserver()] if args.out else []
        stats_url = args.stats_url or (None if args.grpc else (args.url or os.environ.get("TRITON_SERVER_URL", "127.0.0.1:8000")))
        if not stats_url:
            return []
        return [TritonObserver(stats_url, args.model, args.model_version, args.metrics)]

    return observers


def _write_outputs(args, target, results) -> None:
    """``--out``: results.json/csv and the plots that fit these runs."""
    from servelab.bench import plots  # matplotlib: only when plots are wanted
    args.out.mkdir(parents=True, exist_ok=True)
    load.save_json(results, args.out / "results.json")
    load.save_csv(results, args.out / "results.csv")
    written = ["results.json", "results.csv"]
    if args.concurrency and len(args.concurrency) > 1:
        plots.latency_vs_concurrency({target.name: results}, args.out / "latency_vs_concurrency.png")
        plots.throughput_vs_concurrency({target.name: results}, args.out / "throughput_vs_concurrency.png")
        written += ["latency_vs_concurrency.png", "throughput_vs_concurrency.png"]
    plots.latency_cdf(results, args.out / "latency_cdf.png")
    written.append("latency_cdf.png")
    if any(r.server for r in results):
        plots.queue_vs_compute(results, args.out / "queue_vs_compute.png")
        plots.batch_histogram(results, args.out / "batch_histogram.png")
        written += ["queue_vs_compute.png", "batch_histogram.png"]
    if any(r.utilization for r in results):
        plots.utilization(results, args.out / "utilization.png")
        written.append("utilization.png")
    print(f"wrote {', '.join(str(args.out / w) for w in written)}")


def _cmd_bench(args) -> int:
    try:
        target = build_target(args)
        pats = patterns(args)
    except (ValueError, OSError) as e:
        print(f"servelab bench: {e}", file=sys.stderr)
        return 2

    observers = _observers_factory(args)

    print(f"target: {target.name}", file=sys.stderr)
    results = load.sweep(target, pats, observers, progress=False if args.no_progress else None)
    print(table.text(results))
    for r in results:
        if r.errors:
            print(f"{r.label}: errors " + ", ".join(f"{k} x{v}" for k, v in r.errors.items()))
    if args.out:
        _write_outputs(args, target, results)
    return 1 if any(r.ok == 0 for r in results) else 0
