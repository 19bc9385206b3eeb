"""Run a command in a network namespace of its own, whose only interface is its own loopback.

    python -I servelab/triton/netns.py -- CMD ARGS...   # CMD runs inside (this process execs it)
    python -I servelab/triton/netns.py --check          # exit 0 if it can, else 125 and one line why

Model Analyzer's local profile runs under it (:mod:`servelab.triton.analyzer`): its private
tritonserver, whose model-repository API has no key, then listens on a 127.0.0.1 that no
other process on the machine shares, and no web page can reach. PIDs, files and ``/dev/shm``
stay shared, so the kit follows and stops what it starts as before.

How: ``unshare(CLONE_NEWNET)`` where this process may (root); otherwise, as any user where
unprivileged user namespaces are enabled, ``unshare(CLONE_NEWUSER | CLONE_NEWNET)`` with the
user's own uid and gid mapped to themselves (so files, ``/dev/shm`` regions and signals are
the user's, as before). Then ``lo`` is brought up (``SIOCSIFFLAGS``, what ``ip link set lo up``
does) and the command is exec'd; a user's capabilities in the namespace end at that exec.
Standard library only, run with ``python -I`` by path: no import of the kit.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import subprocess
import sys

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS = 0x8913, 0x8914
IFF_UP = 0x1
FAILED = 125   # what util-linux's unshare returns when it cannot


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def enter() -> None:
    """Move this process (single-threaded) into a new network namespace with ``lo`` up;
    an OSError says why it cannot."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(CLONE_NEWNET) != 0:
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"unshare(CLONE_NEWUSER|CLONE_NEWNET) as uid {uid}: {os.strerror(err)}")
        _write("/proc/self/setgroups", "deny")     # needed to map a group without privilege
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH22x", b"lo", 0))
        flags = struct.unpack_from("16sH", ifreq)[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


def command(cmd: list[str]) -> list[str]:
    """``cmd`` run in a network namespace of its own."""
    return [sys.executable, "-I", os.path.abspath(__file__), "--", *cmd]


def unavailable() -> str | None:
    """None if this machine can give a command a network namespace of its own; else why not (one line)."""
    proc = subprocess.run([sys.executable, "-I", os.path.abspath(__file__), "--check"],
                          capture_output=True, text=True, timeout=30)
    if proc.returncode == 0:
        return None
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit status {proc.returncode}"


def main(argv: list[str]) -> int:
    check = argv == ["--check"]
    cmd = argv[1:] if argv[:1] == ["--"] else argv
    if not check and not cmd:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        enter()
    except OSError as err:
        where = f" ({err.filename})" if err.filename else ""
        print(f"netns: no network namespace of its own: {err.strerror or err}{where}", file=sys.stderr)
        return FAILED
    if check:
        return 0
    try:
        os.execvp(cmd[0], cmd)
    except OSError as err:
        print(f"netns: cannot run {cmd[0]}: {err}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
