"""Model Analyzer's search against the queueing model's prediction, on food_classifier_onnx.

Measures S(b) through the kit's Triton (one copy, batching off), predicts the ranking of
the search space (copies x max batch size x queue delay, dynamic batching off = max batch 1)
under a p99 budget, runs Model Analyzer 1.58.0 on the same space in local launch mode
(servelab.triton.analyzer), and prints both rankings side by side with the agreement
(how many of the model's top 3 are in the tool's top 3).

On a shared or busy machine the tool's measurements are noisy (several configurations
minutes apart): the printed verdict says whether other work used the CPU meanwhile.
"""

from __future__ import annotations

from servelab.bench import batchcost, configsearch, queueing, script
from servelab.triton import analyzer

MODEL = "food_classifier_onnx"


def main(argv=None) -> int:
    ap = script.Parser(__doc__)
    ap.sized("--instances", type=str, full="1,2", quick="1,2", tiny="1", help="copies, comma-separated")
    ap.sized("--batch", type=str, full="1,8", quick="1,16", tiny="4", help="max batch sizes (1 = batching off)")
    ap.sized("--delays", type=str, full="0,2000", quick="0", tiny="0", help="queue delays, microseconds")
    ap.sized("--concurrency", type=str, full="1,4,16", quick="1,4,16", tiny="1", help="perf_analyzer's clients")
    ap.sized("--window", type=int, full=50, quick=25, tiny=10, help="requests per perf_analyzer window")
    ap.sized("--stability", type=int, full=10, tiny=100,
             help="perf_analyzer's stability percentage (10 is its own default; 100 takes the first 3 windows)")
    ap.sized("--batch-requests", type=int, full=20, quick=8, tiny=4, help="client batches per size for S(b)")
    ap.add_argument("--budget-ms", type=float, default=300.0, help="p99 budget")
    ap.add_argument("--run-dir", default=None, help="Model Analyzer's folder (default build/model-analyzer/<model>-<time>)")
    args = ap.parse_args(argv)

    def ints(text):
        return [int(x) for x in text.split(",")]

    space = analyzer.Space(ints(args.instances), ints(args.batch), ints(args.delays), ints(args.concurrency))
    from servelab import triton

    with triton.running(models=[MODEL], **triton.free_ports()) as t:
        through = batchcost.through_triton(t.url, MODEL, requests=args.batch_requests)
        alone = batchcost.through_triton(t.url, MODEL, sizes=(1,), requests=args.batch_requests, concurrency=1)
    seconds = batchcost.bounded_by_one_client(through["seconds"], alone["seconds"][1])
    cost = queueing.BatchCost(seconds)
    overhead = max(0.0, alone["seconds"][1] - cost(1))
    print(f"S(b): {batchcost.describe(seconds)}; outside the server {1000 * overhead:.1f} ms")
    predicted = configsearch.rank_predictions([{"instances": 1, "max_batch_size": 1}, *space.configs()], cost,
                                              args.budget_ms, space.concurrency, overhead_s=overhead)
    watch = configsearch.machine_watch()   # all of its processes are our children
    run = analyzer.profile(MODEL, space, args.budget_ms, run_dir=args.run_dir,
                           perf_flags={"measurement-request-count": args.window, "stability-percentage": args.stability})
    verdict = watch.verdict()
    measured = configsearch.measured_ranking(analyzer.best_per_config(run.rows()))
    comparison = configsearch.side_by_side(predicted, measured)
    print(f"Model Analyzer {analyzer.VERSION}: {len(measured)} configurations in {run.seconds:.0f} s ({run.run_dir})")
    print("model's ranking:")
    for p in predicted:
        print(f"  {p['rank']:2}. {p['label']:38} predicted {p['throughput']:7.1f} infer/s at {p['concurrency']} clients, "
              f"p99 {p['p99_ms']:.1f} ms")
    print("tool's ranking:")
    for m in measured:
        print(f"  {m['rank']:2}. {m['label']:38} measured  {m['throughput']:7.1f} infer/s at {m['concurrency']} clients, "
              f"p99 {m['p99_ms']:.1f} ms{'' if m['satisfies'] else ' (over budget)'}")
    print(configsearch.table(comparison))
    print(f"agreement: {comparison['agreement']} of the model's top 3 are in the tool's top 3")
    print("machine during the profile:", "sound" if verdict.get("valid", True) else
          "busy (not evidence): " + ", ".join(verdict.get("reasons", [])))
    print("left behind and stopped:", run.cleaned or "nothing")
    script.write_json(args.json, {"predicted": predicted, "measured": measured, "comparison": comparison,
                                  "validity": verdict, "seconds": run.seconds,
                                  "run": {"dir": str(run.run_dir), "log": str(run.log), "cleaned": run.cleaned,
                                          "shm_prefix": run.shm_prefix, "servers": run.servers}})
    return 0


if __name__ == "__main__":
    script.run(main)
