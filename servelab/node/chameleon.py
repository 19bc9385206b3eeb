"""Chameleon Cloud resources for the lab, with python-chi 1.2.10.

The provisioning notebooks (1_create_lease, 2_create_server_nvidia,
7_delete_resources) call python-chi directly, because learning that API is part
of the lab; their names and settings are the constants below (a test keeps
the notebooks and this module in step). This module adds what a terminal user
or an instructor needs when a notebook is not at hand:

    python -m servelab chameleon status  [--user NAME]
    python -m servelab chameleon cleanup [--user NAME]   # server, floating IPs, lease
    python -m servelab.node.chameleon pack [ARCHIVE]          # the kit as one archive (standard library only)

``pack`` makes the archive that notebook 2 uploads to the node and that an
instructor publishes as the lab's Trovi artifact (``make kit-archive``): the
kit's tracked files only (``git ls-files`` when the copy is a git clone; the
same exclusions otherwise), never ``.venv/``, ``build/``, ``results/``,
``docker/.env`` or built model files.

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
import fnmatch
import getpass
import os
import subprocess
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from servelab.core import paths

# Pinned because the notebooks rely on its signatures and on the traps above.
PYTHON_CHI_VERSION = "1.2.10"

SITE = "CHI@TACC"                 # where the gpu_p100 nodes are
NODE_TYPE = "gpu_p100"            # bare metal, 2x Tesla P100 16 GB
NODE_COUNT = 1
LEASE_HOURS = 3
IMAGE = "CC-Ubuntu24.04-CUDA"     # ships CUDA 12.6 and driver 560 (supports Pascal)
KIT_DIR = paths.KIT_DIR_ON_NODE   # the kit's folder in the cc user's home on the node
# Notebook 2 uploads the Chameleon Jupyter copy of the kit; setting this environment
# variable to a git URL makes it clone that repository on the node instead.
KIT_REPO_URL_ENV = "KIT_REPO_URL"
KIT_ARCHIVE = f"{KIT_DIR}.tar.gz"  # what `make kit-archive` writes (under dist/)

# Never packed, whatever git says: local environments, build outputs, results,
# secrets, caches and the generated model files (rebuilt on the node).
PACK_EXCLUDE = (
    ".git", ".git/*", ".venv", ".venv/*", "build/*", "dist/*", "results/*", "docker/.env", ".env",
    "lease-end.txt",
    "*/__pycache__/*", "__pycache__/*", "*.pyc", "*/.ipynb_checkpoints/*", ".ipynb_checkpoints/*",
    ".pytest_cache/*", ".hypothesis/*", "*.egg-info/*", "*.tar.gz",
    "fastapi_pt/food11.pth*", "fastapi_onnx/food11.onnx*",
    "models_staging/*/1/food11.pth*", "models_staging/*/1/model.onnx*",
)


def _excluded(rel: str) -> bool:
    return any(fnmatch.fnmatchcase(rel, pattern) for pattern in PACK_EXCLUDE)


def kit_files(root: str | os.PathLike) -> list[str]:
    """The kit's files, relative to ``root``, sorted: the tracked files of a git
    clone, or every file minus :data:`PACK_EXCLUDE` in a copy without git
    (a Trovi artifact or an upload)."""
    root = Path(root)
    listed = None
    if (root / ".git").exists():
        try:
            out = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=True,
                                 timeout=60).stdout
            listed = [name for name in out.decode().split("\0") if name]
        except (OSError, subprocess.SubprocessError):
            listed = None  # no git program here: fall back to the exclusion rules
    if listed is None:
        listed = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() or p.is_symlink()]
    return sorted(rel for rel in listed
                  if not _excluded(rel) and (root / rel).is_file() and not (root / rel).is_symlink())


def pack_kit(root: str | os.PathLike, archive: str | os.PathLike, top: str = KIT_DIR) -> tuple[Path, list[str]]:
    """Write the kit's files into ``archive`` (.tar.gz) under the folder ``top``;
    return the archive's path and the files packed."""
    root, archive = Path(root), Path(archive)
    files = kit_files(root)
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        for rel in files:
            tar.add(root / rel, arcname=f"{top}/{rel}", recursive=False)
    return archive, files


def unpack(archive: str | os.PathLike, dest: str | os.PathLike) -> list[str]:
    """Extract ``archive`` into ``dest`` (regular files and folders only, no
    path leaving ``dest``); return the member names."""
    dest = Path(dest).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        members = []
        for m in tar.getmembers():
            target = (dest / m.name).resolve()
            if not (m.isfile() or m.isdir()) or not target.is_relative_to(dest):
                raise ValueError(f"{archive}: refusing member {m.name!r}")
            members.append(m)
        extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(dest, members=members, **extra)
    return [m.name for m in members if m.isfile()]


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


def _cmd_pack(args) -> int:
    archive, files = pack_kit(args.root, args.archive)
    size_mb = archive.stat().st_size / 1e6
    print(f"{archive}: {len(files)} files, {size_mb:.1f} MB, unpacks into {KIT_DIR}/")
    return 0


def main(argv=None) -> int:
    """``python -m servelab.node.chameleon``: standard library only for ``pack``."""
    parser = argparse.ArgumentParser(prog="python -m servelab.node.chameleon")
    sub = parser.add_subparsers(dest="command", required=True)
    pk = sub.add_parser("pack", help="write the kit's tracked files into one .tar.gz")
    pk.add_argument("archive", nargs="?", default=f"dist/{KIT_ARCHIVE}")
    pk.add_argument("--root", default=str(Path(__file__).resolve().parents[2]), help=argparse.SUPPRESS)
    pk.set_defaults(func=_cmd_pack)
    add_parser(sub)
    ns = parser.parse_args(argv)
    return ns.func(ns)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
