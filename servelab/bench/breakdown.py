"""Where each request's time goes: Triton's traces and the client's own clock, one
breakdown per model and concurrency (issue 51).

``measure(url, admin_key, model, concurrency, n)`` sends ``n`` requests from
``concurrency`` closed-loop clients (each request pre-encoded, binary tensors, its own
``id``), with Triton tracing every one (``servelab.triton.trace.Tracing``); each request's
send and receive instants are read with ``time.monotonic_ns``, Triton's steady clock on
the same machine. ``summary`` gives each stage's p50 and p99, the client's p50 and p99,
and the sum check: the stages' p50s against the client's p50.

    python -m servelab.bench.breakdown                 # starts its own local Triton
    python -m servelab.bench.breakdown --url 127.0.0.1:8000 --admin-key ...
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path

from servelab.bench.stats import percentile
from servelab.bench.targets import triton_target
from servelab.triton.trace import STAGES, Tracing, timelines

MODELS = ("food_classifier", "food_classifier_onnx", "food_pipeline")
SUM_TOLERANCE = 0.10     # the stages' p50s add up to the client's p50 within this share


def with_id(body: bytes, headers: dict[str, str], request_id: str) -> tuple[bytes, dict[str, str]]:
    """The same v2 request with ``"id": request_id`` in its JSON header (Triton's traces carry it)."""
    n = int(headers.get("Inference-Header-Content-Length", len(body)))
    head = json.loads(body[:n])
    head["id"] = request_id
    new_head = json.dumps(head, separators=(",", ":")).encode()
    out = dict(headers)
    if "Inference-Header-Content-Length" in headers:
        out["Inference-Header-Content-Length"] = str(len(new_head))
    return new_head + body[n:], out


def _send_all(url: str, path: str, requests: list[tuple[str, bytes, dict]], concurrency: int,
              timeout: float, timings: dict | None = None) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """Closed loop: ``concurrency`` clients, each on one keep-alive connection, take the next
    request as soon as their last one is answered. Returns {id: (sent ns, received ns)}, errors;
    ``timings`` gets each answer's Server-Timing header, by id."""
    host, port = url.replace("http://", "").split("/")[0].rsplit(":", 1)
    sent: dict[str, tuple[int, int]] = {}
    errors: list[str] = []
    lock, queue = threading.Lock(), list(reversed(requests))

    def client():
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
        try:
            while True:
                with lock:
                    if not queue:
                        return
                    rid, body, headers = queue.pop()
                t0 = time.monotonic_ns()
                conn.request("POST", path, body, headers)
                resp = conn.getresponse()
                data = resp.read()
                t1 = time.monotonic_ns()
                with lock:
                    if resp.status == 200:
                        sent[rid] = (t0, t1)
                        if timings is not None:
                            timings[rid] = resp.getheader("Server-Timing", "")
                    else:
                        errors.append(f"HTTP {resp.status} {data[:120]!r}")
        except OSError as err:
            with lock:
                errors.append(f"{type(err).__name__}: {err}")
        finally:
            conn.close()

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sent, errors


def measure(url: str, admin_key: str | None, model: str, concurrency: int = 1, n: int = 100,
            warmup: int = 20, timeout: float = 60.0, images=None) -> dict:
    """One traced run: per request, its stages (ms) and the client's own time. ``images``: the
    encoded images an image model is sent (default the kit's samples, JPEGs and PNGs)."""
    target = triton_target(url if url.startswith("http") else f"http://{url}", model, images=images)
    bodies = target.bodies
    run_id = uuid.uuid4().hex[:8]

    def batch(tag: str, count: int):
        return [(f"{run_id}-{tag}-{i}", *with_id(*bodies[i % len(bodies)], f"{run_id}-{tag}-{i}"))
                for i in range(count)]

    path = f"/v2/models/{model}/infer"
    _send_all(url, path, batch("warm", warmup), concurrency, timeout)   # untraced
    with Tracing(url, admin_key) as tracing:
        sent, errors = _send_all(url, path, batch("run", n), concurrency, timeout)
    lines = timelines(tracing.collect(set(sent)), sent)
    return {"model": model, "concurrency": concurrency, "sent": n, "answered": len(sent),
            "traced": len(lines), "errors": errors[:5],
            "client_ms": [(t1 - t0) / 1e6 for rid, (t0, t1) in sent.items() if rid in lines],
            "timelines": [lines[rid] for rid in sent if rid in lines]}   # the order of client_ms, request by request


FASTAPI_STAGES = ("network", "parse + encode", "decode", "wait", "infer")


def fastapi_timeline(server_timing: str, client_ms: float) -> list[tuple[str, str, float]]:
    """A FastAPI answer's stages from its Server-Timing header (``decode``, ``wait``, ``infer`` from
    the endpoint, ``app`` from the middleware: servelab.serve.serving_contract) and the client's
    own time; they add up to the client's time."""
    got = {}
    for part in server_timing.split(","):
        name, _, dur = part.strip().partition(";dur=")
        if dur:
            got[name] = float(dur)
    missing = {"decode", "wait", "infer", "app"} - set(got)
    if missing:
        raise ValueError(f"Server-Timing {server_timing!r} lacks {sorted(missing)}")
    inside = got["decode"] + got["wait"] + got["infer"]
    return [("network", "", client_ms - got["app"]), ("parse + encode", "", got["app"] - inside),
            ("decode", "", got["decode"]), ("wait", "", got["wait"]), ("infer", "", got["infer"])]


def measure_fastapi(url: str, concurrency: int = 1, n: int = 100, warmup: int = 10, timeout: float = 60.0,
                    name: str = "FastAPI") -> dict:
    """One run against a FastAPI service's /predict: per request, its stages (ms) from the
    answer's Server-Timing header and the client's own time."""
    from servelab.bench.targets import default_images

    body = json.dumps({"image": base64.b64encode(default_images()[0]).decode()}).encode()
    head = {"Content-Type": "application/json"}
    _send_all(url, "/predict", [(f"w{i}", body, head) for i in range(warmup)], concurrency, timeout)
    timings: dict[str, str] = {}
    sent, errors = _send_all(url, "/predict", [(f"r{i}", body, head) for i in range(n)], concurrency, timeout,
                             timings)
    ids = sorted(sent)
    client = [(sent[i][1] - sent[i][0]) / 1e6 for i in ids]
    return {"model": name, "concurrency": concurrency, "sent": n, "answered": len(sent), "traced": len(sent),
            "errors": errors[:5], "client_ms": client, "stage_names": FASTAPI_STAGES,
            "timelines": [fastapi_timeline(timings[i], c) for i, c in zip(ids, client)]}


def summary(run: dict) -> dict:
    """p50 and p99 of each stage (a request's stages of one name summed: an ensemble has a
    queue per step), of the client's time, and the sum check."""
    per_stage: dict[str, list[float]] = defaultdict(list)
    for line in run["timelines"]:
        totals: dict[str, float] = defaultdict(float)
        for stage, _model, ms in line:
            totals[stage] += ms
        for stage in run.get("stage_names", STAGES):
            per_stage[stage].append(totals.get(stage, 0.0))
    stages = {s: {"p50": percentile(v, 50), "p99": percentile(v, 99), "mean": sum(v) / len(v)}
              for s, v in per_stage.items() if any(v)}
    per_step: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for line in run["timelines"]:
        for model in {m for _s, m, _ms in line if m}:
            per_step[model]["queue"].append(sum(ms for s, m, ms in line if m == model and s == "queue"))
            per_step[model]["compute"].append(sum(ms for s, m, ms in line if m == model and s.startswith("compute")))
    steps = {m: {k: percentile(v, 50) for k, v in d.items()} for m, d in per_step.items()}
    client = run["client_ms"]
    out = {"model": run["model"], "concurrency": run["concurrency"], "requests": len(client),
           "stages": stages, "steps_p50": steps, "stage_names": list(run.get("stage_names", STAGES))}
    if not client:
        out["verdict"] = "inconclusive: no request was both answered and traced"
        return out
    c50, c99 = percentile(client, 50), percentile(client, 99)
    s50 = sum(s["p50"] for s in stages.values())
    out.update(client_p50=c50, client_p99=c99, stages_p50_sum=s50, sum_ratio=s50 / c50)
    out["sum_ok"] = abs(s50 / c50 - 1) <= SUM_TOLERANCE
    if not out["sum_ok"]:
        # Each request's stages add up to its own time exactly (one chain of instants); p50s
        # of skewed stages need not. Name the stage whose p50 lies furthest from its mean.
        worst = max(stages, key=lambda s: abs(stages[s]["mean"] - stages[s]["p50"]))
        out["missing"] = (f"the stages' p50s sum to {s50:.2f} ms against the client's {c50:.2f} ms; each request's "
                          f"stages add up to its own time, so the gap is skew: {worst} has p50 "
                          f"{stages[worst]['p50']:.2f} ms but mean {stages[worst]['mean']:.2f} ms")
    out["negative"] = sum(1 for line in run["timelines"] for _s, _m, ms in line if ms < -0.05)
    if out["negative"]:
        out["missing"] = (out.get("missing", "") + f"; {out['negative']} stage(s) ran backwards: the client "
                          "and Triton do not share a clock (another machine?)").lstrip("; ")
    return out


def table(summaries: list[dict], key: str = "p50") -> str:
    """The stacked table: one row per model and concurrency, a column per stage (ms)."""
    names = list(dict.fromkeys(n for x in summaries for n in x.get("stage_names", STAGES)))
    cols = [s for s in names if any(s in x["stages"] for x in summaries)]
    short = {s: s.replace("compute ", "c.").replace("client to server", "to srv").replace("server to client", "to cli")
                .replace("parse + encode", "parse+enc")
             for s in cols}
    head = f"{'model @ concurrency':<28}" + "".join(f"{short[s]:>10}" for s in cols) + f"{'sum':>9}{'client':>9}{'Δ':>7}"
    rows = [head, "-" * len(head)]
    for x in summaries:
        if "client_p50" not in x:
            rows.append(f"{x['model'] + ' @ ' + str(x['concurrency']):<28}{x['verdict']}")
            continue
        vals = [x["stages"].get(s, {}).get(key, 0.0) for s in cols]
        client = x[f"client_{key}"]
        rows.append(f"{x['model'] + ' @ ' + str(x['concurrency']):<28}" + "".join(f"{v:>10.2f}" for v in vals)
                    + f"{sum(vals):>9.2f}{client:>9.2f}{(sum(vals) / client - 1) * 100:>+6.0f}%")
    return "\n".join(rows)


def plot(summaries: list[dict], path: Path | None = None) -> Path | None:
    """A stacked bar per model and concurrency: each stage's p50, and the client's p50 as a mark.
    Saved to ``path``, or shown (a notebook's inline figure)."""
    import matplotlib.pyplot as plt

    done = [x for x in summaries if "client_p50" in x]
    labels = [f"{x['model']}\n@{x['concurrency']}" for x in done]
    fig, ax = plt.subplots(figsize=(1.8 * len(done) + 3, 4.5))
    bottom = [0.0] * len(done)
    for stage in dict.fromkeys(n for x in done for n in x.get("stage_names", STAGES)):
        vals = [x["stages"].get(stage, {}).get("p50", 0.0) for x in done]
        if any(vals):
            ax.bar(labels, vals, bottom=bottom, label=stage)
            bottom = [b + v for b, v in zip(bottom, vals)]
    ax.scatter(labels, [x["client_p50"] for x in done], marker="_", s=900, color="black", label="client p50", zorder=3)
    ax.set_ylabel("ms (p50 of each stage)")
    ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left")
    ax.set_title("Where a request's time goes (Triton's traces and the client's clock)", fontsize=10)
    fig.tight_layout()
    if path is None:
        plt.show()
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m servelab.bench.breakdown", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="a running Triton's HTTP host:port (default: start a local one)")
    p.add_argument("--admin-key", default=os.environ.get("TRITON_ADMIN_KEY"))
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 8])
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--fastapi", nargs="*", default=[], metavar="NAME=URL",
                   help="FastAPI services to break down too, e.g. pytorch=http://127.0.0.1:8010 (their Server-Timing)")
    p.add_argument("--json", type=Path, help="write the summaries here")
    p.add_argument("--plot", type=Path, help="write the stacked bar plot here (PNG)")
    a = p.parse_args(argv)
    server = None
    if a.url is None:
        from servelab import triton

        print("starting a local Triton for the breakdown ...", flush=True)
        server = triton.start(**triton.free_ports(), write_state=False)
        a.url, a.admin_key = server.url, server.admin_key
    try:
        summaries = []
        for model in a.models:
            for c in a.concurrency:
                run = measure(a.url, a.admin_key, model, c, a.requests)
                summaries.append(summary(run))
                s = summaries[-1]
                print(f"{model} @ {c}: {run['answered']}/{run['sent']} answered, {run['traced']} traced"
                      + (f", errors {run['errors']}" if run["errors"] else ""), flush=True)
                if len(s["steps_p50"]) > 1:
                    print("  per step, p50 ms: " + "; ".join(f"{m} queue {v['queue']:.2f}, compute {v['compute']:.2f}"
                                                           for m, v in s["steps_p50"].items()))
                if s.get("missing"):
                    print("  " + s["missing"])
        for spec in a.fastapi:
            name, _, url = spec.partition("=")
            for c in a.concurrency:
                run = measure_fastapi(url, c, a.requests, name=f"FastAPI {name}")
                summaries.append(summary(run))
                print(f"FastAPI {name} @ {c}: {run['answered']}/{run['sent']} answered"
                      + (f", errors {run['errors']}" if run["errors"] else ""), flush=True)
        print("\np50 of each stage (ms); sum = the stages' p50s, client = the client's own p50, Δ = sum/client - 1")
        print(table(summaries, "p50"))
        print("\np99 of each stage (ms)")
        print(table(summaries, "p99"))
        checks = [x.get("sum_ok") for x in summaries]
        print(f"\nsum check (±{SUM_TOLERANCE:.0%}): {sum(1 for c in checks if c)} of {len(checks)} within")
        if a.json:
            a.json.parent.mkdir(parents=True, exist_ok=True)
            a.json.write_text(json.dumps(summaries, indent=1))
        if a.plot:
            import matplotlib
            matplotlib.use("Agg")
            print(f"plot: {plot(summaries, a.plot)}")
        return 0 if all(checks) else 1
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
