"""`make test`'s quiet phase (tests/conftest.py): it collects only the files that mark tests
quiet, and a quiet mark hidden from that search stops the other phase's collection."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).with_name("conftest.py")


def _collect(folder: Path, markexpr: str) -> subprocess.CompletedProcess:
    # the copied conftest loads tests/tiers.py as tests.tiers: the repository on the path
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(CONFTEST.parents[1]),
                                                                    os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-m", markexpr], cwd=folder, capture_output=True, text=True,
                          timeout=120, env=env)


def test_quiet_phase_skips_other_files_and_a_hidden_quiet_mark_is_refused(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST.read_text())
    (tmp_path / "test_marked.py").write_text("import pytest\n\npytestmark = pytest.mark.quiet\n\n\n"
                                             "def test_timed():\n    pass\n")
    (tmp_path / "test_other.py").write_text("raise RuntimeError('this file was collected')\n")

    quiet = _collect(tmp_path, "quiet")
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr      # test_other.py was never imported
    assert "test_marked.py::test_timed" in quiet.stdout

    (tmp_path / "test_other.py").write_text("import pytest\n\nhidden = getattr(pytest.mark, 'qu' + 'iet')\n\n\n"
                                            "@hidden\ndef test_hidden():\n    pass\n")
    other = _collect(tmp_path, "not quiet")
    assert other.returncode != 0
    assert "quiet tests in files without" in other.stderr and "test_other.py" in other.stderr, other.stderr
