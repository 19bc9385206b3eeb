"""``servelab gpu-pack`` and ``servelab gpu-check``: the whole GPU run in one prepared command.

A lent GPU machine (the workplace's device tool) is bare: it has a copy of the
repository, whatever folder is carried with it (64 MiB in all), its own
Python 3.12 with CUDA torch, and no network. So:

* ``gpu-pack`` (``make gpu-pack``, here) writes ``build/gpu-pack/``: one xz
  archive with what that machine lacks: tritonserver 2.51 and its Python backend
  with the Python 3.12 stub, perf_analyzer and its two libraries, numpy 1.26
  for the stub, the FastAPI set and tritonclient's gRPC part
  (:mod:`servelab.gpucheck.pack`).
* ``gpu-check`` (``make gpu-check``, there) unpacks it and runs the phases, each
  in its own process under its own time limit, a failure recorded and the next
  phase started: probe, models, FastAPI PyTorch on CUDA, Triton on ``KIND_GPU``
  at 1 and 2 instances with perf_analyzer, the tour at reduced scale, the
  ``cuda`` tests. It writes at most 8 files, ``summary.md`` (the figures table)
  among them (:mod:`servelab.gpucheck.runner`, phases in
  :mod:`servelab.gpucheck.phases`).

``gpu-check --device cpu --tiny`` is the same script at toy sizes on this
machine's venv: the test suite runs it (tests/test_gpu_check.py), so the
plumbing is proven before a GPU minute is spent.

This module imports only the standard library: ``gpu-check`` starts on a bare
machine's python3.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(subparsers) -> None:
    from servelab.gpucheck import pack, runner

    p = subparsers.add_parser(
        "gpu-check", help="the whole GPU run in one command (make gpu-check; --device cpu --tiny: the dry run)",
        description=runner.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None,
                   help="folder for the result files (default $OUT, else results/gpu-check)")
    p.add_argument("--pack", type=Path, default=pack.DEFAULT_DIR,
                   help=f"folder holding {pack.ARCHIVE_NAME} (default {pack.DEFAULT_DIR}); "
                        "without one this interpreter's packages are used")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="cuda: expect a GPU (a phase that finds none fails); cpu: hide any GPU (the dry run); "
                        "auto (default): cuda where nvidia-smi or /dev/nvidia0 exists, else cpu")
    p.add_argument("--tiny", action="store_true", help="toy sizes: proves the plumbing, measures nothing")
    p.add_argument("--budget", type=float, default=None,
                   help=f"seconds for the whole run (default {runner.BUDGET_S:.0f}; --tiny {runner.TINY_BUDGET_S:.0f})")
    p.add_argument("--phases", default=",".join(runner.PHASE_NAMES),
                   help=f"comma-separated subset of {','.join(runner.PHASE_NAMES)}")
    p.set_defaults(func=_cmd_gpu_check)

    q = subparsers.add_parser(
        "gpu-pack", help=f"write {pack.DEFAULT_DIR}/{pack.ARCHIVE_NAME}, the folder a GPU machine needs (make gpu-pack)",
        description=pack.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    q.add_argument("--out", type=Path, default=pack.DEFAULT_DIR, help=f"folder (default {pack.DEFAULT_DIR})")
    q.add_argument("--wheels", type=Path, default=None,
                   help="folder of already downloaded cp312 wheels (default: pip download into the build folder)")
    q.add_argument("--list", action="store_true", help="print what would be packed and its size; write nothing")
    q.set_defaults(func=_cmd_gpu_pack)


def _cmd_gpu_check(args) -> int:
    from servelab.gpucheck import check, runner

    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = sorted(set(phases) - set(runner.PHASE_NAMES))
    if unknown:
        print(f"error: unknown phase(s) {', '.join(unknown)}; choose from {', '.join(runner.PHASE_NAMES)}",
              file=sys.stderr)
        return 2
    if args.budget is not None and not 10 <= args.budget <= 3600:
        print("error: --budget must be within [10, 3600] seconds", file=sys.stderr)
        return 2
    return check.main(out=args.out, pack_dir=args.pack, device=args.device, tiny=args.tiny,
                       budget=args.budget, phases=phases)


def _cmd_gpu_pack(args) -> int:
    from servelab.gpucheck import pack

    try:
        if args.list:
            sel = pack.select()
            print(pack.describe(sel))
            return 0
        result = pack.build(args.out, wheels=args.wheels)
    except pack.PackError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(result)
    return 0
