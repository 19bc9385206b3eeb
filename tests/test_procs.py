"""procs.stop_group, the kit's one "SIGTERM, wait, SIGKILL": whole groups,
stubborn processes, orphans of an exited leader, and no signal to a group
number that may have been reused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from servelab.core import procs

# A leader that starts a child in its own group, prints the child's PID, then waits.
LEADER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", {child!r}])
print(child.pid, flush=True)
{after}
"""
IGNORE_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"


def _group(child: str = "import time; time.sleep(60)", after: str = "time.sleep(60)") -> tuple:
    proc = subprocess.Popen([sys.executable, "-c", LEADER.format(child=child, after=after)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    child_pid = int(proc.stdout.readline())
    return proc, child_pid


def _gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while procs.pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_sigterm_stops_the_whole_group():
    proc, child = _group()
    t0 = time.monotonic()
    assert procs.stop_group(proc.pid, 10.0, proc=proc) is False
    assert time.monotonic() - t0 < 5
    assert proc.returncode is not None and _gone(child)


def test_a_process_that_ignores_sigterm_is_killed_after_the_timeout():
    proc, child = _group(child=IGNORE_TERM)
    time.sleep(0.3)  # let the child install its handler
    assert procs.stop_group(proc.pid, 1.0, proc=proc, wait_for_group=True) is True
    assert _gone(child)


def test_leader_only_then_orphans_of_the_exited_leader_are_killed():
    # SIGTERM reaches the leader alone (it exits); its child ignores nothing but
    # never got the signal: it is left in the group and SIGKILLed as an orphan.
    proc, child = _group()
    assert procs.stop_group(proc.pid, 10.0, proc=proc, leader_only=True) is False
    assert proc.returncode == -signal.SIGTERM
    assert _gone(child)


def test_no_signal_to_the_group_number_once_leader_and_group_are_gone(monkeypatch):
    # The leader kills and reaps its child, then exits: the group is empty.
    proc, child = _group(after="child.kill(); child.wait()")
    proc.wait(10)
    assert not procs.pid_alive(child) and not procs.group_pids(proc.pid)
    sent = []
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: sent.append((pgid, sig)))
    # The number may belong to someone else by now (PID reuse): nothing is signalled.
    assert procs.stop_group(proc.pid, 1.0, proc=proc) is False
    assert sent == []


def test_pid_alive_treats_zombies_as_dead():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while procs.pid_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not procs.pid_alive(proc.pid)  # exited, not yet reaped
    proc.wait(5)
    assert not procs.pid_alive(-1) and not procs.pid_alive(0)


# ---- free_port(): a range below the kernel's ephemeral ports, each port handed out once ----

def test_port_range_reads_the_env_and_refuses_nonsense(monkeypatch):
    monkeypatch.setenv(procs.PORT_RANGE_ENV, "21000-21099")
    assert procs.port_range() == (21000, 21099)
    for bad in ("21000", "a-b", "80-90", "30000-20000"):
        monkeypatch.setenv(procs.PORT_RANGE_ENV, bad)
        with pytest.raises(ValueError, match=procs.PORT_RANGE_ENV):
            procs.port_range()
    monkeypatch.delenv(procs.PORT_RANGE_ENV)
    lo, hi = procs.port_range()
    # the default ends below the ephemeral range, where outgoing connections take their ports
    assert hi < procs._ephemeral_low() and hi - lo >= 1000


@pytest.mark.integration   # binds sockets
def test_free_port_skips_a_listener_and_never_repeats(monkeypatch):
    import socket

    monkeypatch.setenv(procs.PORT_RANGE_ENV, "23100-23109")
    monkeypatch.setattr(procs, "_handed_out", set())
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 23105))
        listener.listen()
        got = [procs.free_port() for _ in range(9)]
        assert sorted(got) == [p for p in range(23100, 23110) if p != 23105]
        with pytest.raises(OSError, match="no free TCP port in 23100-23109"):
            procs.free_port()
