"""`python -m servelab ...`: the kit's command line.

Each subcommand lives in its own module, which exposes
``add_parser(subparsers)``; that function registers one or more
subcommands and sets ``func=_cmd_<name>`` (called with the parsed args,
returns an exit code). Modules are imported only when the CLI starts, so a
missing optional dependency only breaks its own subcommand. A module that
also runs alone (``python -m servelab.measure.tour``) ends with
``raise SystemExit(cli.run_alone("servelab.measure.tour", "tour"))``; only
``servelab.node.doctor``, which must run on a node's bare system python3, keeps
its own stdlib ``main()`` of the same shape.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys

# Modules that contribute subcommands, in the order `--help` lists them.
COMMAND_MODULES = (
    "servelab.serve.models",
    "servelab.serve.samples",
    "servelab.triton",
    "servelab.local.stack",
    "servelab.local.scale",
    "servelab.measure.tour",
    "servelab.bench.cli",
    "servelab.node.doctor",
    "servelab.course.notebooks",
    "servelab.course.site",
    "servelab.course.reference",
    "servelab.node.chameleon",
    "servelab.gpucheck",
    "servelab.deploy.k8s",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="servelab",
        description="ServeLab: build the Food-11 models, run the local serving stack, benchmark it.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return parser


def _terminate(signum, frame):
    raise KeyboardInterrupt  # SIGTERM unwinds like Ctrl-C: `finally` blocks stop what a command started


def main(argv: list[str] | None = None, handle_sigterm: bool = False) -> int:
    return _dispatch(build_parser(), argv, handle_sigterm)


def run_alone(module: str, command: str, argv: list[str] | None = None) -> int:
    """``python -m <module> ARGS`` = ``python -m servelab <command> ARGS``, importing only ``module``."""
    parser = argparse.ArgumentParser(prog="servelab")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    importlib.import_module(module).add_parser(sub)
    return _dispatch(parser, [command, *(sys.argv[1:] if argv is None else argv)], handle_sigterm=True)


def _dispatch(parser: argparse.ArgumentParser, argv: list[str] | None, handle_sigterm: bool) -> int:
    args = parser.parse_args(argv)
    if handle_sigterm:
        signal.signal(signal.SIGTERM, _terminate)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def entry() -> int:
    """The program's entry point (`servelab`, `python -m servelab`)."""
    return main(handle_sigterm=True)
