"""The lease clock: how many minutes the Chameleon lease has left, where the student works.

Notebook 2 (in Chameleon Jupyter, where python-chi knows the lease) writes the
lease's end time into the kit's folder on the node, ``lease-end.txt``: one line,
the end in UTC (``2026-11-26T10:55:00Z``). The node's shell (notebooks 3 and 5)
and the Jupyter container, which mounts the kit (notebooks 4 and 6), read it:

    python3 -m servelab.node.leaseclock          # on node-serve-system, in ~/serve-system-chi
    from servelab.node.leaseclock import show; show()   # first cell of notebooks 4 and 6

Without that file (a local run, or notebook 2 not run yet) the clock says there
is no lease and that nothing needs watching. Standard library only: it runs
with the node's own ``python3``.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

from servelab.core import paths

LEASE_END_FILE = "lease-end.txt"  # in the kit's root folder; never packed, never committed
WARN_MINUTES = 30                  # below this, save the work and extend or finish
STAMP = "%Y-%m-%dT%H:%M:%SZ"


def lease_end_path(root: str | os.PathLike | None = None) -> Path:
    return Path(root or paths.REPO_ROOT) / LEASE_END_FILE


def format_end(end: datetime) -> str:
    """The line notebook 2 writes: the lease's end in UTC (python-chi gives naive UTC datetimes)."""
    if end.tzinfo is not None:
        end = end.astimezone(timezone.utc)
    return end.strftime(STAMP)


def read_end(root: str | os.PathLike | None = None) -> datetime | None:
    """The lease's end (aware, UTC), or None when no lease is recorded here."""
    path = lease_end_path(root)
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    try:
        return datetime.strptime(text.split()[0], STAMP).replace(tzinfo=timezone.utc)
    except (ValueError, IndexError):
        raise ValueError(f"{path}: expected one line like 2026-11-26T10:55:00Z, found {text[:40]!r}; "
                         "run the 'Record the lease's end' cell of 2_create_server_nvidia again") from None


def minutes_left(root: str | os.PathLike | None = None, now: datetime | None = None) -> float | None:
    end = read_end(root)
    if end is None:
        return None
    now = now or datetime.now(timezone.utc)
    return (end - now).total_seconds() / 60


def message(root: str | os.PathLike | None = None, now: datetime | None = None) -> tuple[str, float | None]:
    """What the clock says, and the minutes left (None: no lease here)."""
    left = minutes_left(root, now)
    if left is None:
        return ("lease clock: no lease recorded here (no lease-end.txt in the kit's folder): a local run, "
                "nothing to watch."), None
    end = read_end(root)
    when = f"{end:%H:%M} UTC on {end:%Y-%m-%d}"
    if left <= 0:
        return (f"✘ lease clock: your lease ended at {when}, {-left:.0f} minutes ago: the node and its files "
                "can go at any moment. Copy your work now (7_delete_resources, 'Copy your work back'); "
                "to go on, start again from 1_create_lease."), left
    if left < WARN_MINUTES:
        return (f"⚠ lease clock: {left:.0f} minutes left (the lease ends at {when}). Save your work now: run "
                "the hand-in cell and download its zip, or copy everything to Chameleon Jupyter "
                "(7_delete_resources, 'Copy your work back'). Need more time? In Chameleon Jupyter, see "
                "'Recovery: the lease is about to end' in 2_create_server_nvidia."), left
    return f"lease clock: {left:.0f} minutes left (the lease ends at {when}).", left


def show(root: str | os.PathLike | None = None, now: datetime | None = None) -> float | None:
    """Print the clock's line; return the minutes left (None without a lease)."""
    text, left = message(root, now)
    print(text)
    return left


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("leaseclock", help="minutes left on the Chameleon lease (from lease-end.txt)")
    p.add_argument("--root", default=None, help="the kit's folder (default: this kit)")
    p.set_defaults(func=lambda args: _cmd(args))
    return p


def _cmd(args) -> int:
    show(args.root)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m servelab.node.leaseclock", description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=None, help="the kit's folder (default: this kit)")
    return _cmd(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
