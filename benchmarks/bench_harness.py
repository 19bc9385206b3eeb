"""How many requests per second can servelab.bench generate on this machine?

The harness must never be the bottleneck of a lab measurement. This script
starts trivial local endpoints in separate processes (a bare asyncio HTTP/1.1
responder, and uvicorn serving a one-line ASGI app) and drives them with the
bench's closed and open loops, then, for comparison, with an aiohttp client
doing the same closed loop. Client and server share this machine's cores, so
the figures are a lower bound on the client's own capacity.

    .venv/bin/python benchmarks/bench_harness.py [--duration 3] [--quick | --tiny] [--json PATH]

Target: >= 2,000 requests/s sustained: the closed loop's best rate, and an
open loop offered 2,000/s (constant and Poisson) achieving >= 95 % of it
with no errors and >= 95 % of sends within 5 ms of their scheduled time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

from servelab import bench
from servelab.bench import script
from servelab.core import procs

TARGET_RPS = 2000
REPLY = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"


class _Trivial(asyncio.Protocol):
    def connection_made(self, transport):
        self.t, self.buf = transport, b""

    def data_received(self, data):
        self.buf += data
        while (i := self.buf.find(b"\r\n\r\n")) >= 0:  # GETs only: no body
            self.buf = self.buf[i + 4:]
            self.t.write(REPLY)


def serve_raw(port: int) -> None:
    async def main():
        srv = await asyncio.get_running_loop().create_server(_Trivial, "127.0.0.1", port)
        await srv.serve_forever()
    asyncio.run(main())


async def asgi_app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


def start_server(kind: str):
    port = procs.free_port()
    if kind == "raw":
        cmd = [sys.executable, __file__, "--serve-raw", str(port)]
    else:
        cmd = [sys.executable, "-m", "uvicorn", "--app-dir", str(Path(__file__).parent), "bench_harness:asgi_app",
               "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log"]
    srv = procs.start(f"trivial-{kind}", cmd, f"http://127.0.0.1:{port}/")
    procs.wait_http_ok(srv.url, timeout=30, server=srv)
    return srv


def aiohttp_closed(url: str, concurrency: int, duration: float) -> float:
    import aiohttp

    async def main():
        done = 0
        deadline = time.perf_counter() + duration
        conn = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=conn) as s:
            async def worker():
                nonlocal done
                while time.perf_counter() < deadline:
                    async with s.get(url) as r:
                        await r.read()
                        done += 1
            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            return done / (time.perf_counter() - t0)
    return asyncio.run(main())


def main(argv=None) -> int:
    ap = script.Parser(__doc__)
    ap.sized("--duration", type=float, full=3.0, quick=1.0, tiny=0.3, help="seconds per measurement")
    ap.add_argument("--serve-raw", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_raw:
        serve_raw(args.serve_raw)
        return 0

    print(f"servelab.bench harness capacity ({os.cpu_count()} CPUs; client and server share them)")
    print(f"{'endpoint':<10} {'client / pattern':<34} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'late':>6} {'errors':>6}")
    best = {}
    ok = True
    for kind in ("raw", "uvicorn"):
        srv = start_server(kind)
        try:
            t = bench.HTTPTarget(srv.url, "/")
            runs = [(f"bench closed C={c}", bench.closed(c, duration=args.duration, warmup=c * 10))
                    for c in (1, 16, 64)]
            runs += [(f"bench open {r}/s {d}", bench.open_loop(r, d, duration=args.duration, warmup=200,
                                                               max_in_flight=256))
                     for r, d in ((TARGET_RPS, "constant"), (TARGET_RPS, "poisson"))]
            for name, pat in runs:
                r = bench.run(t, pat, progress=False)
                late = "" if r.late is None else str(r.late)
                print(f"{kind:<10} {name:<34} {r.throughput:9.0f} {r.latency['p50_ms']:8.3f} "
                      f"{r.latency['p99_ms']:8.3f} {late:>6} {r.error_count:6d}")
                best[(kind, name)] = r
            try:
                rps = aiohttp_closed(srv.url, 16, args.duration)
            except ImportError:  # aiohttp is only the yardstick, not a dependency
                rps = None
            if rps is not None:
                print(f"{kind:<10} {'aiohttp closed C=16 (comparison)':<34} {rps:9.0f}")
                best[(kind, "aiohttp")] = rps
        finally:
            srv.stop()

    closed_best = max(r.throughput for (k, n), r in best.items() if n.startswith("bench closed"))
    print()
    print(f"closed-loop capacity: {closed_best:,.0f} req/s (best of the runs above; target >= {TARGET_RPS:,})")
    for kind in ("raw", "uvicorn"):
        if (kind, "aiohttp") not in best:
            continue
        ratio = best[(kind, "bench closed C=16")].throughput / best[(kind, "aiohttp")]
        print(f"bench vs aiohttp client, C=16 on {kind}: {ratio:.2f}x")
    for name in (f"bench open {TARGET_RPS}/s constant", f"bench open {TARGET_RPS}/s poisson"):
        r = best[("raw", name)]
        on_time = 1 - r.late / r.sent
        print(f"open loop {name.split('open ')[1]} on raw: achieved {r.throughput:,.0f} req/s, "
              f"{on_time:.1%} sent on time, {r.error_count} errors")
        ok &= r.error_count == 0 and r.throughput >= 0.95 * TARGET_RPS and on_time >= 0.95
    ok &= closed_best >= TARGET_RPS
    print("PASS" if ok else "FAIL", f"harness sustains >= {TARGET_RPS:,} req/s")
    script.write_json(args.json, {
        "cpus": os.cpu_count(), "duration_s": args.duration, "target_rps": TARGET_RPS, "pass": bool(ok),
        "closed_best_rps": closed_best,
        "runs": [{"endpoint": k, "run": n, "throughput": r} if not hasattr(r, "throughput") else
                 {"endpoint": k, "run": n, "throughput": r.throughput, "p50_ms": r.latency["p50_ms"],
                  "p99_ms": r.latency["p99_ms"], "late": r.late, "errors": r.error_count}
                 for (k, n), r in best.items()]})
    return 0 if ok else 1


if __name__ == "__main__":
    script.run(main)
