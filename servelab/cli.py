"""`python -m servelab ...`: the kit's command line.

Each subcommand lives in its own module, which exposes
``add_parser(subparsers)``; that function registers one or more
subcommands and sets ``func`` (called with the parsed args, returns an exit
code). Modules are imported only when the CLI starts, so a missing optional
dependency only breaks its own subcommand.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys

# Modules that contribute subcommands, in the order `--help` lists them.
COMMAND_MODULES = (
    "servelab.models",
    "servelab.samples",
    "servelab.triton_local",
    "servelab.stack",
    "servelab.tour",
    "servelab.bench.cli",
    "servelab.doctor",
    "servelab.notebooks",
    "servelab.site",
    "servelab.chameleon",
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
    parser = build_parser()
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
