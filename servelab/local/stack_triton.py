"""The local stack's Triton component (``python -m servelab.local.stack_triton``,
started by ``servelab.local.stack``): a small foreground wrapper around
``servelab.triton`` that stops Triton cleanly on SIGTERM/SIGINT, restarts
a tritonserver that dies on its own, and reloads a model whose Python-backend
stub died (``servelab.triton.supervise``: the model answers not ready until
the reload is done)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Sequence

# Triton refreshes its CPU/GPU utilization metrics this often (default 2000 ms);
# the bench samples the metrics page twice a second.
METRICS_INTERVAL_MS = 500
# A tritonserver that dies on its own (a crash, the OOM killer) is restarted on the same
# ports with the same admin key, at most this many times in this many seconds.
TRITON_RESTARTS = (5, 600.0)


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m servelab.local.stack_triton")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--http-port", type=int, required=True)
    ap.add_argument("--grpc-port", type=int, required=True)
    ap.add_argument("--metrics-port", type=int, required=True)
    ap.add_argument("--workdir", type=Path, default=None)
    # A replica of the scale-out lab (servelab.local.scale): its share of the cores, its models,
    # and how many instances of them.
    ap.add_argument("--cpus", default="", help="comma-separated cores this Triton may use (default: all)")
    ap.add_argument("--models", default="", help="comma-separated models to load (default: all)")
    ap.add_argument("--instances", type=int, default=None, help="instances of each loaded model")
    return ap.parse_args(argv)


def _start(a: argparse.Namespace, previous, restarts: int):
    """Start tritonserver (with ``previous``'s admin key after a crash)."""
    from servelab import triton

    models = [m for m in a.models.split(",") if m] or None
    server = triton.start(host=a.host, http_port=a.http_port, grpc_port=a.grpc_port,
                          metrics_port=a.metrics_port, workdir=a.workdir, models=models,
                          admin_key=previous.admin_key if previous is not None else None,
                          extra_args=[f"--metrics-interval-ms={METRICS_INTERVAL_MS}"],
                          quiet=bool(restarts))
    if a.instances:
        for name in server.models:
            server.reload_model(name, triton.set_instances(a.instances))
            server.wait_for_stubs(name, a.instances)
    print("Triton ready." + (f" (restart {restarts})" if restarts else ""), flush=True)
    return server


def _wait_for_death(server) -> None:
    """Wait until tritonserver dies on its own; say how, and reap its stubs
    and shared memory before it is started again. Meanwhile bring back any
    model whose stub died (servelab.triton.supervise)."""
    from servelab.triton.supervise import StubWatch

    watch = StubWatch(server, log=lambda line: print(line, flush=True))
    stopping = False
    while server.alive():
        try:
            if not stopping:
                watch.tick()
        except Exception as err:   # never let the watch take the server down
            print(f"{time.strftime('%H:%M:%S')} stub watch: {type(err).__name__}: {err}", flush=True)
        if watch.restart_reason and not stopping:
            # Only tritonserver can reap its zombie child: stop it (SIGTERM; the
            # cleanup below reaps what is left) and let main() start it again.
            print(f"{time.strftime('%H:%M:%S')} {watch.restart_reason}; restarting tritonserver to reap it",
                  flush=True)
            server.proc.terminate()
            stopping = True
        time.sleep(0.5)
    code = server.proc.returncode
    how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
    print(f"{time.strftime('%H:%M:%S')} tritonserver died ({how}); Triton's log: {server.log_path}", flush=True)
    forced = server.stop()
    if forced:
        print(f"  cleaned up: {', '.join(forced)}", flush=True)


def _count_crash(crashes: list[float]) -> bool:
    """Record a crash now; False when there were too many lately to restart."""
    now = time.monotonic()
    crashes[:] = [t for t in crashes if now - t < TRITON_RESTARTS[1]] + [now]
    if len(crashes) > TRITON_RESTARTS[0]:
        print(f"tritonserver died {len(crashes)} times in {TRITON_RESTARTS[1]:.0f} s: not restarting it.",
              flush=True)
        return False
    print(f"restarting tritonserver (crash {len(crashes)} of at most {TRITON_RESTARTS[0]} "
          f"in {TRITON_RESTARTS[1]:.0f} s) ...", flush=True)
    return True


def main(argv: Sequence[str]) -> int:
    """Run Triton in the foreground until SIGTERM/SIGINT, then stop it cleanly
    (stubs and shared memory reaped by servelab.triton). If tritonserver
    dies on its own, say so in the log and start it again (the Compose stack
    has ``restart: unless-stopped`` for the same reason)."""
    from servelab import triton

    a = _parse(argv)
    if a.cpus:
        # Inherited by tritonserver and its stubs: their core share (servelab.serve.threads) counts these.
        os.sched_setaffinity(0, {int(c) for c in a.cpus.split(",")})

    def on_signal(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server = None
    crashes: list[float] = []
    try:
        while True:
            try:
                server = _start(a, server, len(crashes))
                _wait_for_death(server)
            except triton.TritonError as err:
                if not crashes:
                    raise  # the first start failed: `servelab up` reports it
                print(f"{time.strftime('%H:%M:%S')} restarting tritonserver failed: {err}", flush=True)
            if not _count_crash(crashes):
                return 1
    except KeyboardInterrupt:
        return 0
    finally:
        if server is not None:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # let the stop finish
            forced = server.stop()
            print("Triton stopped." + (f" cleaned up: {', '.join(forced)}" if forced else ""), flush=True)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
