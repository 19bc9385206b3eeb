"""servelab.node.weights: the earlier lab's trained model, downloaded on the node and kept only when its git
blob id is the recorded one. Fast tests use file:// URLs (no socket); one integration test serves the file
over real HTTP on loopback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from servelab.core import paths
from servelab.node import weights


def _git_blob(path) -> str:
    return subprocess.run(["git", "hash-object", "--no-filters", str(path)], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.parametrize("content", [b"", b"x", b"blob\0\n" * 1000, bytes(range(256)) * 9000])  # last: > 1 chunk
def test_blob_id_is_gits(tmp_path, content):
    f = tmp_path / "f.bin"
    f.write_bytes(content)
    assert weights.blob_id(f) == _git_blob(f)


def test_the_recorded_source_is_pinned():
    """The ids read from the earlier lab's tree (git ls-tree -r 012a8b9); a commit, never a branch."""
    assert weights.RECORDED_BLOB == "b550214474f469ca65c2eb6c30f383ef4e7e8c7a"
    assert weights.URL == ("https://raw.githubusercontent.com/teaching-on-testbeds/serve-system-chi/"
                           "012a8b946b432f62e120d315ae974c54c303e9da/fastapi_pt/food11.pth")
    assert paths.TRAINED_WEIGHTS == paths.BUILD_DIR / "trained" / "food11.pth"  # build/: git-ignored, never packed


@pytest.fixture()
def standin(tmp_path):
    f = tmp_path / "served" / "food11.pth"
    f.parent.mkdir()
    f.write_bytes(b"stand-in for the earlier lab's food11.pth\n" * 500)
    return f


def test_accepted_when_the_id_matches_then_kept_without_a_download(tmp_path, standin):
    dest = tmp_path / "kit" / "build" / "trained" / "food11.pth"
    kept, line = weights.fetch(standin.as_uri(), _git_blob(standin), dest)
    assert kept and dest.read_bytes() == standin.read_bytes()
    assert line.startswith("trained weights: downloaded ") and "as recorded" in line and "\n" not in line
    assert [p.name for p in dest.parent.iterdir()] == ["food11.pth"], "no partial file is left"
    # run again, the source gone: the file already there is checked and kept
    kept, line = weights.fetch((tmp_path / "gone.pth").as_uri(), _git_blob(standin), dest)
    assert kept and "is already here" in line


def test_refused_when_the_id_differs(tmp_path, standin):
    dest = tmp_path / "trained" / "food11.pth"
    kept, line = weights.fetch(standin.as_uri(), "0" * 40, dest)
    assert not kept and not dest.exists() and list(dest.parent.iterdir()) == []
    assert line.startswith("trained weights refused: the download's git blob is ")
    assert line.endswith("the models build uses the demo weights")


def test_a_failed_download_falls_back_in_one_line(tmp_path):
    dest = tmp_path / "trained" / "food11.pth"
    kept, line = weights.fetch((tmp_path / "nowhere.pth").as_uri(), weights.RECORDED_BLOB, dest)
    assert not kept and not dest.exists()
    assert line.startswith("trained weights not downloaded (URLError") and "\n" not in line
    assert line.endswith("the models build uses the demo weights")


def test_a_file_too_large_or_changed_is_not_kept(tmp_path, standin):
    dest = tmp_path / "trained" / "food11.pth"
    kept, line = weights.fetch(standin.as_uri(), _git_blob(standin), dest, max_bytes=1000)
    assert not kept and "larger than" in line and not dest.exists()
    # a file already there that is not the recorded one is replaced by a checked download
    dest.write_bytes(b"edited")
    kept, line = weights.fetch(standin.as_uri(), _git_blob(standin), dest)
    assert kept and "downloaded" in line and dest.read_bytes() == standin.read_bytes()


def test_the_command_prints_one_line_and_exits_0(tmp_path, standin, capsys, monkeypatch):
    monkeypatch.setattr(paths, "TRAINED_WEIGHTS", tmp_path / "trained" / "food11.pth")
    assert weights.main(["fetch", "--url", standin.as_uri(), "--blob", "1" * 40]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("trained weights refused")


def test_the_node_python_runs_it_without_site_packages(tmp_path, standin):
    """As on the node: `python3 -S -m servelab.node.weights fetch` from the kit's folder."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["SERVELAB_ROOT"] = str(tmp_path / "kit")  # where build/trained/ goes: not this checkout
    out = subprocess.run([sys.executable, "-S", "-m", "servelab.node.weights", "fetch", "--url",
                          standin.as_uri(), "--blob", _git_blob(standin)], cwd=paths.REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("trained weights: downloaded build/trained/food11.pth")
    assert (tmp_path / "kit" / "build" / "trained" / "food11.pth").read_bytes() == standin.read_bytes()


@pytest.mark.integration   # a real HTTP server on loopback
def test_download_over_http(tmp_path, standin):
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(standin.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    dest = tmp_path / "trained" / "food11.pth"
    try:
        kept, line = weights.fetch(f"{base}/food11.pth", _git_blob(standin), dest)
        assert kept and dest.read_bytes() == standin.read_bytes(), line
        dest.unlink()
        kept, line = weights.fetch(f"{base}/missing.pth", _git_blob(standin), dest)
        assert not kept and "HTTPError" in line and not dest.exists()
    finally:
        server.shutdown()
        server.server_close()
