"""servelab.serve.threads: a lone inference gets every core, concurrent ones a share,
within a process (threads) and across processes (Triton instances)."""

import os
import signal
import threading
import time

import pytest

from servelab.serve import threads
from tests.forked import child_inside

RUNNABLE_NOW = threads.runnable_now   # the real count, before quiet_machine replaces it


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """The share rule on a machine with no other work (the test machine may be busy)."""
    monkeypatch.setattr(threads, "runnable_now", lambda: 1)


def test_lone_inference_gets_every_core():
    share = threads.CoreShare(cores=4)
    with share.threads() as n:
        assert n == 4
    with share.threads() as n:  # sequential requests: every one is alone
        assert n == 4


def test_concurrent_inferences_in_one_process_share_the_cores():
    share = threads.CoreShare(cores=2)
    inside, release, got = threading.Event(), threading.Event(), []

    def first():
        with share.threads() as n:
            got.append(n)
            inside.set()
            release.wait(10)

    t = threading.Thread(target=first)
    t.start()
    assert inside.wait(10)
    with share.threads() as n:
        got.append(n)
    release.set()
    t.join(10)
    assert got == [2, 1]


def test_workers_bound_the_inferences_running_at_once():
    share = threads.CoreShare(cores=2, workers=1)
    inside, release, order = threading.Event(), threading.Event(), []

    def first():
        with share.threads():
            inside.set()
            release.wait(10)
            order.append("first done")

    t = threading.Thread(target=first)
    t.start()
    assert inside.wait(10)
    threading.Timer(0.3, release.set).start()
    with share.threads() as n:
        order.append("second ran")
        assert n == 2  # one worker: whoever runs has every core
    t.join(10)
    assert order == ["first done", "second ran"]


def test_instances_in_other_processes_count_each_other(tmp_path):
    busy = child_inside(lambda: threads.CoreShare(cores=2, group="m", lock_dir=str(tmp_path), server=1).threads(), 30)
    try:
        share = threads.CoreShare(cores=2, group="m", lock_dir=str(tmp_path), server=1)
        with share.threads() as n:
            assert n == 1  # another instance of the model is busy: a share
        other_model = threads.CoreShare(cores=2, group="m2", lock_dir=str(tmp_path), server=1)
        other_server = threads.CoreShare(cores=2, group="m", lock_dir=str(tmp_path), server=2)
        for alone in (other_model, other_server):
            with alone.threads() as n:
                assert n == 2
    finally:
        os.kill(busy, signal.SIGKILL)  # a crashed instance: the kernel drops its lock
        os.waitpid(busy, 0)
    with share.threads() as n:
        assert n == 2
    share.close()


def test_a_busy_machine_gets_one_thread_per_inference(monkeypatch):
    share = threads.CoreShare(cores=2)
    monkeypatch.setattr(threads, "runnable_now", lambda: 7)
    with share.threads() as n:
        assert n == 1  # others keep the cores busy: a 2-thread pass would wait on them
    monkeypatch.setattr(threads, "runnable_now", lambda: 6)
    with share.threads() as n:
        assert n == 2


# --------------------------------------------------------------------------
# Issue 38, item 4: the lock files sit at a predictable name in a folder
# everyone can write (/dev/shm)
# --------------------------------------------------------------------------

def test_a_planted_symlink_is_not_followed(tmp_path, caplog):
    """Someone plants a link where a lock file will be: the kit does not
    create (or open) its target, and inference still runs, alone."""
    target = tmp_path / "victim" / "created-by-the-kit"
    target.parent.mkdir()
    link = threads.lock_path(str(tmp_path), 1, "m")
    os.symlink(target, link)
    share = threads.CoreShare(cores=2, group="m", lock_dir=str(tmp_path), server=1)
    assert not target.exists() and os.path.islink(link)
    assert "not opened" in caplog.text
    with share.threads() as n:
        assert n == 2
    share.close()
    # An existing target is not opened either (not truncated, not locked).
    target.write_text("precious")
    threads.CoreShare(cores=2, group="m", lock_dir=str(tmp_path), server=1).close()
    assert target.read_text() == "precious"


def test_a_hard_link_or_a_foreign_file_is_not_used(tmp_path, monkeypatch, caplog):
    mine = tmp_path / "elsewhere"
    mine.write_text("")
    os.link(mine, threads.lock_path(str(tmp_path), 1, "m"))
    share = threads.CoreShare(cores=2, group="m", lock_dir=str(tmp_path), server=1)
    assert share._fd is None and "not a plain file of ours" in caplog.text
    share.close()
    # A regular file owned by another user (as fstat reports it here).
    real_fstat = os.fstat
    monkeypatch.setattr(threads.os, "fstat", lambda fd: os.stat_result(
        (*real_fstat(fd)[:4], os.getuid() + 1, *real_fstat(fd)[5:])))
    assert threads.open_lock(threads.lock_path(str(tmp_path), 2, "m")) is None


