"""models_staging/food_classifier/1/core_share.py: the instances of one Triton model (one process
each) share the CPU cores. Alone an instance gets every core; beside busy peers, a share; a peer
between two batches of a steady load counts as busy; a crashed peer never does."""

import importlib.util
import os
import signal
import time

import pytest

from servelab.core import paths
from tests.forked import child_inside

spec = importlib.util.spec_from_file_location(
    "core_share", paths.MODELS_STAGING / "food_classifier" / "1" / "core_share.py")
core_share = importlib.util.module_from_spec(spec)
spec.loader.exec_module(core_share)


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """The rule on a machine with no other work (the test machine may be busy)."""
    monkeypatch.setattr(core_share, "runnable_now", lambda: 1)


def share(tmp_path, model="m", server=1, cores=2):
    return core_share.CoreShare(model, cores=cores, folder=str(tmp_path), server=server)


def _peer_running(tmp_path, model="m", server=1):
    """Another instance, in its own process, running a batch until killed; its pid."""
    return child_inside(lambda: share(tmp_path, model, server).threads())


def test_an_instance_alone_gets_every_core_every_time(tmp_path):
    alone = share(tmp_path, cores=4)
    for _ in range(3):
        with alone.threads() as n:
            assert n == 4
    assert alone.thread_counts() == [1, 2, 4]
    alone.close()


def test_a_busy_peer_halves_the_share_and_a_crashed_one_stops_counting(tmp_path):
    peer = _peer_running(tmp_path)
    try:
        mine = share(tmp_path)
        assert mine.slot == 1   # the peer holds slot 0 for its life
        with mine.threads() as n:
            assert n == 1
        # Another model, or the same model on another server, is not a peer.
        for other in (share(tmp_path, model="m2"), share(tmp_path, server=2)):
            with other.threads() as n:
                assert n == 2
            other.close()
    finally:
        os.kill(peer, signal.SIGKILL)   # a crash: the kernel drops its locks
        os.waitpid(peer, 0)
    with mine.threads() as n:
        assert n == 2
    assert share(tmp_path).slot == 0    # its slot is free again
    mine.close()


def _record(s, slot, start, end, before):
    core_share.TIMES.pack_into(s.times, core_share.TIMES_AT + slot * core_share.TIMES.size, start, end, before)


def test_a_peer_between_two_batches_of_a_steady_load_counts_as_busy(tmp_path):
    """Under a steady load a peer is idle only for the instant between two batches; seen by its lock
    alone it would look idle there, and we would take every core for a whole batch beside it. At one
    client, instances that take turns (busy half their cycle) each keep every core."""
    mine = share(tmp_path)
    batch = 0.025
    now = time.monotonic()
    _record(mine, 1, now - 0.001 - batch, now - 0.001, now - 0.002 - batch)        # back to back
    with mine.threads() as n:
        assert n == 1
    now = time.monotonic()
    _record(mine, 1, now - 0.001 - batch, now - 0.001, now - 0.030 - 2 * batch)    # turns: half its cycle
    with mine.threads() as n:
        assert n == 2
    now = time.monotonic()
    _record(mine, 1, now - 0.030 - batch, now - 0.030, now - 0.031 - batch)        # ended over a batch ago
    with mine.threads() as n:
        assert n == 2
    mine.close()


def test_each_batch_is_recorded_for_the_peers(tmp_path):
    mine = share(tmp_path)
    for _ in range(2):
        t0 = time.monotonic()
        with mine.threads():
            time.sleep(0.01)
    start, end, before = core_share.TIMES.unpack_from(mine.times, core_share.TIMES_AT + mine.slot * core_share.TIMES.size)
    assert t0 <= start < end <= time.monotonic() and end - start >= 0.01 and 0 < before <= start
    mine.close()


def test_a_busy_machine_gets_one_thread(tmp_path, monkeypatch):
    mine = share(tmp_path)
    monkeypatch.setattr(core_share, "runnable_now", lambda: 7)
    with mine.threads() as n:
        assert n == 1   # other programs keep the cores busy: a 2-thread batch would wait on them
    monkeypatch.setattr(core_share, "runnable_now", lambda: 6)
    with mine.threads() as n:
        assert n == 2
    mine.close()


def test_a_planted_link_or_a_foreign_file_is_refused(tmp_path):
    """/dev/shm is writable by every user: a link planted at the file's name is not followed (its
    target is neither created nor opened), and a hard link is not used."""
    name = f"servelab-cores-{os.getuid()}-1-m"
    target = tmp_path / "victim"
    os.symlink(target, tmp_path / name)
    with pytest.raises(OSError):
        share(tmp_path)
    assert not target.exists()
    (tmp_path / name).unlink()
    target.write_text("precious")
    os.link(target, tmp_path / name)
    with pytest.raises(PermissionError, match="not a plain file"):
        share(tmp_path)
    assert target.read_text() == "precious"


def test_the_stack_removes_the_file_when_the_server_stops(tmp_path):
    """servelab.serve.threads.remove_locks (called when the kit stops a Triton) finds this file by its name."""
    from servelab.serve import threads

    share(tmp_path, server=7).close()
    assert threads.remove_locks(7, str(tmp_path)) == [f"servelab-cores-{os.getuid()}-7-m"]
    assert list(tmp_path.iterdir()) == []
