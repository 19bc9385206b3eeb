"""What a benchmark's figures must satisfy whatever the machine: each run's figures are finite and
positive, its percentiles in order, counts add up, every ratio is the quotient of the figures it
names, and every verdict follows from its value and its target, in the JSON and in the printed
table alike. The size of a figure is not judged (a tiny run on a shared machine says nothing
about it); a figure that contradicts another one is a bug whatever the machine.

``PROBLEMS[script](data, stdout, returncode)`` lists what is wrong (empty when nothing is);
tests/bench/test_benchmarks_smoke.py applies it to every ``--tiny`` run, and
tests/bench/test_figures.py to saved runs and to planted mistakes."""

from __future__ import annotations

import math
import re
import statistics

PERCENTILE_ORDER = ("min_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "max_ms")


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _close(a: float, b: float, rel: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


def _printed(stdout: str, pattern: str) -> list[tuple[str, ...]]:
    return re.findall(pattern, stdout, re.M)


def latency_problems(where: str, d: dict) -> list[str]:
    """A latency summary (servelab.bench.stats.summarize): its figures finite and in order."""
    values = [(k, d[k]) for k in PERCENTILE_ORDER if k in d]
    bad = [k for k, v in values if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0)]
    if bad:
        return [f"{where}: {bad} not finite and >= 0: {d}"]
    order = [v for _, v in values]
    if order != sorted(order):
        return [f"{where}: percentiles out of order {dict(values)}"]
    return []


def run_problems(where: str, run: dict) -> list[str]:
    """One timed run (script.summary): requests counted, a positive throughput, latencies in order."""
    out = latency_problems(where, run)
    if not (isinstance(run.get("count"), int) and run["count"] > 0):
        out.append(f"{where}: count {run.get('count')!r}")
    if not _positive(run.get("throughput")):
        out.append(f"{where}: throughput {run.get('throughput')!r}")
    return out


def verdict_for(value: float, target: str) -> str:
    """What a target such as '>= 0.95', '<= 2' or '0.85 - 1.15' says of ``value``."""
    if isinstance(value, float) and math.isnan(value):
        return "INCONCLUSIVE"
    m = re.fullmatch(r"\s*(>=|<=)\s*([0-9.]+)\s*", target)
    if m:
        ok = value >= float(m.group(2)) if m.group(1) == ">=" else value <= float(m.group(2))
        return "PASS" if ok else "FAIL"
    low, high = (float(x) for x in re.fullmatch(r"\s*([0-9.]+)\s*-\s*([0-9.]+)\s*", target).groups())
    return "PASS" if low <= value <= high else "FAIL"


# --------------------------------------------------------------------------
# One function per benchmark
# --------------------------------------------------------------------------

def bench_fastapi(data: dict, stdout: str, rc: int) -> list[str]:
    out = []
    results = data["results"]
    for name, runs in results.items():
        for i, r in enumerate(runs):
            out += run_problems(f"{name}[{i}]", r)
    best = {name: max(r["throughput"] for r in runs) for name, runs in results.items()}
    raw_onnx = max(v for k, v in best.items() if k.startswith("raw_onnx_t"))
    raw_torch = max(v for k, v in best.items() if k.startswith("raw_torch_t"))
    quotients = [best["onnx_conc"] / raw_onnx, best["pt_conc"] / best["pt_seq"], best["pt_conc"] / raw_torch]
    names = list(data["ratios"])
    for name, q in zip(names, quotients):
        if not _close(data["ratios"][name], q):
            out.append(f"ratio {name!r} is {data['ratios'][name]}, its figures give {q}")
    printed = _printed(stdout, r"^(FastAPI .+?)\s+([0-9.]+)\s+\(target >= ([0-9.]+)\)\s+(PASS|FAIL)$")
    if [p[0] for p in printed] != names:
        out.append(f"printed ratio rows {[p[0] for p in printed]} != JSON {names}")
    for name, value, goal, said in printed:
        if name in data["ratios"]:
            ratio = data["ratios"][name]
            if f"{ratio:.3f}" != value:
                out.append(f"{name}: printed {value}, JSON {ratio}")
            if said != ("PASS" if ratio >= float(goal) else "FAIL"):
                out.append(f"{name}: {ratio:.3f} against >= {goal} printed {said}")
    return out


def bench_naive(data: dict, stdout: str, rc: int) -> list[str]:
    out = _naive_runs_problems(data)
    for name, cpu in data["idle_cpu_percent"].items():
        if not (math.isfinite(cpu) and cpu >= 0):
            out.append(f"idle CPU of {name}: {cpu}")

    rows = {r["figure"]: r for r in data["rows"]}
    for figure, pairs in _naive_pairs(data).items():
        if figure not in rows:
            out.append(f"no row {figure!r}")
            continue
        r = rows[figure]
        if len(pairs) != len(r["pairs"]) or not all(map(_close, pairs, r["pairs"])):
            out.append(f"{figure}: pairs {r['pairs']}, its figures give {pairs}")
        x = sorted(r["pairs"])
        if x and not _close(r["value"], (x[(len(x) - 1) // 2] + x[len(x) // 2]) / 2):
            out.append(f"{figure}: {r['value']} is not the median of its pairs, which its figures give")
        if x and (r["low"] not in x or r["high"] not in x or not r["low"] <= r["value"] <= r["high"]):
            out.append(f"{figure}: interval {r['low']} - {r['high']} not of its pairs around {r['value']}")
    for r in data["rows"]:
        want = verdict_for(r["low"], r["target"]), verdict_for(r["high"], r["target"])
        want = want[0] if want[0] == want[1] and (len(r["pairs"]) > 1 or r["figure"].startswith("CPU")) \
            else "INCONCLUSIVE"   # one pair (--tiny) is not judged; the idle CPU is one measurement
        if not r["verdict"].startswith(want):
            out.append(f"{r['figure']}: {r['low']} - {r['high']} against {r['target']} says {r['verdict']}")
        line = re.search(rf"^  {re.escape(r['figure'])}\s+(\S+)\s+(?:\S+ - \S+|-)\s+(\d+)\s+(?:\d+%|-)\s+"
                         rf"{re.escape(r['target'])}\s+(.+)$", stdout, re.M)
        if not line or line.groups() != (f"{r['value']:.2f}", str(len(r["pairs"])), r["verdict"]):
            out.append(f"{r['figure']}: printed {line.groups() if line else None}, JSON {r['value']:.2f} {r['verdict']}")
    return out


def _naive_runs_problems(data: dict) -> list[str]:
    """Each of bench_naive's figures is the best of its runs (script.best), or NaN where --tiny runs none;
    FastAPI's sequential ones pool their runs' requests (requests / summed latency)."""
    out = []
    for group in ("fastapi", "triton_pt"):
        for name, runs in data[group]["runs"].items():
            summary = data[group][name]["throughput"]
            for i, r in enumerate(runs):
                if not _positive(r["throughput"]):
                    out.append(f"{group} {name}[{i}]: throughput {r['throughput']!r}")
                if group == "fastapi":
                    out += latency_problems(f"{group} {name}[{i}]", r)
            if runs and name.endswith("/seq"):
                ok = [lat for r in runs for lat in r["latencies_s"] if lat is not None]
                if not _close(summary, len(ok) / sum(ok)):
                    out.append(f"{group} {name}: {summary} is not its runs' requests / their summed latency")
            elif runs and summary != max(r["throughput"] for r in runs):
                out.append(f"{group} {name}: {summary} is not the best of its runs")
            if not runs and not math.isnan(summary):
                out.append(f"{group} {name}: {summary} from no run")
    return out


def _naive_pairs(data: dict) -> dict[str, list[float]]:
    """bench_naive's table rows, each a list of kit / reference ratios of runs taken side by side,
    from the figures it names (its JSON's runs): the i-th run of each side, or for FastAPI
    sequential each turn of ten requests; count 2's reference in each round its better setting."""
    fa, tp, to, rounds = data["fastapi"]["runs"], data["triton_pt"]["runs"], data["triton_onnx"]["runs"], data["rounds"]

    def zipped(a, b):
        return [x["throughput"] / y["throughput"] for x, y in zip(a, b)]

    def turns(a, b):
        out = []
        for x, y in zip(a, b):
            for i in range(0, len(x["latencies_s"]), 10):
                k, r = ([v for v in side["latencies_s"][i:i + 10] if v is not None] for side in (x, y))
                out.append((len(k) / sum(k)) / (len(r) / sum(r)))
        return out

    def best_setting(kit, one, default):
        out, k1, d1 = [], len(one) // rounds, len(default) // rounds
        for i in range(rounds):
            ones, dflt = one[i * k1:(i + 1) * k1], default[i * d1:(i + 1) * d1]
            better = dflt and statistics.fmean(r["throughput"] for r in dflt) > \
                statistics.fmean(r["throughput"] for r in ones)
            ref = dflt * k1 if better else ones
            out += zipped(kit[i * k1:(i + 1) * k1], ref)
        return out

    pairs = {"count 2 / count 1, concurrency 8": zipped(tp["kit count2 c8"], tp["kit count1 c8"]),
             "count 2 / count 1, concurrency 1": zipped(tp["kit count2 c1"], tp["kit count1 c1"]),
             "CPU of the busiest idle server process (% of a core)": [max(data["idle_cpu_percent"].values())],
             "Triton ONNX + dynamic batching c16, HTTP / raw ORT b16": [r["ratio"] for r in to["http"]],
             "Triton ONNX + dynamic batching c16, HTTP+shm / raw ORT b16": [r["ratio"] for r in to["http+shm"]]}
    for ref in ("plain", "shared"):
        for c in (1, 8):
            pairs[f"Triton food_classifier count 1 / {ref}, concurrency {c}"] = zipped(tp[f"kit count1 c{c}"],
                                                                                        tp[f"{ref} c{c}"])
        pairs[f"count 2 / {ref} count 2 (best thread setting), concurrency 8"] = best_setting(
            tp["kit count2 c8"], tp[f"{ref} count2 1 thread c8"], tp[f"{ref} count2 default threads c8"])
        for label, key in (("ONNX", "onnx"), ("PyTorch", "pt")):
            pairs[f"FastAPI {label} sequential / {ref}"] = turns(fa[f"kit_{key}/seq"], fa[f"{ref}_{key}/seq"])
            pairs[f"FastAPI {label} 16 clients / {ref}"] = zipped(fa[f"kit_{key}/c16"], fa[f"{ref}_{key}/c16"])
    return pairs


def bench_harness(data: dict, stdout: str, rc: int) -> list[str]:
    out = []
    runs = [r for r in data["runs"] if r["run"].startswith("bench")]
    for r in runs:
        where = f"{r['endpoint']} {r['run']}"
        if not _positive(r["throughput"]):
            out.append(f"{where}: throughput {r['throughput']!r}")
        out += latency_problems(where, r)
        if r.get("late") is not None and r["late"] < 0:
            out.append(f"{where}: late {r['late']}")
    closed = max(r["throughput"] for r in runs if r["run"].startswith("bench closed"))
    if not _close(data["closed_best_rps"], closed):
        out.append(f"closed_best_rps {data['closed_best_rps']} is not the best closed run, {closed}")
    said = _printed(stdout, r"^(PASS|FAIL) harness sustains")
    if said != ["PASS" if data["pass"] else "FAIL"] or rc != (0 if data["pass"] else 1):
        out.append(f"printed {said}, exit {rc}, JSON pass={data['pass']}")
    if data["pass"] and closed < data["target_rps"]:
        out.append(f"passes with a closed-loop best of {closed} < {data['target_rps']}")
    return out


def bench_triton(data: dict, stdout: str, rc: int) -> list[str]:
    out = []
    runs = data["onnx"]["runs"]
    for label, r in runs.items():
        for k in ("infer_per_s", "raw_ort_images_per_s", "cpu_ms_per_image", "raw_ort_cpu_ms_per_image"):
            if not _positive(r[k]):
                out.append(f"{label}: {k} {r[k]!r}")
        if not out and not _close(r["ratio"], r["infer_per_s"] / r["raw_ort_images_per_s"]):
            out.append(f"{label}: ratio {r['ratio']} != {r['infer_per_s']} / {r['raw_ort_images_per_s']}")
        if not out and not _close(r["cpu_ratio"], r["raw_ort_cpu_ms_per_image"] / r["cpu_ms_per_image"]):
            out.append(f"{label}: cpu_ratio {r['cpu_ratio']} is not the quotient of its CPU figures")
    best = max(runs, key=lambda k: runs[k]["ratio"])
    if data["onnx"]["best"] != best or data["onnx"]["ratio_best"] != runs[best]["ratio"]:
        out.append(f"best {data['onnx']['best']} ({data['onnx']['ratio_best']}), the runs say {best}")
    if data["onnx"]["ratio_lab_command"] != runs["preferred16/http"]["ratio"]:
        out.append("ratio_lab_command is not preferred16/http's ratio")
    c = data["counts"]
    if not (_positive(c["count1_infer_per_s"]) and _positive(c["count2_infer_per_s"])):
        out.append(f"counts: {c}")
    elif not _close(c["ratio"], c["count2_infer_per_s"] / c["count1_infer_per_s"]):
        out.append(f"count ratio {c['ratio']} != {c['count2_infer_per_s']} / {c['count1_infer_per_s']}")
    printed = _printed(stdout, r"=> count 2 / count 1 = ([0-9.]+) / ([0-9.]+) = ([0-9.]+)")
    if printed != [(f"{c['count2_infer_per_s']:.1f}", f"{c['count1_infer_per_s']:.1f}", f"{c['ratio']:.2f}")]:
        out.append(f"printed count line {printed}, JSON {c}")
    return out


def soak(data: dict, stdout: str, rc: int) -> list[str]:
    out = []
    failed = False
    for rec in data["records"]:
        errors = sum(rec["errors"].values())
        if rec["ok"] + errors != rec["sent"]:
            out.append(f"{rec['label']}: {rec['ok']} ok + {errors} errors != {rec['sent']} sent")
        if not _positive(rec["wall_s"]):
            out.append(f"{rec['label']}: wall_s {rec['wall_s']}")
        for proc, g in rec["growth"].items():
            sizes = [g[k] for k in ("at_checkpoint", "at_end", "min_after", "max_after")]
            if not all(_positive(s) for s in sizes) or not g["min_after"] <= g["max_after"]:
                out.append(f"{rec['label']} {proc}: RSS figures {sizes}")
            if not math.isfinite(g["trend"]):
                out.append(f"{rec['label']} {proc}: trend {g['trend']}")
            if proc != "total" and g["trend"] >= data["args"]["max_growth"]:
                failed = True
        failed |= bool(errors) or rec["ok"] != rec["sent"] or rec["sent"] != data["args"]["requests"]
        line = f"{rec['label']}: {rec['sent']} sent, {rec['ok']} ok, {errors} failed"
        if line not in stdout:
            out.append(f"not printed: {line!r}")
    said = _printed(stdout, r"^verdict: (PASS|FAIL)")
    if said != ["FAIL" if failed else "PASS"] or rc != (1 if failed else 0):
        out.append(f"verdict printed {said}, exit {rc}; its figures say {'FAIL' if failed else 'PASS'}")
    return out


def lesson_stability(data: dict, stdout: str, rc: int) -> list[str]:
    out = []
    idle = data["idle"]
    k = len(idle["rounds"])
    for key, row in idle["checks"].items():
        if row["pass"] + row["fail"] + row["inconclusive"] != k:
            out.append(f"{key}: {row['pass']} + {row['fail']} + {row['inconclusive']} rounds != {k}")
        if not re.search(rf"^  {re.escape(key)}\s+{row['pass']}/{k}\s+{row['fail']}\s+{row['inconclusive']}\s",
                         stdout, re.M):
            out.append(f"{key}: its table row is not printed as {row['pass']}/{k} {row['fail']} {row['inconclusive']}")
    runs = [r for rd in idle["rounds"] for r in rd["runs"]]
    valid = sum(bool(r["valid"]) for r in runs)
    if f"valid runs: {valid} of {len(runs)}" not in stdout:
        out.append(f"'valid runs: {valid} of {len(runs)}' not printed")
    for r in runs:
        if not r["valid"] and not r["reasons"]:
            out.append(f"{r['label']}: invalid without a reason")
    return out


def reload_under_load(data: dict, stdout: str, rc: int) -> list[str]:
    out = []
    if not 0 <= data["failed"] <= data["requests"] or not _positive(data["throughput"]):
        out.append(f"requests {data['requests']}, failed {data['failed']}, throughput {data['throughput']}")
    previous_end = -math.inf
    for i, r in enumerate(data["reloads"], 1):
        if not (_positive(r["duration_s"]) and _close(r["duration_s"], r["t_end"] - r["t_start"])):
            out.append(f"reload {i}: duration {r['duration_s']} for {r['t_start']}..{r['t_end']}")
        if r["t_start"] < previous_end:
            out.append(f"reload {i} starts before reload {i - 1} ended")
        previous_end = r["t_end"]
        printed = _printed(stdout, rf"^  reload {i}: .*?([0-9.]+) s  instances (\d+) \(stubs (\d+)\)")
        if printed != [(f"{r['duration_s']:.2f}", str(r["reported_instances"]), str(r["stubs"]))]:
            out.append(f"reload {i}: printed {printed}")
    lat = data["latency_ms"]
    if not (_positive(lat["baseline_p50"]) and lat["baseline_p50"] <= lat["baseline_p99"]):
        out.append(f"baseline latency {lat}")
    said = _printed(stdout, r"^verdict: (PASS|FAIL) \((\d+) failed")
    if said != [("PASS" if data["failed"] == 0 else "FAIL", str(data["failed"]))] or rc != (data["failed"] > 0):
        out.append(f"verdict printed {said}, exit {rc}, {data['failed']} failed")
    return out


def bench_streaming(data: dict, stdout: str, rc: int) -> list[str]:
    """Per run: requests add up, TTFT p50 <= p99, rates positive, goodput at most the completions
    per second; each ratio is the quotient of its two runs' figures; the verdict follows the
    failures."""
    out = []
    by = {(r["rate"], r["model"]): r for r in data["runs"]}
    for r in data["runs"]:
        where = f"{r['model']} at {r['rate']}/s"
        if r["completed"] + r["errors"] > r["requests"] or len(r["streams"]) != r["requests"]:
            out.append(f"{where}: {r['completed']} completed + {r['errors']} errors of {r['requests']}")
        if r["completed"] and not (_positive(r["ttft_p50_ms"]) and r["ttft_p50_ms"] <= r["ttft_p99_ms"]
                                   and _positive(r["ttft_mean_ms"]) and r["ttft_mean_ms"] <= r["ttft_p99_ms"] * 1.01 + 1):
            out.append(f"{where}: TTFT mean {r['ttft_mean_ms']} p50 {r['ttft_p50_ms']} p99 {r['ttft_p99_ms']}")
        if not _positive(r["tokens_per_s"]) or r["goodput_per_s"] > r["completed"] / r["wall_s"] + 1e-9:
            out.append(f"{where}: tokens/s {r['tokens_per_s']}, goodput {r['goodput_per_s']}")
    for q in data["ratios"]:
        rq, it = by[(q["rate"], "tokens_request_level")], by[(q["rate"], "tokens_iteration_level")]
        if not _close(q["ttft_mean"], rq["ttft_mean_ms"] / it["ttft_mean_ms"]):
            out.append(f"ratio at {q['rate']}/s is not the quotient of its runs' TTFT means")
    said = _printed(stdout, r"^verdict: (PASS|FAIL) \((\d+) failed")
    if said != [("PASS" if not data["failed"] else "FAIL", str(len(data["failed"])))]:
        out.append(f"verdict printed {said}, {len(data['failed'])} failed")
    return out


PROBLEMS = {"bench_fastapi.py": bench_fastapi, "bench_streaming.py": bench_streaming, "bench_naive.py": bench_naive, "bench_harness.py": bench_harness,
            "bench_triton.py": bench_triton, "soak.py": soak, "lesson_stability.py": lesson_stability,
            "reload_under_load.py": reload_under_load}
