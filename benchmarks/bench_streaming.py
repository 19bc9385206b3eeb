"""Benchmark: token streaming, request-level against iteration-level batching, side by side.

    .venv/bin/python benchmarks/bench_streaming.py [--rates 1,2,4] [--duration 20]
                                                   [--lengths 16,256] [--ttft-bound-ms 500]
                                                   [--quick | --tiny] [--json PATH]

Starts the real Triton 2.51 with models_streaming/ (both schedulers, the same decoder of
servelab.core.tinylm: random weights, so latency is real and the text is not) and, at each
rate, sends the same Poisson arrivals (same prompts, same output lengths, one gRPC stream per
request) to each model in turn, the order alternating from rate to rate. Per run: time to first
token (mean, p50, p99), time per output token (p50), output tokens/s, and goodput (requests/s that
completed with their first token within the bound).

Then the checks:
- the two schedulers streamed identical tokens for every request, and those of the plain
  one-request loop (TinyDecoder.generate) for each distinct prompt and length;
- the queueing model (servelab.bench.queueing, model (e)) simulated on each run's own
  arrivals, with each run's own time per output token as the cost of a step, predicts each
  mean time to first token;
- a run that other work spoiled (late sends, a late event loop, another process's CPU) is
  repeated once and otherwise reported inconclusive, never used as a figure.

Exit status 0 even when a check fails (it is a measurement, not a test); --strict makes a failed
check exit 1.
"""

from __future__ import annotations

from servelab.bench import queueing, script, streaming
from servelab.core import paths, procs, tinylm
from servelab.triton import running


def _measure(t, model, rate, args, seed, retries=1):
    for attempt in range(retries + 1):
        run = streaming.run(t.grpc_url, model, rate, args.duration, args.lengths, seed=seed,
                            ttft_bound_ms=args.ttft_bound_ms, server_pids=[t.pid], http_url=t.http_url)
        run["attempts"] = attempt + 1
        if run["validity"]["valid"]:
            break
    return run


def _differing_tokens(runs, rates, models) -> list[str]:
    """Request by request, the two schedulers' tokens, and the plain loop's for that prompt and length."""
    decoder, reference, out = tinylm.TinyDecoder(), {}, []
    for rate in rates:
        pair = {r["model"]: r for r in runs if r["rate"] == rate}
        for sa, sb in zip(pair[models[0]]["streams"], pair[models[1]]["streams"]):
            key = (sa.prompt, sa.max_tokens)
            if key not in reference:
                reference[key] = decoder.generate(list(sa.prompt), sa.max_tokens)
            out += [f"{rate:g}/s: {s.max_tokens} tokens for {s.prompt!r} differ from the plain loop's"
                    for s in (sa, sb) if s.error is None and s.tokens != reference[key]]
    return out


def _prefill_s() -> float:
    """One prompt's prefill, as the models run it (one thread), median over the lesson's prompts."""
    import time

    import torch

    torch.set_num_threads(1)
    decoder, times = tinylm.TinyDecoder(), []
    for _ in range(5):
        for p in streaming.PROMPTS:
            t = time.perf_counter()
            decoder.prefill(list(p.encode()))
            times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def fmt(v) -> str:
    return f"{v:10.1f}" if v is not None else f"{'-':>10}"


