"""Chameleon Cloud resources for the lab, with python-chi 1.2.10.

The provisioning notebooks (1_create_lease, 2_create_server_nvidia,
7_delete_resources) call python-chi directly, because learning that API is part
of the lab; their names and settings are the constants below (a test keeps
the notebooks and this module in step). This module adds what a terminal user
or an instructor needs when a notebook is not at hand:

    python -m servelab chameleon status  [--user NAME]
    python -m servelab chameleon cleanup [--user NAME]   # server, floating IPs, lease

Credentials come from the usual OpenStack environment (source the
``*-openrc.sh`` file downloaded from the Chameleon dashboard first).

python-chi 1.2.10 traps handled here (see the platform notes):
* ``Server.delete()`` does not give floating IPs back: its own clean-up sends
  a request the network service ignores. Release each address with
  ``chi.network.deallocate_floating_ip``.
* ``submit()``/``show()`` default to Jupyter widgets; pass ``show="text"`` in
  scripts.
* ``from chi import lease`` needs python-blazarclient installed beside it.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from dataclasses import dataclass, field
from typing import Callable

# Pinned because the notebooks rely on its signatures and on the traps above.
PYTHON_CHI_VERSION = "1.2.10"

SITE = "CHI@TACC"                 # where the gpu_p100 nodes are
NODE_TYPE = "gpu_p100"            # bare metal, 2x Tesla P100 16 GB
NODE_COUNT = 1
LEASE_HOURS = 3
IMAGE = "CC-Ubuntu24.04-CUDA"     # ships CUDA 12.6 and driver 560 (supports Pascal)
KIT_DIR = "serve-system-chi"      # the kit's folder in the cc user's home on the node
# The kit's git repository; the notebooks clone it onto the node. A fork sets its own.
KIT_REPO_URL = "https://github.com/servelab-kit/serve-system-chi.git"


def lease_name(user: str) -> str:
    """The lab's lease, named after the Chameleon user so classmates never collide."""
    return f"serve-system-{user}"


def server_name(user: str) -> str:
    """The GPU node; shell cells say ``# runs on node-serve-system``."""
    return f"node-serve-system-{user}"


def default_user() -> str:
    """Chameleon's Jupyter sets USER to the Chameleon user name."""
    return os.environ.get("USER") or getpass.getuser()


def release_floating_ips(addresses, deallocate: Callable[[str], None] | None = None) -> list[str]:
    """Give each floating IP back to the site's pool; return those released.

    An address that is already gone is skipped, so a second call is harmless.
    """
    from chi import network
    from chi.exception import CHIValueError

    deallocate = deallocate or network.deallocate_floating_ip
    released = []
    for address in addresses:
        try:
            deallocate(address)
        except CHIValueError:  # python-chi's "Floating IP ... not found"
            continue
        released.append(address)
    return released


@dataclass
class CleanupReport:
    server_deleted: bool = False
    released_ips: list[str] = field(default_factory=list)
    leases_deleted: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [
            "server: " + ("deleted" if self.server_deleted else "none found"),
            "floating IPs released: " + (", ".join(self.released_ips) or "none"),
            "leases deleted: " + (", ".join(self.leases_deleted) or "none"),
        ]


def use_site(site: str = SITE, project: str | None = None) -> None:
    from chi import context

    if project:
        context.use_project(project)
    context.use_site(site)


def find_leases(user: str):
    """Every lease of this lab for ``user`` (expired ones included)."""
    from chi import lease

    return [item for item in lease.list_leases() if item.name == lease_name(user)]


def cleanup(user: str) -> CleanupReport:
    """Delete the user's lab server, release its floating IPs, delete its lease(s).

    Safe to run twice: whatever is already gone is skipped.
    """
    from chi import server

    report = CleanupReport()
    name = server_name(user)
    if server.get_server_id(name):
        node = server.get_server(name)
        addresses = node.get_all_floating_ips()
        node.delete(idempotent=True, delete_ips=False)  # IPs released below, properly
        report.server_deleted = True
        report.released_ips = release_floating_ips(addresses)
    for item in find_leases(user):
        item.delete()
        report.leases_deleted.append(item.name)
    return report


def status(user: str) -> list[str]:
    from chi import server

    lines = []
    leases = find_leases(user)
    if not leases:
        lines.append(f"lease {lease_name(user)}: none")
    for item in leases:
        lines.append(f"lease {item.name}: {item.status} (ends {item.end_date:%Y-%m-%d %H:%M} UTC)")
    name = server_name(user)
    if server.get_server_id(name):
        node = server.get_server(name)
        ips = ", ".join(node.get_all_floating_ips()) or "no floating IP"
        lines.append(f"server {name}: {node.status}, {ips}")
    else:
        lines.append(f"server {name}: none")
    return lines


# --------------------------------------------------------------------------
# Command line


def add_parser(sub) -> None:
    p = sub.add_parser("chameleon", help="show or clean up this lab's Chameleon resources (needs OpenStack credentials)")
    csub = p.add_subparsers(dest="chameleon_command", metavar="ACTION")
    csub.required = True
    for action, helptext, func in (
        ("status", "show the lab's lease and server", _cmd_status),
        ("cleanup", "delete the server, release its floating IPs, delete the lease", _cmd_cleanup),
    ):
        a = csub.add_parser(action, help=helptext)
        a.add_argument("--user", default=None, help="Chameleon user name the resources are named after (default: $USER)")
        a.add_argument("--site", default=SITE, help=f"Chameleon site (default: {SITE})")
        a.add_argument("--project", default=None, help="project name (default: $OS_PROJECT_NAME)")
        a.set_defaults(func=func)


def _prepare(args: argparse.Namespace) -> str:
    use_site(args.site, args.project)
    return args.user or default_user()


def _cmd_status(args) -> int:
    user = _prepare(args)
    for line in status(user):
        print(line)
    return 0


def _cmd_cleanup(args) -> int:
    user = _prepare(args)
    report = cleanup(user)
    for line in report.lines():
        print(line)
    return 0


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser(prog="servelab")
    add_parser(parser.add_subparsers(dest="command"))
    ns = parser.parse_args()
    sys.exit(ns.func(ns))
