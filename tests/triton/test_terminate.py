"""servelab.triton.process.terminate says when the server died of a signal the kit did not send
(tritonserver 2.51 once got SIGSEGV while stopping, in CI on 2026-11-28), and not otherwise."""

from __future__ import annotations

import subprocess
import sys

import pytest

from servelab.triton.process import terminate


def _started(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def test_a_server_that_crashed_is_reported():
    proc = _started("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    proc.wait(timeout=30)
    forced = terminate(proc.pid, "", 2.0, proc)
    assert forced == [f"tritonserver {proc.pid} crashed (SIGSEGV) while stopping"]


@pytest.mark.parametrize("code", ["import time; time.sleep(60)",   # stops on the kit's SIGTERM
                                  "import sys; sys.exit(0)"])      # exited cleanly by itself
def test_a_server_the_kit_stopped_or_that_exited_is_not_a_crash(code):
    proc = _started(code)
    if "exit" in code:
        proc.wait(timeout=30)
    assert terminate(proc.pid, "", 10.0, proc) == []
    assert proc.returncode is not None