def main(argv=None) -> int:
    ap = script.Parser(__doc__)
    ap.sized("--rates", full="1,2,4", quick="1,3", tiny="4", help="arrival rates, requests/s (comma-separated)")
    ap.sized("--duration", type=float, full=20.0, quick=8.0, tiny=2.0, help="seconds of arrivals per run")
    ap.sized("--lengths", full="16,256", quick="16,128", tiny="4,16", help="output lengths, drawn equally often")
    ap.add_argument("--ttft-bound-ms", type=float, default=500.0, help="goodput counts first tokens within this")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a check fails")
    args = ap.parse_args(argv)
    rates = [float(r) for r in str(args.rates).split(",")]
    args.lengths = [int(n) for n in str(args.lengths).split(",")]
    print(f"decoder: {tinylm.NOTE}; {tinylm.Size()}")
    models = ("tokens_request_level", "tokens_iteration_level")
    runs: list[dict] = []
    with running(paths.MODELS_STREAMING, http_port=procs.free_port(), grpc_port=procs.free_port(),
                 metrics_port=procs.free_port(), write_state=False) as t:
        for model in models:   # warm both: first executions, the client's channel
            streaming.run(t.grpc_url, model, 8.0, 0.5, args.lengths[:1], seed=99)
        for i, rate in enumerate(rates):
            for model in (models if i % 2 == 0 else models[::-1]):
                run = _measure(t, model, rate, args, seed=1000 + i)
                print(f"  {model} at {rate:g}/s: {run['requests']} requests, {run['attempts']} attempt(s)",
                      flush=True)
                runs.append(run)
    # in Triton, one step of b requests costs a + c*b, from the iteration-level runs
    a, c = streaming.step_cost([r["server"] for r in runs if r["model"] == models[1] and r["validity"]["valid"]] or
                               [r["server"] for r in runs if r["model"] == models[1]])
    prefill = _prefill_s()
    failed = []
    for r in runs:
        plan = [(s.due, s.max_tokens) for s in r["streams"]]
        step = (r["tpot_p50_ms"] or 0) / 1000   # the run's own time per output token
        sim = queueing.simulate_streams(plan, lambda b, step=step: step, prefill, 8, r["model"].split("_")[1])
        r["predicted_ttft_mean_ms"] = streaming.mean_ms([x["ttft"] for x in sim])
    failed += _differing_tokens(runs, rates, models)
    same = not failed
    header = (f"{'rate/s':>6}  {'scheduler':<16}{'TTFT mean':>10}{'model':>10}{'TTFT p50':>10}{'TTFT p99':>10}"
              f"{'TPOT p50':>10}{'tokens/s':>10}{'goodput/s':>10}  run")
    print(f"\nmodel: a step costs the run's own TPOT p50, a prefill {1000 * prefill:.2f} ms (this process, one "
          f"thread); in Triton a step of b requests cost {1000 * a:.2f} + {1000 * c:.2f} x b ms (fitted from its "
          f"statistics of the iteration-level runs)")
    print(f"goodput: requests per second whose first token came within {args.ttft_bound_ms:g} ms")
    print(header)
    for r in runs:
        sched = r["model"].split("_")[1] + " level"
        verdict = "valid" if r["validity"]["valid"] else "inconclusive: " + "; ".join(r["validity"]["reasons"])
        if r["errors"]:
            failed.append(f"{r['model']} at {r['rate']:g}/s: {r['errors']} request(s) failed")
        print(f"{r['rate']:6g}  {sched:<16}{fmt(r['ttft_mean_ms'])}{fmt(r['predicted_ttft_mean_ms'])}"
              f"{fmt(r['ttft_p50_ms'])}{fmt(r['ttft_p99_ms'])}{fmt(r['tpot_p50_ms'])}{r['tokens_per_s']:10.1f}"
              f"{r['goodput_per_s']:10.2f}  {verdict}")
    print("\nrequest level / iteration level, side by side at each rate (valid runs only):")
    ratios = []
    for rate in rates:
        pair = {r["model"]: r for r in runs if r["rate"] == rate}
        rq, it = pair[models[0]], pair[models[1]]
        if not (rq["validity"]["valid"] and it["validity"]["valid"]) or not it["ttft_mean_ms"]:
            print(f"  {rate:g}/s: inconclusive (a run was spoiled)")
            continue
        ratio = {"rate": rate, "ttft_mean": rq["ttft_mean_ms"] / it["ttft_mean_ms"],
                 "predicted_ttft_mean": rq["predicted_ttft_mean_ms"] / it["predicted_ttft_mean_ms"]}
        ratios.append(ratio)
        print(f"  {rate:g}/s: TTFT mean x{ratio['ttft_mean']:.1f} (model x{ratio['predicted_ttft_mean']:.1f}); "
              f"goodput {rq['goodput_per_s']:.2f} against {it['goodput_per_s']:.2f} requests/s")
    print(f"identical tokens from both schedulers and the plain loop: {'yes' if same else 'NO'}")
    print(f"verdict: {'PASS' if not failed else 'FAIL'} ({len(failed)} failed)")
    for f in failed:
        print(f"  failed: {f}")
    for r in runs:
        r["streams"] = [{"due": s.due, "max_tokens": s.max_tokens, "tokens": len(s.tokens), "ttft_s": s.ttft,
                         "error": s.error} for s in r["streams"]]
    script.write_json(args.json, {"runs": runs, "step_ms": {"a": 1000 * a, "c": 1000 * c},
                                  "prefill_ms": 1000 * prefill, "ratios": ratios,
                                  "identical_tokens": same, "failed": failed})
    return 1 if failed and args.strict else 0


if __name__ == "__main__":
    script.run(main)