def test_lock_files_are_removed_for_a_stopped_server(tmp_path):
    for server, group in ((7, "a"), (7, "b"), (8, "a")):
        threads.CoreShare(cores=2, group=group, lock_dir=str(tmp_path), server=server).close()
    os.symlink(tmp_path / "target", threads.lock_path(str(tmp_path), 7, "c"))
    (tmp_path / "target").write_text("kept")
    removed = threads.remove_locks(7, str(tmp_path))
    assert sorted(removed) == sorted(os.path.basename(threads.lock_path(str(tmp_path), 7, g)) for g in "abc")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [os.path.basename(threads.lock_path(str(tmp_path), 8, "a")), "target"])
    assert (tmp_path / "target").read_text() == "kept"


def _record(share: threads.CoreShare, slot: int, start: float, end: float, before: float) -> None:
    threads.TIMES.pack_into(share._times, threads.TIMES_OFFSET + slot * threads.TIMES.size, start, end, before)


def test_a_peer_between_back_to_back_passes_counts_as_busy(tmp_path, monkeypatch):
    """Two instances at a steady load: the peer is idle only for the instant between two
    passes. Seen by locks alone, it looked idle there and this instance took every core
    for a whole pass beside it (issue 36). At one client, instances taking turns keep every core."""
    monkeypatch.setattr(threads, "machine_busy", lambda cores: False)
    share = threads.CoreShare(cores=2, group="m", lock_dir=str(tmp_path), server=1)
    now = time.monotonic()
    pass_s = 0.025
    # slot 0 is ours (the first free byte); slot 1 a peer that ended 1 ms ago,
    # after a 25 ms pass that followed its previous one by 1 ms.
    peer = (now - 0.001 - pass_s, now - 0.001, now - 0.002 - pass_s)
    _record(share, 1, *peer)
    _record(share, 0, now - 0.001 - pass_s, now - 0.001, now - 0.002 - pass_s)   # we are back to back too
    with share.threads() as n:
        assert n == 1
    now = time.monotonic()
    _record(share, 1, now - 0.001 - pass_s, now - 0.001, now - 0.002 - pass_s)
    _record(share, 0, now - 0.030 - pass_s, now - 0.030, now - 0.1)   # we were idle a whole pass: one client
    with share.threads() as n:
        assert n == 2
    now = time.monotonic()
    _record(share, 0, now - 0.001 - pass_s, now - 0.001, now - 0.002 - pass_s)
    _record(share, 1, now - 0.001 - pass_s, now - 0.001, now - 0.030 - 2 * pass_s)   # turns: busy half its cycle
    with share.threads() as n:
        assert n == 2
    now = time.monotonic()
    _record(share, 0, now - 0.001 - pass_s, now - 0.001, now - 0.002 - pass_s)
    _record(share, 1, now - 0.030 - pass_s, now - 0.030, now - 0.031 - pass_s)   # ended over a pass ago
    with share.threads() as n:
        assert n == 2
    share.close()


def test_pass_times_are_recorded_in_the_group_file(tmp_path):
    share = threads.CoreShare(cores=2, group="m", lock_dir=str(tmp_path), server=1)
    for _ in range(2):
        t0 = time.monotonic()
        with share.threads():
            time.sleep(0.01)
    start, end, before = threads.TIMES.unpack_from(share._times, threads.TIMES_OFFSET)
    assert t0 <= start < end <= time.monotonic() and end - start >= 0.01 and 0 < before <= start
    share.close()


@pytest.mark.quiet   # counts every thread ready to run on the machine: alone, or others' threads count
def test_runnable_now_counts_threads_ready_now_not_the_minute_before():
    """Eight spinning processes are counted while they spin and not once they have stopped
    (the 1-minute load average would still carry them). The same count in food_classifier's
    core_share.py, which the Triton model reads."""
    import importlib.util
    import subprocess
    import sys

    from servelab.core import paths

    spec = importlib.util.spec_from_file_location(
        "core_share", paths.MODELS_STAGING / "food_classifier" / "1" / "core_share.py")
    core_share = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(core_share)
    read = {"threads": RUNNABLE_NOW, "core_share": core_share.runnable_now}
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(8)]
    try:
        time.sleep(0.5)
        during = {name: f() for name, f in read.items()}
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    time.sleep(0.2)
    after = {name: f() for name, f in read.items()}
    assert all(n >= 8 for n in during.values()), during
    assert all(1 <= n < 8 for n in after.values()), after
