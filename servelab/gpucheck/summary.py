"""``gpu-check``'s result files: ``summary.md`` (phases, device, figures table),
``results.json``, ``log.txt``, and the phases' own files copied beside them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from servelab.gpucheck import runner

PHASE_FILES = {"perf.txt": "triton", "tour-report.md": "tour", "pytest-cuda.txt": "cuda_tests"}
TABLE_HEADER = ("| phase | what | infer/s | p50 ms | p99 ms | GPU util % (mean/max) | CPU % (mean) | value |\n"
                "|---|---|---|---|---|---|---|---|")


def _cell(v) -> str:
    if v is None or v == "":
        return "-"
    return f"{v:.1f}" if isinstance(v, float) else str(v).replace("|", "/").replace("\n", " ")


def figures_table(results: list[dict], samples: list[dict], t0: float) -> str:
    lines = [TABLE_HEADER]
    for res in results:
        for fig in res.get("figures") or []:
            use = {}
            if fig.get("t_start") and fig.get("t_end"):
                use = runner.usage(samples, fig["t_start"], fig["t_end"], t0)
            gpu = (f"{use['gpu_util_mean']:.0f} / {use['gpu_util_max']:.0f}" if "gpu_util_mean" in use else "-")
            cpu = f"{use['cpu_mean']:.0f}" if "cpu_mean" in use else "-"
            value = fig.get("value") or fig.get("error") or ""
            lines.append(f"| {res['phase']} | {_cell(fig.get('what'))} | {_cell(fig.get('throughput'))} | "
                         f"{_cell(fig.get('p50_ms'))} | {_cell(fig.get('p99_ms'))} | {gpu} | {cpu} | {_cell(value)} |")
    return "\n".join(lines)


def summary_text(results: list[dict], meta: dict, samples: list[dict]) -> str:
    probe = next((r for r in results if r.get("phase") == "probe"), {})
    fastapi = next((r for r in results if r.get("phase") == "fastapi"), {})
    info = probe.get("info", {})
    lines = [
        "# servelab gpu-check" + (" (dry run: --tiny, toy sizes, measures nothing)" if meta.get("tiny") else ""),
        "",
        *([] if meta.get("complete", True) else
          ["**Written after a phase, while the run went on: the phases below are those that had finished.**", ""]),
        f"- device asked: `{meta['device']}`; budget {meta['budget_s']:.0f} s; elapsed {meta['elapsed_s']:.0f} s; "
        f"python {meta['python']}",
        f"- pack: {meta['pack']}",
        f"- device (torch): {probe.get('device_name', 'unknown')}; nvidia-smi: {info.get('nvidia_smi', 'n/a')}",
        f"- device reported from inside FastAPI PyTorch (/health): {fastapi.get('device_in_service', 'n/a')}",
        f"- ONNX: {info.get('onnx_note', 'n/a')}",
        f"- samples: {meta.get('sampler') or 'nvidia-smi and /proc/stat'} every {runner.SAMPLE_EVERY_S} s "
        f"(samples.csv, {len(samples)} rows)",
        "",
        "## Phases",
        "",
        "| phase | status | seconds | limit s | reason |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r['phase']} | {r['status']} | {_cell(r.get('seconds'))} | {_cell(r.get('limit_s'))} | "
                     f"{_cell(r.get('reason') or r.get('note') or '')} |")
    lines += ["", "## Figures", "", figures_table(results, samples, meta["t0"]), ""]
    lines += ["GPU and CPU utilisation are the samples taken during each run. Figures from one run on one "
              "machine: a reference, not a P100 result.", ""]
    traced = next((r for r in results if r.get("phase") == "traces" and r.get("table")), None)
    if traced:
        lines += ["## Where each request's time goes (traces phase: p50 of each stage, ms)", "", "```",
                  traced["table"], "```", ""]
    decoded = next((r for r in results if r.get("phase") == "decode" and r.get("table")), None)
    if decoded:
        lines += ["## Where the pipeline decodes (decode phase: p50 of each stage, ms)", "", "```",
                  decoded["table"], "```", ""]
    return "\n".join(lines)


def write_all(out: Path, results: list[dict], meta: dict, samples: list[dict], work: Path) -> list[str]:
    out = Path(out)
    (out / "summary.md").write_text(summary_text(results, meta, samples))
    slim = [{k: v for k, v in r.items() if k != "output"} for r in results]
    (out / "results.json").write_text(json.dumps({"meta": meta, "phases": slim}, indent=1, default=str))
    with open(out / "log.txt", "w") as log:
        for r in results:
            log.write(f"===== {r['phase']}: {r['status']} {r.get('reason', '')}\n{r.get('output', '')}\n")
    ran = {r["phase"]: r for r in results}
    for name, phase in PHASE_FILES.items():
        src = work / name
        if src.exists():
            shutil.copy(src, out / name)
        else:
            r = ran.get(phase, {})
            (out / name).write_text(f"{phase}: {r.get('status', 'not run')} {r.get('reason', '')}\n")
    files = [p.name for p in out.iterdir() if p.is_file()]
    extra = sorted(set(files) - set(runner.OUT_FILES) - set(runner.OPTIONAL_FILES))
    if extra or len(files) > runner.MAX_FILES:
        print(f"warning: {out} holds {len(files)} files ({', '.join(extra)} not written by gpu-check); "
              f"a device call returns at most {runner.MAX_FILES}")
    return files
